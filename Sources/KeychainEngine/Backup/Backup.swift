import KeychainCore
import KeychainBasics
import Glibc
import FoundationEssentials
import KeychainStore
import SecureMemory
import Synchronization

/// An item's dates as the store keeps them (milliseconds since the Unix epoch), for a restore.
struct ItemDates { var created: Int64; var modified: Int64 }

/// How costly the passphrase's Argon2id is (libsodium's levels); the file records the parameters.
public enum BackupCost: String, Sendable, Hashable, Codable, CaseIterable {
    /// 2 passes over 64 MiB.
    case interactive
    /// 3 passes over 256 MiB: the default.
    case moderate
    /// 4 passes over 1 GiB.
    case sensitive

    var limits: (ops: UInt64, mem: UInt64) {
        switch self {
        case .interactive: Sodium.argon2idInteractive
        case .moderate: Sodium.argon2idModerate
        case .sensitive: Sodium.argon2idSensitive
        }
    }

    public init(parsing text: String) throws(KeychainError) {
        guard let cost = BackupCost(rawValue: text) else {
            throw KeychainError.invalidArgument("Invalid backup cost '\(text)': expected interactive, moderate or sensitive")
        }
        self = cost
    }
}

/// One item named in a backup or restore report.
public struct BackupEntry: Sendable, Hashable, Codable {
    public var service: String
    public var key: String
}

/// An item a backup left out, or a restore did not write, and why.
public struct BackupSkip: Sendable, Hashable, Codable {
    public enum Reason: String, Sendable, Hashable, Codable {
        /// Its accessible level ends in ThisDeviceOnly: it never leaves this device (seed: Accessible).
        case thisDeviceOnly
        /// Behind a biometric access control: its protection belongs to this device's reader.
        case biometric
        /// Its wrapping key is on a PKCS#11 token (`keyStorage: 'strongbox'`), which does not let it out.
        case token
        /// Restore: the device already holds an item under this service and key; it was left as it is.
        case exists
        /// Restore: the item needs a device passcode and this device has none; stored with less, never.
        case passcodeNotSet
        /// Its service, key or label is out of `ItemNames`' bounds (stored before they were checked):
        /// a backup leaves it out, a restore writes the other items and names this one.
        case invalidName
    }
    public var service: String
    public var key: String
    public var reason: Reason
    /// For `invalidName`: which name and why, in the words of the write's `INVALID_ARGUMENT`.
    public var detail: String?

    public init(service: String, key: String, reason: Reason, detail: String? = nil) {
        (self.service, self.key, self.reason, self.detail) = (service, key, reason, detail)
    }
}

public struct BackupReport: Sendable, Hashable, Codable {
    public var backedUp: [BackupEntry]
    public var skipped: [BackupSkip]
}

public struct RestoreReport: Sendable, Hashable, Codable {
    public var restored: [BackupEntry]
    public var skipped: [BackupSkip]
}

extension KeychainAdministration {
    /// Writes an encrypted backup of every item of a migratable level (`whenUnlocked`,
    /// `afterFirstUnlock`, `always`) to `fd`, one item in memory at a time: never a `ThisDeviceOnly`
    /// item, never one behind a biometric access control, never a token's. Passcode items ask the
    /// configuration's authenticator once for the whole backup.
    /// - Throws: `INTERACTION_NOT_ALLOWED` before anything is written when a `whenUnlocked` item is
    ///   to be backed up and the device is locked; a read's error stops the backup (the partial
    ///   output has no end chunk, so no restore accepts it).
    public func backup(to fd: Int32, passphrase: SecureBytes, service: String? = nil,
                       cost: BackupCost = .moderate) async throws(KeychainError) -> BackupReport {
        guard passphrase.count > 0 else { throw KeychainError.invalidArgument("The backup passphrase is empty") }
        return try await backup(to: fd, service: service) { _ throws(KeychainError) in
            try BackupWriter(fd: fd, passphrase: passphrase, opsLimit: cost.limits.ops, memLimit: cost.limits.mem)
        }
    }

