import Foundation
import KeychainStore
import PKCS11
import SecureMemory
import Synchronization
import TPM2

/// The one owner of a store and its TPM connection in this process; every `Keychain` value on the
/// same store directory shares it. It runs on its own serial queue, so the blocking SQLite and TPM
/// calls never block Swift's shared pool, and TPM commands are serialised.
actor Engine {
    private let executor: SerialThreadExecutor
    nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    let configuration: KeychainConfiguration
    private var openedStore: Store?
    /// Whether this engine's first TPM operation looked for an interrupted passcode change.
    private var checkedPasscodeChange = false
    /// TPM commands sent by this engine (all connections), for the benchmark.
    private(set) var tpmCommands = 0

    /// Unsealed wrapping keys, in locked memory (`sodium_malloc`). `always*`/`afterFirstUnlock*`
    /// keys stay until the process ends; `whenUnlocked*` keys only while the lock generation
    /// recorded at unseal time is current (a `lock` in any process on this store bumps it). Keys
    /// behind an access control record when the user opened them: each read checks its own window.
    private var unsealed: [WrappingKeyID: (secret: SecureBytes, generation: UInt64?, opened: ContinuousClock.Instant?)] = [:]
    /// Agreed secrets per (wrapping key, item writer), so a warm read does no X25519.
    private var agreed: [AgreedID: SecureBytes] = [:]
    /// The store's lock generation when this process last saw the TPM's state index say "unlocked"
    /// (a read's pre-prompt check, or an unlock): while it is current the check needs no TPM.
    private var seenUnlocked: UInt64?
    /// This process's ephemeral writer pair per wrapping public key, and its agreed secret.
    private var writers: [[UInt8]: (publicKey: [UInt8], shared: SecureBytes)] = [:]
    /// The PKCS#11 token session, for `keyStorage: 'strongbox'` items.
    var token: TokenBackend?

    struct WrappingKeyID: Hashable { var service: String; var protection: String; var publicKey: [UInt8] }
    struct AgreedID: Hashable { var wrappingPublic: [UInt8]; var writerPublic: [UInt8] }

    private init(configuration: KeychainConfiguration) {
        self.configuration = configuration
        self.executor = SerialThreadExecutor(name: "keychain.engine")
    }

    private static let engines = Mutex<[String: Engine]>([:])

    /// The engine of a store directory in this process (made on first use; touches nothing yet), and
    /// the refusal of a configuration whose engine-wide settings differ from the engine's: one store
    /// has one TPM, owner authorization, PCR selection, passcode limit and timeout in a process.
    static func shared(for configuration: KeychainConfiguration) -> (engine: Engine, refusal: KeychainError?) {
        let key = URL(fileURLWithPath: configuration.storeDirectory).standardizedFileURL.path
        return engines.withLock { engines in
            if let engine = engines[key] { return (engine, engine.configuration.refusal(sharing: configuration)) }
            let engine = Engine(configuration: configuration)
            engines[key] = engine
            return (engine, nil)
        }
    }

    // MARK: Resources

    func store() throws(KeychainError) -> Store {
        if let openedStore { return openedStore }
        let pinPath = EmbeddedTPM.storePin(configuration.storeDirectory)
        let pinned: [UInt8]?
        let store: Store
        do {
            // The embedded TPM beside a fresh database was provisioned for it: the database was lost.
            pinned = try FileSystem.readPrivateFile(pinPath, what: "the store identity its embedded TPM was provisioned for")
            store = try Store(directory: configuration.storeDirectory,
                              initializedBecause: pinned.map { _ in "its embedded TPM was provisioned for it: \(pinPath)" })
        } catch {
            throw KeychainError(store: error)
        }
        if let pinned, pinned != store.identity {
            throw KeychainError(.dataCorrupted, "The store in \(configuration.storeDirectory) is not the one its embedded TPM was "
                                + "provisioned for (\(pinPath)): keychain.db and keychain.id were replaced, and this TPM's items are "
                                + "not in them. Put the store's own files back from a backup; or, to start over with no items, "
                                + "remove \(configuration.storeDirectory)")
        }
        openedStore = store
        return store
    }

    /// Pins the store's identity beside the embedded TPM's state, so that a store emptied or replaced
    /// later is seen as such; an embedded TPM serves one store only.
    private func pinStoreInEmbeddedTPM(_ store: Store) throws(KeychainError) {
        let path = EmbeddedTPM.storePin(configuration.storeDirectory)
        guard access(path, F_OK) != 0 else { return }
        do { _ = try FileSystem.createPrivateFile(path, store.identity, what: "the embedded TPM's store identity") } catch {
            throw KeychainError(store: error)
        }
    }

    /// Closes the store: SQLite copies the write-ahead log into `keychain.db` when the last connection
    /// closes, so committed data does not depend on the `-wal` file. The next call opens it again.
    func close() { openedStore = nil }

    /// Closes the store of every engine of this process.
    static func closeAll() async {
        for engine in engines.withLock({ Array($0.values) }) { await engine.close() }
    }

    /// Connects to the TPM for one operation; the connection closes when `body` returns, so a software
    /// TPM (one client at a time) is free for other processes between operations.
    ///
    /// Without a resource manager (swtpm, `/dev/tpm0`) the operation is this process's turn at the
    /// TPM (`TPMTurn`): no other process's commands interleave, and it starts by flushing what killed
    /// processes left (each kill mid-operation leaks a session; three make every read fail).
    func withKeyring<T>(_ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        let store = try store()
        let device: TPMDevice
        var started = false
        switch configuration.tpm {
        case .tcti(let conf):
            do { device = try TPMDevice(parsing: conf) } catch { throw .invalidArgument(error.description) }
        case .embedded:
            (device, started) = try EmbeddedTPM.ensureRunning(storeDirectory: configuration.storeDirectory)
            try pinStoreInEmbeddedTPM(store)
        }
        let turn = try TPMTurn.take(device, configuration: configuration)
        defer { withExtendedLifetime(turn) {} }
        if case .embedded = configuration.tpm, started || !embeddedTPMChecked {
            embeddedOwnerAuthorization = try prepareEmbeddedTPM(device, started: started)
            embeddedTPMChecked = true
        }
        return try withConnection(device, store: store, flushLeftovers: turn != nil, body)
    }

    /// The connection closes when this returns, before the turn ends.
    private func withConnection<T>(_ device: TPMDevice, store: Store, flushLeftovers: Bool,
                                   _ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        var configuration = configuration
        if case .embedded = configuration.tpm, configuration.ownerAuthorization == nil {
            configuration.ownerAuthorization = embeddedOwnerAuthorization
        }
        let keyring = try TPMKeyring(device: device, store: store, configuration: configuration, flushLeftovers: flushLeftovers)
        defer {
            tpmCommands += keyring.context.commandCount
            if keyring.finishedRemoval {
                unsealed = unsealed.filter { !$0.key.protection.hasPrefix(Accessible.whenPasscodeSetThisDeviceOnly.rawValue + "/") }
                forgetSecrets(keepingLongLived: true)
            }
        }
        do {
            // A passcode change that a killed process left half-done is finished before anything else.
            if !checkedPasscodeChange {
                do {
                    _ = try keyring.passcodeIsSet()
                    checkedPasscodeChange = true
                } catch where error.code == .lockout {
                    // The PIN is at its limit, so the question has no answer yet; resetting the
                    // count must stay possible. Operations that need the answer get LOCKOUT.
                }
            }
            return try body(keyring)
        } catch {
            // Whatever the step made of it: a TPM that stopped answering is the cause.
            if let unanswered = keyring.context.unanswered {
                throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout, unanswered)
            }
            throw error
        }
    }

    /// The embedded software TPM's owner authorization, from its file, once this process checked that
    /// the TPM holds it (on start, and on first use: a crash may have left the file without the change).
    private var embeddedOwnerAuthorization: SecureBytes?
    private var embeddedTPMChecked = false

    /// The embedded software TPM is taken on first use: random owner and lockout authorizations, kept
    /// in its own 0700 directory (see `EmbeddedTPM.takeOwnership`). A just-started one also gets small
    /// dictionary-attack settings: nothing here is subject to DA (our objects are noDA), but other
    /// tools on it should not lock it out for 1000 s.
    private func prepareEmbeddedTPM(_ device: TPMDevice, started: Bool) throws(KeychainError) -> SecureBytes? {
        let context: TPMContext
        do { context = try TPMContext(device: device, timeout: configuration.tpmTimeout) } catch {
            throw KeychainError(.hardwareUnavailable, "The embedded software TPM does not answer", underlying: .tpm(error))
        }
        defer { tpmCommands += context.commandCount }
        let owner = try EmbeddedTPM.takeOwnership(context, storeDirectory: configuration.storeDirectory)
        // Best effort: after a wrong lockout authorization (anyone may try one) the TPM refuses it for
        // lockoutRecovery, and that must not stop the keychain from starting.
        if started { try? context.setDictionaryAttackParameters(maxTries: 32, recoveryTime: 10, lockoutRecovery: 10) }
        return owner
    }

    private func lockGeneration(_ store: Store) throws(KeychainError) -> UInt64 {
        do { return try store.meta(StoreMeta.lockGeneration).flatMap(UInt64.init(bigEndianBytes:)) ?? 0 }
        catch { throw KeychainError(store: error) }
    }

    // MARK: Items

    /// What a write needs (seed: AccessControl, "What a write needs"), checked before anything is
    /// stored: a write never stores an item with less protection than asked.
    func writeRequirements(_ protection: ItemProtection, reader: FingerprintReader?)
        throws(KeychainError) -> (biometry: SealPolicy.BiometryBinding?, passcode: Bool) {
        let control = protection.accessControl
        guard control != .none else { return (nil, false) }
        if control.needsBiometry && reader == nil {
            throw KeychainError(.biometryNotAvailable,
                                "accessControl '\(control.rawValue)' needs a fingerprint reader, and this device has none")
        }
        let passcodeSet = try withKeyring { keyring throws(KeychainError) in
            try keyring.passcodeIsSet()
        }
        guard passcodeSet else {
            throw KeychainError(.passcodeNotSet,
                                "accessControl '\(control.rawValue)' needs a device passcode: set one first (keychainctl passcode set)")
        }
        let enrolled = !(reader?.enrolled.isEmpty ?? true)
        if control.needsBiometry && !enrolled {
            throw KeychainError(.biometryNotEnrolled,
                                "accessControl '\(control.rawValue)' needs an enrolled finger (keychainctl reader enroll NAME)"
                                + (control.allowsPasscode ? "; the passcode does not make up for it" : ""))
        }
        var biometry: SealPolicy.BiometryBinding?
        if control.usesBiometry, enrolled, let reader, let state = reader.state {
            biometry = .init(keyName: state.keyName, tpmHandle: state.tpmHandle,
                             enrollmentSet: control.isCurrentSet ? reader.enrollmentSet : [], currentSet: control.isCurrentSet)
        }
        return (biometry, control.allowsPasscode)
    }

    func set(_ value: SecureBytes, service: String, key: String, protection: ItemProtection, label: String?,
             readerDirectory: String?) throws(KeychainError) {
        try checkKey(key)
        guard value.count <= Self.maxValueLength else {
            throw KeychainError.invalidArgument("Invalid value: at most \(Self.maxValueLength) bytes, got \(value.count)")
        }
        if protection.accessible.isThisDeviceOnly { try configuration.checkPCRSelection() }
        // The reader's state is read only for writes that need it.
        let reader = protection.accessControl == .none ? nil
            : try readerDirectory.map { (dir: String) throws(KeychainError) in try FingerprintReader(directory: dir) }
        let requirements = try writeRequirements(protection, reader: reader)
        let store = try store()
        let tag = protection.storageTag
        var wrapping = try read { try store.wrappingKey(service: service, protection: tag) }
        var staleKey: [UInt8]?
        if let existing = wrapping, let binding = SealPolicy.decode(existing.policy)?.biometry {
            switch try readerVerdict(for: binding, directory: readerDirectory) {
            case .usable: break  // an Any key survives enrollment changes (even all fingers removed), as the seed says
            case .enrollmentChanged:
                // A CurrentSet key of an older enrollment set of this very reader is dead: it and its items go.
                staleKey = existing.publicKey
                wrapping = nil
            case .unavailable(let why):
                // A missing or other reader never drops items. The existing key's passcode branch serves an
                // …OrPasscode write; another write would go under a key that no reader present opens.
                guard protection.accessControl.allowsPasscode && !protection.accessControl.needsBiometry else {
                    throw why.code != .biometryNotAvailable ? why : KeychainError(.biometryNotAvailable,
                        "The items of service '\(service)' with this protection were written with another fingerprint reader, "
                        + "and \(why.message): nothing was written. Use that reader (--reader, KEYCHAIN_READER), or remove "
                        + "those items first (keychainctl clear)")
                }
            }
        }
        if let existing = wrapping, protection.accessible.requiresPasscode {
            // The passcode may have been removed (by any process) since: that key is dead in the TPM.
            // One command: removing the passcode always bumps the epoch, so an unchanged epoch means
            // the passcode the key was made with is still set; a new key checks the passcode itself.
            let epoch = SealPolicy.decode(existing.policy)?.passcodeEpoch
            let current: UInt64 = try withKeyring { keyring throws(KeychainError) in
                do throws(TPMError) { return try keyring.currentPasscodeEpoch() }
                catch { throw keyring.diagnose(error, doing: "read the passcode epoch") }
            }
            if epoch != current { staleKey = existing.publicKey; wrapping = nil }
        }
        if wrapping == nil {
            let pair = Sodium.generateX25519()
            let (blob, policy) = try withKeyring { keyring throws(KeychainError) in
                try keyring.seal(pair.secretKey, accessible: protection.accessible, pcrs: configuration.pcrSelection,
                                 biometry: requirements.biometry, passcode: requirements.passcode,
                                 keyRef: SealPolicy.keyRef(service: service, protection: tag, publicKey: pair.publicKey),
                                 authValidity: protection.accessControl.takesWindow ? protection.authValidity : nil)
            }
            wrapping = WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey,
                                         sealedPublic: blob.publicArea, sealedPrivate: blob.privateArea,
                                         policy: policy.encoded(), created: Self.now())
        }
        try storeEnvelope(value, service: service, key: key, tag: tag, candidate: wrapping!, staleKey: staleKey,
                          label: label, store: store)
    }

    /// Writes one item under a wrapping public key, in one transaction: no TPM or token needed.
    /// Another process may have made the same wrapping key meanwhile: theirs wins, ours is dropped.
    func storeEnvelope(_ value: SecureBytes, service: String, key: String, tag: String, candidate: WrappingKeyRecord,
                       staleKey: [UInt8]?, label: String?, store: Store) throws(KeychainError) {
        do {
            try store.write { tx in
                // Another process may have made this service's key meanwhile: theirs wins, ours is dropped.
                var current = try tx.wrappingKey(service: service, protection: tag)
                if current == nil || current?.publicKey == staleKey {
                    // The items of the dead key stay with it, each to report KEY_INVALIDATED on its next read.
                    if let stale = current, staleKey != nil { try Self.retire(stale, tx) }
                    try tx.putWrappingKey(candidate)
                    current = candidate
                }
                let writer = try self.writer(for: current!.publicKey)
                let existing = try tx.item(service: service, key: key)
                let now = Self.now()
                var record = ItemRecord(service: service, key: key, protection: tag, label: label ?? existing?.label,
                                        created: existing?.created ?? now, modified: now,
                                        writerPublic: writer.publicKey, salt: Sodium.randomBytes(ItemEnvelope.saltLength),
                                        nonce: Sodium.randomBytes(Sodium.xchachaNonceLength), ciphertext: [])
                let dataKey = ItemEnvelope.dataKey(shared: writer.shared, writerPublic: writer.publicKey,
                                                   wrappingPublic: current!.publicKey, salt: record.salt)
                record.ciphertext = value.withUnsafeBytes {
                    Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(record))
                }
                try tx.putItem(record)
                try Self.releaseRetired(service: service, key: key, tx)
            }
        } catch let error as KeychainError {
            throw error
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    static let maxValueLength = 16 << 20

    // MARK: Retired wrapping keys (a write replaced a dead key while items still use it)

    /// A write after an enrollment change (CurrentSet) or a passcode removal replaces the service's
    /// dead key. Its items stay, with it: the key moves to a retired tag ("<tag>~<public key>"), and
    /// each of its items gets a marker naming that key and the item's nonce (its version), so its next
    /// read goes to the old key, which the reader check or the TPM finds dead: KEY_INVALIDATED, once.
    static func retiredTag(_ tag: String, publicKey: [UInt8]) -> String {
        tag + "~" + publicKey.map { String(format: "%02x", $0) }.joined()
    }

    /// The tag a key was sealed with (its keyRef names it), for a live or a retired key.
    static func liveTag(_ protection: String) -> String {
        protection.firstIndex(of: "~").map { String(protection[..<$0]) } ?? protection
    }

    static func retire(_ dead: WrappingKeyRecord, _ tx: Transaction) throws {
        var retired = dead
        retired.protection = retiredTag(dead.protection, publicKey: dead.publicKey)
        try tx.putWrappingKey(retired)
        for key in try tx.keys(service: dead.service) {
            // An item already marked belongs to an older retired key.
            guard let item = try tx.item(service: dead.service, key: key), item.protection == dead.protection,
                  try retiredKey(of: item, marker: tx.meta(StoreMeta.retired(service: dead.service, key: key))) == nil else { continue }
            try tx.setMeta(StoreMeta.retired(service: dead.service, key: key), dead.publicKey + item.nonce)
        }
    }

    /// The retired key's public half an item still uses, from its marker; nil for one of the live key.
    static func retiredKey(of item: ItemRecord, marker: [UInt8]?) -> [UInt8]? {
        guard let marker, marker.count == Sodium.x25519KeyLength + item.nonce.count,
              marker.suffix(item.nonce.count).elementsEqual(item.nonce) else { return nil }
        return Array(marker.prefix(Sodium.x25519KeyLength))
    }

    /// The item at (service, key) was replaced or removed: drop its marker, and its retired key
    /// when no other item uses it.
    static func releaseRetired(service: String, key: String, _ tx: Transaction) throws {
        let name = StoreMeta.retired(service: service, key: key)
        guard let marker = try tx.meta(name) else { return }
        _ = try tx.deleteMeta(name)
        guard marker.count > Sodium.x25519KeyLength else { return }
        let publicKey = Array(marker.prefix(Sodium.x25519KeyLength))
        for other in try tx.keys(service: service) where other != key {
            if let item = try tx.item(service: service, key: other),
               try retiredKey(of: item, marker: tx.meta(StoreMeta.retired(service: service, key: other))) == publicKey { return }
        }
        for wrapping in try tx.wrappingKeys(service: service) where wrapping.publicKey == publicKey && wrapping.protection.contains("~") {
            _ = try tx.deleteWrappingKey(service: service, protection: wrapping.protection)
        }
    }

    private func writer(for wrappingPublic: [UInt8]) throws(KeychainError) -> (publicKey: [UInt8], shared: SecureBytes) {
        if let writer = writers[wrappingPublic] { return writer }
        let ephemeral = Sodium.generateX25519()
        do {
            let shared = try Sodium.x25519(ephemeral.secretKey, wrappingPublic)
            writers[wrappingPublic] = (ephemeral.publicKey, shared)
            return (ephemeral.publicKey, shared)
        } catch {
            throw KeychainError(.dataCorrupted, "A wrapping key's stored public key is not a valid X25519 key")
        }
    }

    /// What a read needs from the user, from the storage that asks.
    struct ReadContext {
        var prompt: Prompt
        var authValidity: Int
        var authenticator: (any Authenticator)?
        var readerDirectory: String?
        var pkcs11URI: String?
    }

    func get(service: String, key: String, context: ReadContext) async throws(KeychainError) -> SecureBytes? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        if record.protection.hasSuffix(TokenBackend.tagSuffix) && !TokenBackend.usesPasscode(record.protection) {
            return try getFromToken(record, uri: context.pkcs11URI)
        }
        // Only these tags ever have a dead key replaced (Engine.set's staleKey): others skip the lookup.
        let retirable = record.protection.contains("CurrentSet") || record.protection.hasPrefix(Accessible.whenPasscodeSetThisDeviceOnly.rawValue)
        let retired = !retirable ? nil
            : try read { try Self.retiredKey(of: record, marker: store.meta(StoreMeta.retired(service: service, key: key))) }
        let keyTag = retired.map { Self.retiredTag(record.protection, publicKey: $0) } ?? record.protection
        guard let wrapping = try read({ try store.wrappingKey(service: service, protection: keyTag) }) else {
            throw corrupted(record, "its wrapping key is missing from the store")
        }
        let secret: SecureBytes
        do throws(KeychainError) {
            secret = record.protection.hasSuffix(TokenBackend.tagSuffix)
                ? try await tokenPasscodeSecret(for: wrapping, record: record, store: store, context: context)
                : try await unsealedSecret(for: wrapping, record: record, store: store, context: context)
        } catch where error.code == .keyInvalidated {
            try? removeInvalidated(record)
            throw error
        }
        let agreedID = AgreedID(wrappingPublic: wrapping.publicKey, writerPublic: record.writerPublic)
        let shared: SecureBytes
        if let cached = agreed[agreedID] {
            shared = cached
        } else {
            do { shared = try Sodium.x25519(secret, record.writerPublic) } catch {
                throw corrupted(record, "its writer key is not a valid X25519 key")
            }
            if agreed.count > 4096 { agreed.removeAll() }
            agreed[agreedID] = shared
        }
        let dataKey = ItemEnvelope.dataKey(shared: shared, writerPublic: record.writerPublic,
                                           wrappingPublic: wrapping.publicKey, salt: record.salt)
        do {
            return try Sodium.open(record.ciphertext, key: dataKey, nonce: record.nonce,
                                   associatedData: ItemEnvelope.associatedData(record))
        } catch {
            throw corrupted(record, "it failed authentication: a stored field was changed or swapped")
        }
    }

    private func unsealedSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                                context: ReadContext) async throws(KeychainError) -> SecureBytes {
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = Self.window(tag: record.protection, asked: context.authValidity)
        // The warm path: no policy decoding, one meta read for whenUnlocked keys only.
        if let cached = unsealed[id], cached.opened.map({ $0 + .seconds(window) > ContinuousClock.now }) ?? true {
            var current = true
            if let generation = cached.generation { current = try generation == lockGeneration(store) }
            if current { return cached.secret }
        }
        let tag = Self.liveTag(wrapping.protection)
        guard let policy = SealPolicy.decode(wrapping.policy),
              policy.keyRef.map({ $0 == SealPolicy.keyRef(service: wrapping.service, protection: tag,
                                                          publicKey: wrapping.publicKey) }) ?? true,
              policy.authValidity == nil || policy.authValidity == ItemProtection.storedWindow(ofTag: tag) else {
            throw KeychainError(.dataCorrupted, "The wrapping key of service '\(wrapping.service)' has an unreadable policy, "
                                + "or one made for another key")
        }
        let generation: UInt64? = policy.availability == .whenUnlocked ? try lockGeneration(store) : nil
        let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
        let secret: SecureBytes
        var opened: ContinuousClock.Instant?
        if policy.branches.isEmpty {
            secret = try unsealWithoutUser(blob, policy: policy)
        } else {
            secret = try await unsealWithUser(blob, policy: policy, record: record, window: window, context: context)
            if policy.keyRef == nil, (try? checked(secret, wrapping)) != nil { rebind(secret, wrapping, policy, store: store) }
            else if let upgraded = withReaderBranch(policy, wrapping, readerDirectory: context.readerDirectory) {
                reseal(secret, wrapping, upgraded, store: store)  // an enrollment that ended before its re-seal
            }
            // authValidity: the window in which reads of this key skip the prompt (this process);
            // never for the CurrentSet values, whatever storage reads them (seed: AccessControl).
            guard window > 0, policy.biometry?.currentSet != true else { return try checked(secret, wrapping) }
            opened = .now
        }
        let checkedSecret = try checked(secret, wrapping)
        unsealed[id] = (checkedSecret, generation, opened)
        return checkedSecret
    }

    /// The window of one read: the item's own (stored in its tag, bound in its key's policy), shortened
    /// when the reading storage asks for less (a storage's 0, the default, asks for nothing). Items
    /// written before windows were stored take the reading storage's window, as they always did.
    static func window(tag: String, asked: Int) -> Int {
        guard let stored = ItemProtection.storedWindow(ofTag: tag) else { return max(0, asked) }
        return asked > 0 ? min(stored, asked) : stored
    }

    private func checked(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord) throws(KeychainError) -> SecureBytes {
        guard secret.count == Sodium.x25519KeyLength, Sodium.x25519Public(of: secret) == wrapping.publicKey else {
            throw KeychainError(.dataCorrupted, "The stored public key of service '\(wrapping.service)' does not match its sealed key")
        }
        return secret
    }

    private func unsealWithoutUser(_ blob: TPMContext.SealedBlob, policy: SealPolicy) throws(KeychainError) -> SecureBytes {
        try withKeyring { keyring throws(KeychainError) -> SecureBytes in
            do throws(KeychainError) {
                return try keyring.unseal(blob, policy: policy)
            } catch where error.code == .interactionNotAllowed {
                // Without a passcode the device counts as unlocked (as on iOS): unlock with the empty one.
                let passcodeSet = try keyring.passcodeIsSet()
                guard !passcodeSet else { throw error }
                try keyring.unlock(passcode: nil)
                return try keyring.unseal(blob, policy: policy)
            }
        }
    }

    /// Asks the user (the authenticator) and proves the answer to the TPM: the reader signs the
    /// session nonce after a match, or the TPM checks the passcode. At most three tries per read.
    private func unsealWithUser(_ blob: TPMContext.SealedBlob, policy: SealPolicy, record: ItemRecord, window: Int,
                                context: ReadContext) async throws(KeychainError) -> SecureBytes {
        // iOS never asks for an item the lock state cannot open: fail before any prompt or ticket.
        try refuseWhileLocked(policy.availability)
        var methods: [AuthenticationMethod] = []
        var reader: FingerprintReader?
        var readerProblem: KeychainError?
        if let binding = policy.biometry {
            switch try readerVerdict(for: binding, directory: context.readerDirectory) {
            case .usable(let present):
                reader = present
                if present.lockState != .permanentLockout || policy.passcode != true { methods.append(.fingerprint) }
            case .enrollmentChanged:
                // Before any prompt, as the seed says for CurrentSet; Engine.get removes the item.
                throw KeychainError(.keyInvalidated,
                                    "The enrolled fingers changed since item '\(record.key)' was written; the item was removed")
            case .unavailable(let why):
                readerProblem = why.code == .biometryNotAvailable
                    ? KeychainError(.biometryNotAvailable, "Item '\(record.key)' needs the fingerprint reader it was written with, "
                                    + "and \(why.message); the item is kept") : why
            }
        } else {
            // Only to end a reader lockout after the passcode: a broken reader does not stop a passcode read.
            reader = context.readerDirectory.flatMap { try? FingerprintReader(directory: $0) }
        }
        if policy.passcode == true { methods.append(.passcode) }
        guard !methods.isEmpty else {
            throw readerProblem ?? KeychainError(.biometryNotAvailable, "Item '\(record.key)' has no way to be opened here")
        }
        // authValidity across processes: a TPM ticket from an earlier read of this key, which opens no other.
        let window = Int32(clamping: policy.acceptsTickets ? window : 0)
        let ticketName = StoreMeta.ticket(service: record.service, protection: record.protection)
        // A ticket made for a longer window than this read's is used only within this read's window.
        if window > 0, let saved = try? store().meta(ticketName),
           let stored = try? JSONDecoder().decode(TPMKeyring.StoredTicket.self, from: Data(saved)),
           stored.expires > Self.now(), (stored.issued ?? stored.expires) + Int64(window) * 1000 > Self.now(),
           methods.contains(stored.branch == "biometry" ? .fingerprint : .passcode) {
            do throws(KeychainError) {
                return try withKeyring { keyring throws(KeychainError) in
                    try keyring.unseal(blob, policy: policy, authorization: .ticket(stored))
                }
            } catch where error.code == .authenticationFailed {
                _ = try? store().write { try $0.deleteMeta(ticketName) }  // the window ended: ask again
            }
        }
        guard let authenticator = context.authenticator else {
            throw KeychainError(.interactionNotAllowed,
                                "Reading '\(record.key)' needs the user (\(methods.map(\.rawValue).joined(separator: " or "))), "
                                + "and no authenticator can ask: pass --touch FINGER or --passcode-stdin, or run on a terminal")
        }
        return try await authenticator.ask(prompt: context.prompt, methods: methods, service: record.service, key: record.key,
                                           unnamedFailure: "no match") { answer throws(KeychainError) in
            switch answer {
            case .finger(let finger):
                guard methods.contains(.fingerprint), let reader else { return .failed("a fingerprint does not open this item") }
                switch try reader.read(finger: finger) {
                case .match:
                    return .opened(try withKeyring { keyring throws(KeychainError) in
                        let secret = try keyring.unseal(blob, policy: policy, authorization: .finger(reader, window: window))
                        saveTicket(keyring.issuedTicket, name: ticketName)
                        return secret
                    })
                case .noMatch:
                    return .failed("no match")
                case .lockout:
                    throw KeychainError(.lockout, "Too many failed fingerprint matches: enter the passcode to use the reader again")
                case .permanentLockout:
                    throw KeychainError(.lockoutPermanent, "The fingerprint reader is locked until the passcode is entered")
                }
            case .passcode(let pin):
                guard methods.contains(.passcode) else { return .failed("the passcode does not open this item") }
                do throws(KeychainError) {
                    let secret = try withKeyring { keyring throws(KeychainError) in
                        let secret = try keyring.unseal(blob, policy: policy, authorization: .passcode(pin, window: window))
                        saveTicket(keyring.issuedTicket, name: ticketName)
                        return secret
                    }
                    try reader?.resetLockout()
                    return .opened(secret)
                } catch where error.code == .authenticationFailed {
                    return .failed("wrong passcode")
                }
            }
        }
    }

    /// One NV_Read of the state index before a prompt: a locked device (or one not unlocked since the
    /// TPM started, for `afterFirstUnlock`) fails at once. Only a guard against a useless prompt: the
    /// TPM's PolicyNV still decides at unseal. Without a passcode the device counts as unlocked.
    /// Skipped, with no TPM connection, while this process last saw the device unlocked and no `lock`
    /// went through this store since (its lock generation): a lock by another store on the TPM, or a
    /// TPM reset under a running process, then costs a useless prompt, never an item.
    private func refuseWhileLocked(_ availability: SealPolicy.Availability) throws(KeychainError) {
        guard availability != .always else { return }
        let generation = try lockGeneration(try store())
        if seenUnlocked == generation { return }
        let unlocked = try withKeyring { keyring throws(KeychainError) -> Bool in
            let state = try keyring.lockState()
            if state == .unlocked { return true }
            if state == .locked && availability == .afterFirstUnlock { return false }
            let passcodeSet = try keyring.passcodeIsSet()
            guard passcodeSet else {
                try keyring.unlock(passcode: nil)
                return true
            }
            throw state == .beforeFirstUnlock
                ? KeychainError(.interactionNotAllowed,
                                "The device has not been unlocked since the TPM started: unlock it first (keychainctl unlock)")
                : KeychainError(.interactionNotAllowed, "The device is locked: unlock it first (keychainctl unlock)")
        }
        if unlocked { seenUnlocked = generation }
    }

    enum ReaderVerdict {
        case usable(FingerprintReader)
        /// The reader the key was sealed to, its key still in the TPM, with another enrollment set.
        case enrollmentChanged
        case unavailable(KeychainError)
    }

    /// How the configured reader stands to a key sealed to `binding`. Only the reader the key was
    /// sealed to, present and holding its key in the TPM, can show that its enrollment changed; a
    /// missing, unreadable or other reader keeps the key and its items.
    func readerVerdict(for binding: SealPolicy.BiometryBinding, directory: String?) throws(KeychainError) -> ReaderVerdict {
        guard let directory else {
            return .unavailable(KeychainError(.biometryNotAvailable, "no fingerprint reader is configured (KEYCHAIN_READER=none)"))
        }
        let reader: FingerprintReader
        do { reader = try FingerprintReader(directory: directory) } catch { return .unavailable(error) }
        guard let keyName = reader.keyName else {
            return .unavailable(KeychainError(.biometryNotAvailable, "there is no fingerprint reader at \(directory)"))
        }
        guard keyName == binding.keyName else {
            return .unavailable(KeychainError(.biometryNotAvailable, "the reader at \(directory) is another one"))
        }
        guard binding.currentSet, reader.enrollmentSet != binding.enrollmentSet else { return .usable(reader) }
        let inTPM = try withKeyring { keyring throws(KeychainError) in
            keyring.holdsPersistent(binding.tpmHandle, named: binding.keyName)
        }
        guard inTPM else {
            return .unavailable(KeychainError(.biometryNotAvailable, String(format: "the TPM no longer holds the key of the reader at "
                                                                               + "\(directory) (0x%08X)", binding.tpmHandle)))
        }
        return .enrollmentChanged
    }

    /// Keys sealed before tickets named their key share one empty policyRef, so a ticket made for one
    /// would open them all: none is ever asked for them, and once one opens it is sealed again with its
    /// own reference (the same secret: its items stay). Best effort: a failure leaves the old blob,
    /// which still opens. Copies of the old blob keep the old policy.
    private func rebind(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        var policy = policy
        policy.keyRef = SealPolicy.keyRef(service: wrapping.service, protection: Self.liveTag(wrapping.protection),
                                          publicKey: wrapping.publicKey)
        reseal(secret, wrapping, policy, store: store)
    }

    /// Seals a wrapping key's secret again under `policy` and stores it over the blob that was opened,
    /// in one transaction: the secret is the same, so its items open with either blob, and a process
    /// killed at any point leaves one of the two. Best effort: a failure leaves the old blob.
    private func reseal(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        guard (try? checked(secret, wrapping)) != nil,
              let blob = try? withKeyring({ keyring throws(KeychainError) in try keyring.seal(secret, policy: policy) }) else { return }
        var updated = wrapping
        updated.sealedPublic = blob.publicArea
        updated.sealedPrivate = blob.privateArea
        updated.policy = policy.encoded()
        // Only over the blob we opened: another process may have rebound or replaced it meanwhile.
        try? writeStore(store) { tx in
            guard try tx.wrappingKey(service: wrapping.service, protection: wrapping.protection)?.sealedPrivate
                    == wrapping.sealedPrivate else { return }
            try tx.putWrappingKey(updated)
        }
    }

    /// Keeps a ticket for the window: the TPM refuses it after the window or a reset, so it is no
    /// secret; failing to save it only means the next read asks again.
    private func saveTicket(_ ticket: TPMKeyring.StoredTicket?, name: String) {
        guard let ticket, let data = try? JSONEncoder().encode(ticket), let store = try? store() else { return }
        _ = try? store.write { try $0.setMeta(name, Array(data)) }
    }

    private func removeInvalidated(_ record: ItemRecord) throws {
        let store = try store()
        try store.write { tx in
            _ = try tx.deleteItem(service: record.service, key: record.key)
            try Self.releaseRetired(service: record.service, key: record.key, tx)
            if try tx.itemCount(service: record.service, protection: record.protection) == 0 {
                _ = try tx.deleteWrappingKey(service: record.service, protection: record.protection)
            }
        }
    }

    func has(service: String, key: String) throws(KeychainError) -> Bool {
        try checkKey(key)
        let store = try store()
        return try read { try store.hasItem(service: service, key: key) }
    }

    @discardableResult
    func remove(service: String, key: String) throws(KeychainError) -> Bool {
        try checkKey(key)
        let store = try store()
        return try writeStore(store) { tx in
            let removed = try tx.deleteItem(service: service, key: key)
            try Self.releaseRetired(service: service, key: key, tx)
            return removed
        }
    }

    func clear(service: String, pkcs11URI: String? = nil) throws(KeychainError) {
        let store = try store()
        if service.hasSuffix(TokenBackend.tagSuffix), let pkcs11URI {
            try tokenBackend(pkcs11URI).destroyKeys(service: service)
        }
        try writeStore(store) { tx in
            for key in try tx.keys(service: service) { _ = try tx.deleteMeta(StoreMeta.retired(service: service, key: key)) }
            _ = try tx.deleteItems(service: service)
            _ = try tx.deleteWrappingKeys(service: service)
        }
        unsealed = unsealed.filter { $0.key.service != service }
        agreed.removeAll()
        writers.removeAll()
    }

    func keys(service: String) throws(KeychainError) -> [String] {
        let store = try store()
        return try read { try store.keys(service: service) }
    }

    func info(service: String, key: String) throws(KeychainError) -> ItemInfo? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        let onToken = record.protection.hasSuffix(TokenBackend.tagSuffix)
        let tag = onToken ? String(record.protection.dropLast(TokenBackend.tagSuffix.count)) : record.protection
        guard let protection = ItemProtection(storageTag: tag) else {
            throw corrupted(record, "its protection '\(record.protection)' is not one this library writes")
        }
        let manufacturer = try read { try store.meta(StoreMeta.manufacturer) }
        let publicService = onToken && record.service.hasSuffix(TokenBackend.tagSuffix)
            ? String(record.service.dropLast(TokenBackend.tagSuffix.count)) : record.service
        return ItemInfo(key: record.key, service: publicService, accessible: protection.accessible,
                        accessControl: protection.accessControl, label: record.label,
                        created: Date(timeIntervalSince1970: Double(record.created) / 1000),
                        modified: Date(timeIntervalSince1970: Double(record.modified) / 1000),
                        securityLevel: onToken ? .pkcs11Token
                            : (manufacturer ?? []).starts(with: Array("IBM".utf8)) ? .softwareTPM : .hardwareTPM)
    }

    // MARK: The device lock

    /// Unlocks; a passcode that the TPM accepted also ends a fingerprint-reader lockout.
    func unlock(passcode: SecureBytes?, readerDirectory: String? = nil) throws(KeychainError) {
        let generation = try lockGeneration(try store())
        try withKeyring { keyring throws(KeychainError) in
            try keyring.unlock(passcode: passcode)
            if let passcode { try keyring.repairInterruptedMark(with: passcode) }
        }
        seenUnlocked = generation
        if passcode != nil, let readerDirectory { try FingerprintReader(directory: readerDirectory).resetLockout() }
    }

    /// Forgets every secret that opens items: unsealed keys, agreed secrets, this process's writers.
    private func forgetSecrets(keepingLongLived: Bool) {
        unsealed = keepingLongLived ? unsealed.filter { $0.value.generation == nil && $0.value.opened == nil } : [:]
        agreed.removeAll()
        writers.removeAll()
        token?.forgetOpened()
    }

    func lock() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in try keyring.lock() }
        let store = try store()
        try writeStore(store) { tx in
            let generation = try tx.meta(StoreMeta.lockGeneration).flatMap(UInt64.init(bigEndianBytes:)) ?? 0
            try tx.setMeta(StoreMeta.lockGeneration, (generation + 1).bigEndianBytes)
        }
        forgetSecrets(keepingLongLived: true)
    }

    /// Crash-atomic (`TPMKeyring.changePasscode`): a removal also deletes this store's
    /// whenPasscodeSetThisDeviceOnly items (Apple: their keys are dead in the TPM too).
    func setPasscode(old: SecureBytes?, new: SecureBytes?) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            let isSet = try keyring.passcodeIsSet()
            if old == nil && isSet {
                throw KeychainError(.invalidArgument, "A passcode is already set: change it with the current one (keychainctl passcode change)")
            }
            if old != nil && !isSet { throw passcodeNotSet() }
            try keyring.changePasscode(from: old, to: new)
            // Whoever just proved the passcode is at the device: it is unlocked, as after a passcode change on iOS.
            try keyring.unlock(passcode: new)
        }
    }

    func resetPasscodeTries() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            try keyring.resetPasscodeTries(limit: configuration.passcodeRetryLimit)
        }
    }

    func status() throws(KeychainError) -> DeviceStatus {
        try withKeyring { keyring throws(KeychainError) in
            let passcodeSet = try keyring.passcodeIsSet()
            let state = try keyring.lockState()
            let ownership = try ownershipStatus(keyring)
            return DeviceStatus(passcodeSet: passcodeSet,
                                lockState: passcodeSet ? .init(rawValue: state.rawValue)! : .unlocked,
                                securityLevel: keyring.isSoftwareTPM ? .softwareTPM : .hardwareTPM,
                                tpm: "\(keyring.context.device)",
                                ownerAuthorizationSet: ownership.owner, lockoutAuthorizationSet: ownership.lockout,
                                storageRootKey: ownership.srk, warnings: ownership.warnings)
        }
    }

    /// Makes sure the store and the TPM are provisioned (SRK, device-lock indices).
    func initialize() throws(KeychainError) -> DeviceStatus {
        try configuration.checkPCRSelection()
        return try status()
    }

    func drainCommandCount() -> Int { defer { tpmCommands = 0 }; return tpmCommands }
    func dropCaches() {
        unsealed.removeAll(); agreed.removeAll(); writers.removeAll(); token?.forgetOpened()
        seenUnlocked = nil
    }

    // MARK: Helpers

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    private func checkKey(_ key: String) throws(KeychainError) {
        guard !key.isEmpty, key.utf8.count <= 1024 else {
            throw KeychainError.invalidArgument("Invalid key: expected a non-empty string of up to 1024 bytes, got \(key.isEmpty ? "an empty string" : "\(key.utf8.count) bytes")")
        }
    }

    private func passcodeNotSet() -> KeychainError {
        KeychainError(.passcodeNotSet, "No device passcode is set: set one first (keychainctl passcode set)")
    }

    private func corrupted(_ record: ItemRecord, _ why: String) -> KeychainError {
        KeychainError(.dataCorrupted, "Item '\(record.key)' of service '\(record.service)' cannot be trusted: \(why)")
    }

    private func read<T>(_ body: () throws -> T) throws(KeychainError) -> T {
        do { return try body() } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    private func writeStore<T>(_ store: Store, _ body: (Transaction) throws -> T) throws(KeychainError) -> T {
        do { return try store.write(body) } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch let error as KeychainError {
            throw error
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }
}

// MARK: Access control: the reader and what a write can get

extension Engine {
    /// The same answer as a write would give, without writing and without a prompt.
    func canUse(_ value: AccessControl, readerDirectory: String?) -> AccessControlCheck {
        guard value != .none else { return .init(available: true) }
        do {
            let reader = try readerDirectory.map { (dir: String) throws(KeychainError) in try FingerprintReader(directory: dir) }
            _ = try writeRequirements(try ItemProtection(accessControl: value), reader: reader)
            return .init(available: true)
        } catch {
            switch error.code {
            case .biometryNotAvailable: return .init(available: false, reason: .notAvailable)
            case .biometryNotEnrolled: return .init(available: false, reason: .notEnrolled)
            case .passcodeNotSet: return .init(available: false, reason: .passcodeNotSet)
            default: return .init(available: false, reason: .unsupported)
            }
        }
    }

    /// Proves the passcode to the TPM (an unlock) when one is set, so enrollment follows the passcode.
    private func requirePasscodeForEnrollment(_ passcode: SecureBytes?) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            let isSet = try keyring.passcodeIsSet()
            guard isSet else { return }
            guard let passcode else {
                throw KeychainError(.authenticationFailed, "Changing the enrolled fingers needs the device passcode (on stdin)")
            }
            try keyring.unlock(passcode: passcode)
        }
    }

    func enroll(_ finger: String, passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) {
        try requirePasscodeForEnrollment(passcode)
        let reader = try FingerprintReader(directory: readerDirectory)
        try withKeyring { keyring throws(KeychainError) in try reader.enroll(finger, keyring: keyring) }
        try reader.resetLockout()
        unsealed = unsealed.filter { $0.value.opened == nil }
        if let passcode { try addReaderBranch(passcode: passcode, readerDirectory: readerDirectory) }
    }

    /// `biometryAnyOrPasscode` means "a finger or the passcode": a key written while no finger was
    /// enrolled has the passcode branch alone. Once one is, the passcode (just proved by the enrollment)
    /// opens each such key of this store and it is sealed again with both branches (`reseal`: the same
    /// secret and keyRef, one transaction per key). A key this misses (a killed enrollment, another
    /// store on the TPM) gets its reader branch at its next read with the passcode.
    private func addReaderBranch(passcode: SecureBytes, readerDirectory: String) throws(KeychainError) {
        let store = try store()
        for wrapping in try read({ try store.wrappingKeys(whereProtectionHasPrefix: "") }) {
            guard let policy = SealPolicy.decode(wrapping.policy),
                  let upgraded = withReaderBranch(policy, wrapping, readerDirectory: readerDirectory) else { continue }
            let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
            // A key the passcode no longer opens (PCRs changed, an old epoch) stays as it is.
            guard let secret = try? withKeyring({ keyring throws(KeychainError) in
                try keyring.unseal(blob, policy: policy, authorization: .passcode(passcode, window: 0))
            }) else { continue }
            reseal(secret, wrapping, upgraded, store: store)
        }
    }

    /// The policy with the reader's `Any` branch added, for a live `biometryAnyOrPasscode` key sealed to
    /// the passcode alone while the configured reader has a finger; nil for every other key.
    private func withReaderBranch(_ policy: SealPolicy, _ wrapping: WrappingKeyRecord, readerDirectory: String?) -> SealPolicy? {
        guard policy.biometry == nil, policy.passcode == true, !wrapping.protection.contains("~"),
              !wrapping.protection.hasSuffix(TokenBackend.tagSuffix),
              ItemProtection(storageTag: wrapping.protection)?.accessControl == .biometryAnyOrPasscode,
              let readerDirectory, let reader = try? FingerprintReader(directory: readerDirectory),
              !reader.enrolled.isEmpty, let state = reader.state else { return nil }
        var upgraded = policy
        upgraded.biometry = .init(keyName: state.keyName, tpmHandle: state.tpmHandle, enrollmentSet: [], currentSet: false)
        upgraded.keyRef = SealPolicy.keyRef(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        return upgraded
    }

    /// Deletes the reader and frees its TPM key's persistent handle; its items keep only their
    /// passcode branch (CurrentSet ones report KEY_INVALIDATED).
    func deleteReader(passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) -> Bool {
        try requirePasscodeForEnrollment(passcode)
        let reader = try FingerprintReader(directory: readerDirectory)
        unsealed = unsealed.filter { $0.value.opened == nil }
        return try withKeyring { keyring throws(KeychainError) in try reader.delete(keyring: keyring) }
    }

    func removeFinger(_ finger: String, passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) -> Bool {
        try requirePasscodeForEnrollment(passcode)
        let reader = try FingerprintReader(directory: readerDirectory)
        unsealed = unsealed.filter { $0.value.opened == nil }
        return try reader.remove(finger)
    }
}

