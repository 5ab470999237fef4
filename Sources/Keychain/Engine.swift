import Foundation
import KeychainStore
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
    /// TPM commands sent by this engine (all connections), for the benchmark.
    private(set) var tpmCommands = 0

    /// Unsealed wrapping keys, in locked memory (`sodium_malloc`). `always*`/`afterFirstUnlock*`
    /// keys stay until the process ends; `whenUnlocked*` keys only while the lock generation
    /// recorded at unseal time is current (a `lock` in any process on this store bumps it).
    private var unsealed: [WrappingKeyID: (secret: SecureBytes, generation: UInt64?)] = [:]
    /// Agreed secrets per (wrapping key, item writer), so a warm read does no X25519.
    private var agreed: [AgreedID: SecureBytes] = [:]
    /// This process's ephemeral writer pair per wrapping public key, and its agreed secret.
    private var writers: [[UInt8]: (publicKey: [UInt8], shared: SecureBytes)] = [:]

    struct WrappingKeyID: Hashable { var service: String; var protection: String; var publicKey: [UInt8] }
    struct AgreedID: Hashable { var wrappingPublic: [UInt8]; var writerPublic: [UInt8] }

    static let lockGenerationMeta = "lock.generation"

    private init(configuration: KeychainConfiguration) {
        self.configuration = configuration
        self.executor = SerialThreadExecutor(name: "keychain.engine")
    }

    private static let engines = Mutex<[String: Engine]>([:])

    /// The engine of a store directory in this process (made on first use; touches nothing yet).
    static func shared(for configuration: KeychainConfiguration) -> Engine {
        let key = URL(fileURLWithPath: configuration.storeDirectory).standardizedFileURL.path
        return engines.withLock { engines in
            if let engine = engines[key] { return engine }
            let engine = Engine(configuration: configuration)
            engines[key] = engine
            return engine
        }
    }

    // MARK: Resources

    func store() throws(KeychainError) -> Store {
        if let openedStore { return openedStore }
        do {
            let store = try Store(directory: configuration.storeDirectory)
            openedStore = store
            return store
        } catch {
            throw KeychainError(store: error)
        }
    }

    /// Connects to the TPM for one operation; the connection closes when `body` returns, so a software
    /// TPM (one client at a time) is free for other processes between operations.
    func withKeyring<T>(_ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        let store = try store()
        let device: TPMDevice
        switch configuration.tpm {
        case .tcti(let conf): device = TPMDevice(parsing: conf)
        case .embedded:
            let (embedded, started) = try EmbeddedTPM.ensureRunning(storeDirectory: configuration.storeDirectory)
            device = embedded
            if started { try prepareFreshSoftwareTPM(device) }
        }
        let keyring = try TPMKeyring(device: device, store: store, configuration: configuration)
        defer { tpmCommands += keyring.context.commandCount }
        return try body(keyring)
    }

    /// A just-started software TPM gets small dictionary-attack settings: nothing here is subject to
    /// DA (our objects are noDA), but other tools on it should not lock it out for 1000 s.
    private func prepareFreshSoftwareTPM(_ device: TPMDevice) throws(KeychainError) {
        do {
            let context = try TPMContext(device: device)
            try context.setDictionaryAttackParameters(maxTries: 32, recoveryTime: 10, lockoutRecovery: 10)
            tpmCommands += context.commandCount
        } catch {
            throw KeychainError(.hardwareUnavailable, "The embedded software TPM does not answer", underlying: .tpm(error))
        }
    }

    private func lockGeneration(_ store: Store) throws(KeychainError) -> UInt64 {
        do { return try store.meta(Self.lockGenerationMeta).flatMap(UInt64.init(bigEndianBytes:)) ?? 0 }
        catch { throw KeychainError(store: error) }
    }

    // MARK: Items

    func set(_ value: SecureBytes, service: String, key: String, protection: ItemProtection, label: String?) throws(KeychainError) {
        try checkKey(key)
        guard protection.accessControl == .none else {
            throw AccessControlSupport.writeError(for: protection.accessControl)
        }
        let store = try store()
        let tag = protection.storageTag
        var wrapping = try read { try store.wrappingKey(service: service, protection: tag) }
        var deadKey: [UInt8]?
        if let existing = wrapping, protection.accessible.requiresPasscode {
            // The passcode may have been removed (by any process) since: that key is dead in the TPM.
            let epoch = SealPolicy.decode(existing.policy)?.passcodeEpoch
            let current: (isSet: Bool, epoch: UInt64) = try withKeyring { keyring throws(KeychainError) in
                do throws(TPMError) { return (try keyring.currentDescriptor().passcodeSet, try keyring.currentPasscodeEpoch()) }
                catch { throw keyring.diagnose(error, doing: "read the passcode state") }
            }
            guard current.isSet else { throw passcodeNotSet() }
            if epoch != current.epoch { deadKey = existing.publicKey; wrapping = nil }
        }
        if wrapping == nil {
            let pair = Sodium.generateX25519()
            let (blob, policy) = try withKeyring { keyring throws(KeychainError) in
                try keyring.seal(pair.secretKey, accessible: protection.accessible, pcrs: configuration.pcrSelection)
            }
            wrapping = WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey,
                                         sealedPublic: blob.publicArea, sealedPrivate: blob.privateArea,
                                         policy: policy.encoded(), created: Self.now())
        }
        let candidate = wrapping!
        do {
            try store.write { tx in
                // Another process may have made this service's key meanwhile: theirs wins, ours is dropped.
                var current = try tx.wrappingKey(service: service, protection: tag)
                if current == nil || current?.publicKey == deadKey {
                    if deadKey != nil { _ = try tx.deleteItems(protection: tag) }
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
                let dataKey = ItemEnvelope.dataKey(shared: writer.shared, salt: record.salt)
                record.ciphertext = value.withUnsafeBytes {
                    Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(record))
                }
                try tx.putItem(record)
            }
        } catch let error as KeychainError {
            throw error
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
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

    func get(service: String, key: String) throws(KeychainError) -> SecureBytes? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        guard let wrapping = try read({ try store.wrappingKey(service: service, protection: record.protection) }) else {
            throw corrupted(record, "its wrapping key is missing from the store")
        }
        let secret: SecureBytes
        do throws(KeychainError) {
            secret = try unsealedSecret(for: wrapping, store: store)
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
        let dataKey = ItemEnvelope.dataKey(shared: shared, salt: record.salt)
        do {
            return try Sodium.open(record.ciphertext, key: dataKey, nonce: record.nonce,
                                   associatedData: ItemEnvelope.associatedData(record))
        } catch {
            throw corrupted(record, "it failed authentication: a stored field was changed or swapped")
        }
    }

    private func unsealedSecret(for wrapping: WrappingKeyRecord, store: Store) throws(KeychainError) -> SecureBytes {
        guard let policy = SealPolicy.decode(wrapping.policy) else {
            throw KeychainError(.dataCorrupted, "The wrapping key of service '\(wrapping.service)' has an unreadable policy")
        }
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let generation: UInt64? = policy.availability == .whenUnlocked ? try lockGeneration(store) : nil
        if let cached = unsealed[id], cached.generation == generation { return cached.secret }
        let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
        let secret = try withKeyring { keyring throws(KeychainError) -> SecureBytes in
            do throws(KeychainError) {
                return try keyring.unseal(blob, policy: policy)
            } catch where error.code == .interactionNotAllowed {
                // Without a passcode the device counts as unlocked (as on iOS): unlock with the empty one.
                let passcodeSet: Bool
                do throws(TPMError) { passcodeSet = try keyring.currentDescriptor().passcodeSet } catch {
                    throw keyring.diagnose(error, doing: "read the passcode state")
                }
                guard !passcodeSet else { throw error }
                try keyring.unlock(passcode: nil)
                return try keyring.unseal(blob, policy: policy)
            }
        }
        guard Sodium.x25519Public(of: secret) == wrapping.publicKey else {
            throw KeychainError(.dataCorrupted, "The stored public key of service '\(wrapping.service)' does not match its sealed key")
        }
        unsealed[id] = (secret, generation)
        return secret
    }

    private func removeInvalidated(_ record: ItemRecord) throws {
        let store = try store()
        try store.write { tx in
            _ = try tx.deleteItem(service: record.service, key: record.key)
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
        return try writeStore(store) { tx in try tx.deleteItem(service: service, key: key) }
    }

    func clear(service: String) throws(KeychainError) {
        let store = try store()
        try writeStore(store) { tx in
            _ = try tx.deleteItems(service: service)
            _ = try tx.deleteWrappingKeys(service: service)
        }
        unsealed = unsealed.filter { $0.key.service != service }
    }

    func keys(service: String) throws(KeychainError) -> [String] {
        let store = try store()
        return try read { try store.keys(service: service) }
    }

    func info(service: String, key: String) throws(KeychainError) -> ItemInfo? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        guard let protection = ItemProtection(storageTag: record.protection) else {
            throw corrupted(record, "its protection '\(record.protection)' is not one this library writes")
        }
        let manufacturer = try read { try store.meta("tpm.manufacturer") }
        return ItemInfo(key: record.key, service: record.service, accessible: protection.accessible,
                        accessControl: protection.accessControl, label: record.label,
                        created: Date(timeIntervalSince1970: Double(record.created) / 1000),
                        modified: Date(timeIntervalSince1970: Double(record.modified) / 1000),
                        securityLevel: (manufacturer ?? []).starts(with: Array("IBM".utf8)) ? .softwareTPM : .hardwareTPM)
    }

    // MARK: The device lock

    func unlock(passcode: SecureBytes?) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in try keyring.unlock(passcode: passcode) }
    }

    func lock() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in try keyring.lock() }
        let store = try store()
        try writeStore(store) { tx in
            let generation = try tx.meta(Self.lockGenerationMeta).flatMap(UInt64.init(bigEndianBytes:)) ?? 0
            try tx.setMeta(Self.lockGenerationMeta, (generation + 1).bigEndianBytes)
        }
        unsealed = unsealed.filter { $0.value.generation == nil }
    }

    func setPasscode(old: SecureBytes?, new: SecureBytes?) throws(KeychainError) {
        let store = try store()
        try withKeyring { keyring throws(KeychainError) in
            let isSet: Bool
            do throws(TPMError) { isSet = try keyring.currentDescriptor().passcodeSet } catch {
                throw keyring.diagnose(error, doing: "read the passcode state")
            }
            if old == nil && isSet {
                throw KeychainError(.invalidArgument, "A passcode is already set: change it with the current one (keychainctl passcode change)")
            }
            if old != nil && !isSet { throw passcodeNotSet() }
            try keyring.changePasscode(from: old, to: new)
            // Whoever just proved the passcode is at the device: it is unlocked, as after a passcode change on iOS.
            try keyring.unlock(passcode: new)
        }
        if new == nil {
            // Apple: removing the passcode destroys whenPasscodeSetThisDeviceOnly items (their keys are dead in the TPM too).
            let tag = Accessible.whenPasscodeSetThisDeviceOnly.rawValue + "/"
            try writeStore(store) { tx in
                for key in try tx.wrappingKeys(whereProtectionHasPrefix: tag) {
                    _ = try tx.deleteItems(protection: key.protection)
                    _ = try tx.deleteWrappingKeys(protection: key.protection)
                }
            }
            unsealed = unsealed.filter { !$0.key.protection.hasPrefix(tag) }
        }
    }

    func resetPasscodeTries() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            try keyring.resetPasscodeTries(ownerAuthorization: configuration.ownerAuthorization,
                                           limit: configuration.passcodeRetryLimit)
        }
    }

    func status() throws(KeychainError) -> DeviceStatus {
        try withKeyring { keyring throws(KeychainError) in
            let passcodeSet: Bool
            do throws(TPMError) { passcodeSet = try keyring.currentDescriptor().passcodeSet } catch {
                throw keyring.diagnose(error, doing: "read the passcode state")
            }
            let state = try keyring.lockState()
            return DeviceStatus(passcodeSet: passcodeSet,
                                lockState: passcodeSet ? .init(rawValue: state.rawValue)! : .unlocked,
                                securityLevel: keyring.isSoftwareTPM ? .softwareTPM : .hardwareTPM,
                                tpm: "\(keyring.context.device)")
        }
    }

    /// Makes sure the store and the TPM are provisioned (SRK, device-lock indices).
    func initialize() throws(KeychainError) -> DeviceStatus { try status() }

    func drainCommandCount() -> Int { defer { tpmCommands = 0 }; return tpmCommands }
    func dropCaches() { unsealed.removeAll(); agreed.removeAll(); writers.removeAll() }

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