    /// A backup with no passphrase: its master key is sealed to the TPM of `identity`'s device by the
    /// machinery of `seal-for` (a provisioning bundle, `whenUnlocked`, in the file's header), so it
    /// restores on that device only. `parent`, `ekCA` and `unattestedSRK` as for `Provisioning.seal`. When it holds a
    /// passcode item the key is sealed under that device's passcode too: the file never opens with
    /// less than the restored item will.
    public func backup(to fd: Int32, sealedTo identity: DeviceIdentity, parent: Provisioning.Parent? = nil, ekCA: [UInt8]? = nil,
                       unattestedSRK: Bool = false, service: String? = nil) async throws(KeychainError) -> BackupReport {
        let master = SecureBytes(random: 32)
        return try await backup(to: fd, service: service) { plan throws(KeychainError) in
            let bundle = try Provisioning.seal(master, service: "keychain-backup", key: "master", accessible: .whenUnlocked,
                                               accessControl: plan.needsPasscode ? .passcode : .none,
                                               for: identity, parent: parent, ekCA: ekCA, unattestedSRK: unattestedSRK)
            return try BackupWriter(fd: fd, master: master, header: BackupFile.Header(sealedKey: [UInt8](bundle.json()), check: [], streamHeader: []))
        }
    }

    private func backup(to fd: Int32, service: String?, writer makeWriter: (Engine.BackupPlan) throws(KeychainError) -> BackupWriter)
        async throws(KeychainError) -> BackupReport {
        let plan = try await engine.backupPlan(service: service)
        if plan.needsUnlocked, try await engine.status().lockState != .unlocked {
            throw KeychainError(.interactionNotAllowed, "Some items to back up are 'whenUnlocked' and the device is locked: "
                                + "unlock it first (keychainctl unlock); nothing was written")
        }
        let writer = try makeWriter(plan)
        let authenticator = configuration.authenticator.map { OnceAuthenticator($0) }
        var backedUp: [BackupEntry] = []
        for entry in plan.take {
            let item = try await engine.backupItem(service: entry.service, key: entry.key,
                                                   context: .init(prompt: .init(title: "Enter the device passcode to back up the keychain"),
                                                                  authValidity: 0, authenticator: authenticator,
                                                                  readerDirectory: configuration.readerDirectory, pkcs11URI: nil))
            guard let item else { continue }  // removed since the plan was made
            try writer.append(item)
            backedUp.append(entry)
        }
        try writer.finish()
        return BackupReport(backedUp: backedUp, skipped: plan.skipped)
    }

    /// Writes the backup to a new file at `path` (0600, made beside it and renamed into place when
    /// complete: a failed backup leaves no file).
    public func backup(toFile path: String, passphrase: SecureBytes, service: String? = nil,
                       cost: BackupCost = .moderate) async throws(KeychainError) -> BackupReport {
        try await backup(toFile: path) { fd throws(KeychainError) in
            try await backup(to: fd, passphrase: passphrase, service: service, cost: cost)
        }
    }

    public func backup(toFile path: String, sealedTo identity: DeviceIdentity, parent: Provisioning.Parent? = nil,
                       ekCA: [UInt8]? = nil, unattestedSRK: Bool = false, service: String? = nil) async throws(KeychainError) -> BackupReport {
        try await backup(toFile: path) { fd throws(KeychainError) in
            try await backup(to: fd, sealedTo: identity, parent: parent, ekCA: ekCA, unattestedSRK: unattestedSRK, service: service)
        }
    }