// MARK: keyStorage 'strongbox': the PKCS#11 token

extension Engine {
    /// The token session of this process (one, logged in, reused).
    func tokenBackend(_ uri: String) throws(KeychainError) -> TokenBackend {
        if let token, token.uriText == uri { return token }
        let backend = try TokenBackend(uri: uri)
        token = backend
        return backend
    }

    func setOnToken(_ value: SecureBytes, service: String, key: String, protection: ItemProtection, label: String?,
                    uri: String) throws(KeychainError) {
        try checkKey(key)
        guard value.count <= Self.maxValueLength else {
            throw KeychainError.invalidArgument("Invalid value: at most \(Self.maxValueLength) bytes, got \(value.count)")
        }
        let backend = try tokenBackend(uri)
        let store = try store()
        let tag = protection.storageTag + TokenBackend.tagSuffix
        let dataKey = SecureBytes(random: Sodium.xchachaKeyLength)
        let sealed = try backend.seal(dataKey, service: service, key: key, protection: tag)
        do {
            try store.write { tx in
                let existing = try tx.item(service: service, key: key)
                let now = Self.now()
                var record = ItemRecord(service: service, key: key, protection: tag, label: label ?? existing?.label,
                                        created: existing?.created ?? now, modified: now,
                                        writerPublic: sealed, salt: [], nonce: Sodium.randomBytes(Sodium.xchachaNonceLength),
                                        ciphertext: [])
                record.ciphertext = value.withUnsafeBytes {
                    Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(record))
                }
                try tx.putItem(record)
            }
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    func getFromToken(_ record: ItemRecord, uri: String?) throws(KeychainError) -> SecureBytes {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "Item '\(record.key)' is on a PKCS#11 token, and no token is configured (KEYCHAIN_PKCS11_URI)")
        }
        let dataKey = try tokenBackend(uri).openItemKey(record.writerPublic, service: record.service, key: record.key,
                                                        protection: record.protection)
        do {
            return try Sodium.open(record.ciphertext, key: dataKey, nonce: record.nonce,
                                   associatedData: ItemEnvelope.associatedData(record))
        } catch {
            throw KeychainError(.dataCorrupted, "Item '\(record.key)' of service '\(record.service)' failed authentication")
        }
    }

    func tokenStatus(uri: String) throws(KeychainError) -> TokenStatus {
        let backend = try tokenBackend(uri)
        do {
            let info = try backend.token.info()
            return TokenStatus(label: info.label, manufacturer: info.manufacturer, model: info.model, serial: info.serial,
                               userPinLocked: info.flags.contains(.userPinLocked),
                               userPinFinalTry: info.flags.contains(.userPinFinalTry),
                               userPinCountLow: info.flags.contains(.userPinCountLow))
        } catch {
            throw TokenBackend.map(error, doing: "report its state")
        }
    }
}