    private func backup(toFile path: String, _ body: (Int32) async throws(KeychainError) -> BackupReport)
        async throws(KeychainError) -> BackupReport {
        let temporary = path + ".partial-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw KeychainError(.storageError, "Cannot create \(temporary)", underlying: .errno(errno)) }
        do throws(KeychainError) {
            let report = try await body(fd)
            guard fsync(fd) == 0, close(fd) == 0 else { throw KeychainError(.storageError, "Cannot write \(temporary)", underlying: .errno(errno)) }
            // Never over an existing file: link fails when `path` exists.
            guard link(temporary, path) == 0 else {
                throw KeychainError(.storageError, "Cannot create \(path) (it may exist already)", underlying: .errno(errno))
            }
            unlink(temporary)
            return report
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
    }

    /// Restores a backup file: each item comes back with its protection, label and dates. The whole
    /// file is authenticated before the first item is written; an item the device cannot protect
    /// as it was (a passcode item without a passcode) or that exists already is skipped and reported.
    /// - Throws: `AUTHENTICATION_FAILED` for a wrong passphrase; `DATA_CORRUPTED` for a changed,
    ///   reordered or truncated file (nothing is restored).
    /// A backup sealed to this device (`backup --to`) needs no passphrase: the TPM unseals its key
    /// (the device unlocked); on another device it is `INVALID_ARGUMENT`.
    /// A sealed backup holding passcode items needs this device's `passcode` as well.
    public func restore(fromFile path: String, passphrase: SecureBytes?, passcode: SecureBytes? = nil) async throws(KeychainError) -> RestoreReport {
        // Without blocking, and a regular file only: a planted FIFO hung the open (and its reads) forever.
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw KeychainError(.invalidArgument, "Cannot read \(path)", underlying: .errno(errno)) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw KeychainError.invalidArgument("\(path) is not a regular file: give the backup as a file; nothing was restored")
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        let (header, headerBytes) = try BackupReader.header(fd)
        let master: SecureBytes
        if let sealed = header.sealedKey {
            do throws(KeychainError) {
                let bundle = try ProvisioningBundle(json: Data(sealed))
                if bundle.accessControl == .passcode, passcode == nil {
                    throw KeychainError(.interactionNotAllowed, "This backup holds passcode items: its key opens with this device's "
                                        + "passcode (--passcode-stdin); nothing was restored")
                }
                master = try await engine.openBundle(bundle, passcode: passcode)
            } catch where error.code == .invalidArgument {
                throw KeychainError(.invalidArgument, "This backup is sealed to another device's TPM: restore it there (\(error.message))")
            }
        } else {
            guard let passphrase else {
                throw KeychainError.invalidArgument("This backup is encrypted under a passphrase: give it (--passphrase-stdin)")
            }
            master = try BackupFile.master(passphrase: passphrase, salt: header.salt, opsLimit: header.opsLimit, memLimit: header.memLimit)
        }
        let reader = try BackupReader(fd: fd, header: header, headerBytes: headerBytes, master: master)
        // Pass 1: authenticate every chunk and check every item; nothing is written.
        while let item = try reader.next() { try Self.check(item) }
        try reader.rewind()
        let passcodeAvailable = try await engine.canUse(.passcode, readerDirectory: configuration.readerDirectory).available
        var report = RestoreReport(restored: [], skipped: [])
        do throws(KeychainError) {
            while let item = try reader.next() {
                try Self.check(item)  // again: the file is read twice, and the second read is what is written
                let entry = BackupEntry(service: item.service, key: item.key)
                if let problem = ItemNames.problem(service: item.service, key: item.key, label: item.label) {
                    // The store's own rule: this item cannot be written, the others can.
                    report.skipped.append(.init(service: item.service, key: item.key, reason: .invalidName, detail: problem))
                } else if try await engine.has(service: item.service, key: item.key) {
                    report.skipped.append(.init(service: item.service, key: item.key, reason: .exists))
                } else if item.accessControl.allowsPasscode && !passcodeAvailable {
                    report.skipped.append(.init(service: item.service, key: item.key, reason: .passcodeNotSet))
                } else {
                    let protection = try ItemProtection(accessible: item.accessible, accessControl: item.accessControl,
                                                        authValidity: item.authValidity)
                    try await engine.set(item.value, service: item.service, key: item.key, protection: protection,
                                         label: item.label, backend: TPMBackend(readerDirectory: configuration.readerDirectory),
                                         tag: protection.storageTag, dates: ItemDates(created: item.created, modified: item.modified))
                    report.restored.append(entry)
                }
            }
        } catch {
            // The file changed between the passes, or a write failed: take back what this restore wrote.
            for entry in report.restored { _ = try? await engine.remove(service: entry.service, key: entry.key) }
            throw error
        }
        return report
    }

    /// What a restore refuses before writing anything: an item no backup of ours holds. Names out
    /// of bounds are not such a sign (backups made before names were checked hold them): the
    /// restore skips that item alone.
    private static func check(_ item: BackupItem) throws(KeychainError) {
        guard !item.accessible.isThisDeviceOnly, !item.accessControl.usesBiometry else {
            throw KeychainError(.dataCorrupted, "This backup holds item '\(item.key)' of service '\(item.service)' with protection "
                                + "\(item.accessible.rawValue)/\(item.accessControl.rawValue), which no backup carries; nothing was restored")
        }
        do {
            _ = try ItemProtection(accessible: item.accessible, accessControl: item.accessControl, authValidity: item.authValidity)
        } catch {
            throw KeychainError(.dataCorrupted, "This backup holds an item this keychain cannot write (\(error.message)); nothing was restored")
        }
    }
}

/// Asks the user once for a whole backup: the passcode that opened the first passcode item answers
/// the next ones; a failure asks the user again.
final class OnceAuthenticator: Authenticator, @unchecked Sendable {
    private let inner: any Authenticator
    private let remembered = Mutex<SecureBytes?>(nil)
    var attemptsPerRead: Int { inner.attemptsPerRead }