/// A PKCS#11 token as `status` shows it.
public struct TokenStatus: Sendable, Hashable, Codable {
    public var label, manufacturer, model, serial: String
    public var userPinLocked, userPinFinalTry, userPinCountLow: Bool
}

// MARK: 'strongbox' with the passcode: the token's user PIN, asked at read

extension Engine {
    static let tokenPINLimit = 5

    /// A token item behind the passcode is stored like a TPM item: an X25519 wrapping pair per
    /// service, whose secret half the token seals (AES-GCM, logged in with the URI's PIN when the key
    /// is made). Writes need only the public half; reads ask for the token's user PIN, which the
    /// token checks (C_Login) before it opens the secret half.
    func setOnTokenWithPasscode(_ value: SecureBytes, service: String, key: String, protection: ItemProtection,
                                label: String?, uri: String) throws(KeychainError) {
        try checkKey(key)
        let store = try store()
        let tag = protection.storageTag + TokenBackend.tagSuffix
        var wrapping = try read { try store.wrappingKey(service: service, protection: tag) }
        if wrapping == nil {
            let pair = Sodium.generateX25519()
            let sealed = try tokenBackend(uri).seal(pair.secretKey, service: service, key: "", protection: tag)
            wrapping = WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey, sealedPublic: [],
                                         sealedPrivate: sealed, policy: Array("pkcs11-user-pin".utf8), created: Self.now())
        }
        try storeEnvelope(value, service: service, key: key, tag: tag, candidate: wrapping!, staleKey: nil,
                          label: label, store: store)
    }

    func tokenPasscodeSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                             context: ReadContext) async throws(KeychainError) -> SecureBytes {
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = Self.window(tag: record.protection, asked: context.authValidity)
        if let cached = unsealed[id], cached.opened.map({ $0 + .seconds(window) > ContinuousClock.now }) ?? false { return cached.secret }
        guard let uri = context.pkcs11URI else {
            throw KeychainError(.hardwareUnavailable, "Item '\(record.key)' is on a PKCS#11 token, and no token is configured (KEYCHAIN_PKCS11_URI)")
        }
        guard let authenticator = context.authenticator else {
            throw KeychainError(.interactionNotAllowed, "Reading '\(record.key)' needs the token's PIN, and no authenticator can ask")
        }
        let backend = try tokenBackend(uri)
        var limiter = tokenLimiter(store)
        return try await authenticator.ask(prompt: context.prompt, methods: [.passcode], service: record.service, key: record.key,
                                           unnamedFailure: "wrong PIN", beforeAsking: { () throws(KeychainError) in
            limiter = tokenLimiter(store)
            guard !limiter.isLocked else {
                throw KeychainError(.lockoutPermanent, "Too many wrong token PINs (\(limiter.limit)): this library refuses the "
                                    + "token's PIN until the count is reset (keychainctl token reset-tries)")
            }
        }) { answer throws(KeychainError) in
            guard case .passcode(let pin) = answer else { return .failed("enter the token's PIN") }
            do throws(KeychainError) {
                try backend.checkPIN(pin)
                limiter.recordSuccess()
                try saveTokenLimiter(limiter, store)
            } catch where error.code == .authenticationFailed {
                limiter.recordFailure()
                try saveTokenLimiter(limiter, store)
                return .failed("wrong PIN, \(limiter.remaining) left")
            }
            let secret = try backend.open(wrapping.sealedPrivate, service: wrapping.service, key: "", protection: wrapping.protection)
            guard secret.count == Sodium.x25519KeyLength, Sodium.x25519Public(of: secret) == wrapping.publicKey else {
                throw KeychainError(.dataCorrupted, "The stored public key of service '\(wrapping.service)' does not match its sealed key")
            }
            if window > 0 { unsealed[id] = (secret, nil, .now) }
            return .opened(secret)
        }
    }

    private func tokenLimiter(_ store: Store) -> PINAttemptLimiter {
        (try? store.meta(StoreMeta.tokenPINAttempts)).flatMap { $0 }.flatMap { try? JSONDecoder().decode(PINAttemptLimiter.self, from: Data($0)) }
            ?? PINAttemptLimiter(limit: Self.tokenPINLimit)
    }

    /// A count that cannot be saved would let PINs be tried without limit: that is an error.
    private func saveTokenLimiter(_ limiter: PINAttemptLimiter, _ store: Store) throws(KeychainError) {
        let data = (try? JSONEncoder().encode(limiter)) ?? Data()
        try writeStore(store) { tx in try tx.setMeta(StoreMeta.tokenPINAttempts, Array(data)) }
    }

    func resetTokenPINTries() throws(KeychainError) {
        let store = try store()
        try writeStore(store) { tx in _ = try tx.deleteMeta(StoreMeta.tokenPINAttempts) }
    }
}