    init(_ inner: any Authenticator) { self.inner = inner }

    func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        if request.attempt == 1, request.methods.contains(.passcode), let pin = remembered.withLock({ $0 }) {
            return .passcode(pin)
        }
        remembered.withLock { $0 = nil }
        let answer = await inner.authenticate(request)
        if case .passcode(let pin) = answer { remembered.withLock { $0 = pin } }
        return answer
    }
}

extension Engine {
    struct BackupPlan {
        var take: [BackupEntry] = []
        var skipped: [BackupSkip] = []
        var needsUnlocked = false
        var needsPasscode = false
    }

    /// Which items a backup takes, from the store alone (no TPM): the migratable levels, without
    /// biometric access controls or token keys.
    func backupPlan(service: String?) throws(KeychainError) -> BackupPlan {
        let store = try store()
        var plan = BackupPlan()
        try read {
            for svc in try service.map({ [$0] }) ?? store.services() {
                for key in try store.keys(service: svc) {
                    guard let record = try store.item(service: svc, key: key) else { continue }
                    // What its restore would refuse: the store's own rule (written before it was checked).
                    if let problem = ItemNames.problem(service: svc, key: key, label: record.label) {
                        plan.skipped.append(.init(service: svc, key: key, reason: .invalidName, detail: problem))
                        continue
                    }
                    // A token item (one namespace with the TPM items): its tag ends in "@strongbox".
                    if record.protection.hasSuffix(TokenSession.tagSuffix) {
                        plan.skipped.append(.init(service: svc, key: key, reason: .token))
                        continue
                    }
                    guard let protection = ItemProtection(storageTag: record.protection) else {
                        throw KeychainError(.dataCorrupted, "Item '\(key)' of service '\(svc)' has a protection '\(record.protection)' this library does not write")
                    }
                    if protection.accessible.isThisDeviceOnly {
                        plan.skipped.append(.init(service: svc, key: key, reason: .thisDeviceOnly))
                    } else if protection.accessControl.usesBiometry {
                        plan.skipped.append(.init(service: svc, key: key, reason: .biometric))
                    } else {
                        plan.take.append(.init(service: svc, key: key))
                        if protection.accessible == .whenUnlocked { plan.needsUnlocked = true }
                        if protection.accessControl.allowsPasscode { plan.needsPasscode = true }
                    }
                }
            }
        }
        return plan
    }

    /// One item with its value, read as `getItem` reads it (the TPM decides), or nil when it is gone.
    func backupItem(service: String, key: String, context: ReadContext) async throws(KeychainError) -> BackupItem? {
        let store = try store()
        let record: ItemRecord?
        do { record = try store.item(service: service, key: key) } catch { throw KeychainError(store: error) }
        guard let record, let protection = ItemProtection(storageTag: record.protection),
              let value = try await get(service: service, key: key, context: context) else { return nil }
        return BackupItem(service: service, key: key, accessible: protection.accessible, accessControl: protection.accessControl,
                          authValidity: protection.authValidity, label: record.label, created: record.created,
                          modified: record.modified, value: value)
    }
}
