import KeychainCore
import KeychainBasics
import Glibc
import FoundationEssentials
import KeychainStore
import PKCS11
import SecureMemory
import Synchronization
import TPM2

/// The one owner of a store and its TPM connection in this process; every `Keychain` value on the
/// same store directory shares it. It runs on its own serial queue, so the blocking SQLite and TPM
/// calls never block Swift's shared pool, and TPM commands are serialised.
package actor Engine {
    nonisolated let executor: SerialThreadExecutor
    package nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }

    let configuration: KeychainConfiguration
    /// The quota of each namespace of a server's scopes (a uid's, an access group's, a manager's
    /// credentials) that this engine's writes are checked against (Quota.swift); nil in-process.
    let quota: UserLimits?
    var openedStore: Store?
    /// Whether this engine's first TPM operation looked for an interrupted passcode change.
    var checkedPasscodeChange = false
    /// TPM commands sent by this engine (all connections), for the benchmark.
    var tpmCommands = 0

    /// Unsealed wrapping keys, in locked memory (`sodium_malloc`). `always*`/`afterFirstUnlock*`
    /// keys stay until the process ends; `whenUnlocked*` keys only while the lock generation
    /// recorded at unseal time is current (a `lock` in any process on this store bumps it). Keys
    /// behind an access control record when the user opened them: each read checks its own window.
    /// Kept in `warm`, where a warm read finds them without the engine's thread.
    var unsealed: [WrappingKeyID: UnsealedKey] {
        get { warm.unsealed }
        set { warm.unsealed = newValue }
    }
    /// Agreed secrets per (wrapping key, item writer), so a warm read does no X25519.
    var agreed: [AgreedID: SecureBytes] {
        get { warm.agreed }
        set { warm.agreed = newValue }
    }
    typealias UnsealedKey = (secret: SecureBytes, generation: UInt64?, opened: ContinuousClock.Instant?)
    /// What a warm read needs, for any thread (`warmGet`): the open store and the keys this engine opened.
    nonisolated let warm = WarmState()
    /// The store's lock generation when this process last saw the TPM's state index say "unlocked"
    /// (a read's pre-prompt check, or an unlock): while it is current the check needs no TPM.
    var seenUnlocked: UInt64?
    /// This process's ephemeral writer pair per wrapping public key, and its agreed secret.
    var writers: [[UInt8]: (publicKey: [UInt8], shared: SecureBytes)] = [:]
    /// The PKCS#11 token session, for `keyStorage: 'strongbox'` items.
    var token: TokenSession?

    struct WrappingKeyID: Hashable, Sendable { var service: String; var protection: String; var publicKey: [UInt8] }
    struct AgreedID: Hashable, Sendable { var wrappingPublic: [UInt8]; var writerPublic: [UInt8] }

    /// The embedded software TPM's owner authorization, from its file, once this process checked that
    /// the TPM holds it (on start, and on first use: a crash may have left the file without the change).
    var embeddedOwnerAuthorization: SecureBytes?
    var embeddedTPMChecked = false
    /// Set when this process started the embedded software TPM (a TPM reset: its state index is unwritten, the
    /// device not unlocked since), until the next read without a user or unlock (`unsealWithoutUser`).
    var startedTPMNeedsUnlock = false

    /// The store's rollback counter as this process last read or made it (nil: read it at the next
    /// TPM operation), the TPM's clock counts then, and the counter's ESAPI resource (RollbackCounter.swift).
    var rollbackKnown: UInt64?
    var rollbackClock: TPMContext.ClockCounts?
    var rollbackCounterTR: (index: UInt32, tr: [UInt8])?
    /// Set while `status` and `acceptStore` look at a store that may be rolled back: no check, no counted write.
    var rollbackCheckSuspended = false
    /// The keyring of the TPM operation under way, so a write inside it counts on the same connection.
    var activeKeyring: TPMKeyring?
    /// The TPM connection of the last operation that ended well, for the next one (`withKeyring`):
    /// only where it leaves the TPM free for other processes between operations (`allowsAKeptConnection`).
    var keptConnection: TPMContext?
    /// keychaind on a chip (`configuration.tpmSession`, decided at its start): the kept connection
    /// also keeps a salted session for the Unseals (`TPMContext.keptSession`).
    var keepsTPMSession = false
    /// The wrapping keys' contexts keychaind saved after its start (`saveWrappingKeyContexts`), by
    /// sealed blob: a first read loads one with ContextLoad instead of Load.
    var savedContexts: [TPMContext.SealedBlob: TPMContext.SavedContext] = [:]
    /// The mark of this engine's last turn at the TPM (`TPMTurn.mark`) when that turn's operation
    /// ended well and left nothing in the TPM: a turn whose lock still holds it follows that one
    /// directly, so the TPM holds nothing a killed process left, and the leftover check is skipped.
    var lastTurnMark: [UInt8]?
    /// The call whose TPM operations ran last (`SerialThreadExecutor.callMadeAt`) and how long they
    /// took: a later operation of the same call counts them as the TPM's answers, not as a wait.
    var callTPMTime: (call: ContinuousClock.Instant, spent: Duration)?

    private init(configuration: KeychainConfiguration, quota: UserLimits?) {
        self.configuration = configuration
        self.quota = quota
        self.executor = SerialThreadExecutor(name: "keychain.engine")
    }

    /// Ends the engine's thread: its last storage went (the map holds engines weakly).
    deinit { executor.stop() }

    private final class Weak: Sendable {
        weak let engine: Engine?
        init(_ engine: Engine) { self.engine = engine }
    }
    /// Engines live while a storage or device holds them: a process that opens many stores, one
    /// after the other, does not keep a thread and the secrets of each.
    private static let engines = Mutex<[String: Weak]>([:])
    /// The engines of the default storage (`keychain`, made at each use): they live for the process.
    private static let kept = Mutex<[ObjectIdentifier: Engine]>([:])

    package static func keepForProcess(_ engine: Engine) {
        kept.withLock { $0[ObjectIdentifier(engine)] = engine }
    }

    /// The engine of a store directory in this process (made on first use; touches nothing yet), and
    /// the refusal of a configuration whose engine-wide settings differ from the engine's: one store
    /// has one TPM, owner authorization, PCR selection, passcode limit and timeout in a process.
    /// - Parameter quota: a new engine's (`quota`); an engine already made keeps its own.
    static func shared(for configuration: KeychainConfiguration, quota: UserLimits? = nil) -> (engine: Engine, refusal: KeychainError?) {
        let key = URL(fileURLWithPath: configuration.storeDirectory).standardizedFileURL.path
        return engines.withLock { engines in
            if let engine = engines[key]?.engine { return (engine, engine.configuration.refusal(sharing: configuration)) }
            engines = engines.filter { $0.value.engine != nil }
            let engine = Engine(configuration: configuration, quota: quota)
            engines[key] = Weak(engine)
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
        try mergeTokenNamespace(store)
        // Every call, a TPM's or not: a selection given (--pcrs) must be the one the store was set up with.
        if let recorded = try TPMKeyring.recordedPCRSelection(store) {
            _ = try TPMKeyring.selection(recorded: recorded, given: configuration.validPCRSelection)
        }
        openedStore = store
        warm.store = store
        return store
    }

    /// Pins the store's identity beside the embedded TPM's state, so that a store emptied or replaced
    /// later is seen as such; an embedded TPM serves one store only.
    func pinStoreInEmbeddedTPM(_ store: Store) throws(KeychainError) {
        let path = EmbeddedTPM.storePin(configuration.storeDirectory)
        guard access(path, F_OK) != 0 else { return }
        do { _ = try FileSystem.createPrivateFile(path, store.identity, what: "the embedded TPM's store identity") } catch {
            throw KeychainError(store: error)
        }
    }

    /// Closes the store: SQLite copies the write-ahead log into `keychain.db` when the last connection
    /// closes, so committed data does not depend on the `-wal` file. The next call opens it again.
    func close() {
        openedStore = nil
        warm.store = nil
    }

    /// Closes the store of every engine of this process.
    package static func closeAll() async {
        for engine in engines.withLock({ $0.values.compactMap(\.engine) }) { await engine.close() }
    }

    nonisolated func lockGeneration(_ store: Store) throws(KeychainError) -> UInt64 {
        do { return try store.meta(StoreMeta.lockGeneration).flatMap(UInt64.init(bigEndianBytes:)) ?? 0 }
        catch { throw KeychainError(store: error) }
    }

    // MARK: Items

    /// Stores one item under the wrapping key `backend` gives its service and protection.
    func set(_ value: SecureBytes, service: String, key: String, protection: ItemProtection, label: String?,
             backend: any KeyBackend, tag: String, dates: ItemDates? = nil) throws(KeychainError) {
        // Before any key is made: the store would refuse these names only after the backend's work.
        if let problem = ItemNames.problem(service: service, key: key, label: label) { throw KeychainError.invalidArgument(problem) }
        guard value.count <= Self.maxValueLength else {
            throw KeychainError.invalidArgument("Invalid value: at most \(Self.maxValueLength) bytes, got \(value.count)")
        }
        let store = try store()
        let measured = try checkQuotaBeforeSealing(value, service: service, key: key, label: label, store: store)
        let stored = try read { try store.wrappingKey(service: service, protection: tag) }
        let (candidate, replaces) = try backend.wrappingKey(service: service, tag: tag, protection: protection, stored: stored,
                                                             engine: self)
        try storeEnvelope(value, service: service, key: key, tag: tag, candidate: candidate, staleKey: replaces,
                          label: label, store: store, dates: dates, measured: measured)
    }

    /// The backend that holds a stored wrapping key, from the record.
    func backend(of wrapping: WrappingKeyRecord, readerDirectory: String?, pkcs11URI: String?) throws(KeychainError) -> any KeyBackend {
        switch wrapping.backend {
        case .tpm: return TPMBackend(readerDirectory: readerDirectory)
        case .token: return TokenBackend(uri: pkcs11URI)
        case .unknown:
            throw KeychainError(.dataCorrupted, "A key of service '\(ItemScope.shown(wrapping.service))' is held by a backend this version "
                                + "does not know: it was written by a newer version")
        }
    }

    /// Writes one item under a wrapping public key, in one transaction: no TPM or token needed.
    /// Another process may have made the same wrapping key meanwhile: theirs wins, ours is dropped.
    func storeEnvelope(_ value: SecureBytes, service: String, key: String, tag: String, candidate: WrappingKeyRecord,
                       staleKey: [UInt8]?, label: String?, store: Store, dates: ItemDates? = nil,
                       measured: QuotaMeasure?) throws(KeychainError) {
        try writeStore(store) { tx in
            // keychaind's quota: what the caller's namespace holds before this write, as measured before
            // the TPM work unless something was committed since (then measured again).
            let scope = quota == nil ? nil : quotaScope(of: service)
            let usage = try scope.map { scope in
                if let measured, try store.dataVersion() == measured.dataVersion { return measured.usage }
                return try tx.usage(servicePrefixes: scope.quotaPrefixes)
            }
            // Another process may have made this service's key meanwhile: theirs wins, ours is dropped.
            var current = try tx.wrappingKey(service: service, protection: tag)
            let addsKey = current == nil || current?.publicKey == staleKey
            if addsKey {
                // The items of the dead key stay with it, each to report KEY_INVALIDATED on its next read.
                if let stale = current, staleKey != nil { try Self.retire(stale, tx) }
                try tx.putWrappingKey(candidate)
                current = candidate
            }
            let writer = try self.writer(for: current!.publicKey)
            let existing = try tx.item(service: service, key: key)
            let now = Self.now()
            var record = ItemRecord(service: service, key: key, protection: tag, label: label ?? existing?.label,
                                    created: dates?.created ?? existing?.created ?? now, modified: dates?.modified ?? now,
                                    writerPublic: writer.publicKey, salt: Sodium.randomBytes(ItemEnvelope.saltLength),
                                    nonce: Sodium.randomBytes(Sodium.xchachaNonceLength), ciphertext: [])
            let dataKey = ItemEnvelope.dataKey(shared: writer.shared, writerPublic: writer.publicKey,
                                               wrappingPublic: current!.publicKey, salt: record.salt)
            record.ciphertext = value.withUnsafeBytes {
                Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(record))
            }
            if let usage {
                try checkQuota(service: service, key: key, usage: usage, existing: existing,
                               newItemBytes: StoreUsage.bytes(of: record), newKeyBytes: addsKey ? StoreUsage.bytes(of: candidate) : 0)
            }
            try tx.putItem(record)
            try Self.releaseRetired(service: service, key: key, tx)
            // The item may have been under another key (another protection or backend): that key
            // goes when no item uses it any more.
            if let old = existing?.protection, old != tag, try tx.itemCount(service: service, protection: old) == 0 {
                _ = try tx.deleteWrappingKey(service: service, protection: old)
            }
            try CallerPresence.checkBeforeWriting()
        }
    }

    package static let maxValueLength = 16 << 20

    func writer(for wrappingPublic: [UInt8]) throws(KeychainError) -> (publicKey: [UInt8], shared: SecureBytes) {
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
        /// False for an access group's items through keychaind: a window one member opened would let
        /// every other member read without proving anything, so such reads ask each time.
        var windowAllowed = true
        /// keychaind's caller: its own reader failures and passcode budget (nil in-process).
        var caller: Caller?

        /// The read's authValidity window in seconds for an item of `tag` (0: ask at every read).
        func window(tag: String) -> Int { windowAllowed ? Engine.window(tag: tag, asked: authValidity) : 0 }
        /// The same for an item whose tag stores `stored` (`ItemProtection.storedWindow(ofTag:)`).
        func window(stored: Int?) -> Int { windowAllowed ? Engine.window(stored: stored, asked: authValidity) : 0 }
    }

    func get(service: String, key: String, context: ReadContext) async throws(KeychainError) -> SecureBytes? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        // A token item of the first format: its own data key, sealed by the token, in writerPublic.
        if record.salt.isEmpty { return try getFromToken(record, uri: context.pkcs11URI) }
        let wrapping = try wrappingKey(of: record, store: store).record
        let secret: SecureBytes
        do throws(KeychainError) {
            secret = try await backend(of: wrapping, readerDirectory: context.readerDirectory, pkcs11URI: context.pkcs11URI)
                .openSecret(wrapping, for: record, store: store, context: context, engine: self)
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
        return try open(record, under: wrapping, shared: shared)
    }

    /// The wrapping key that opens `record`: a retired one when a later write replaced the key of the
    /// item's tag and left the item with the dead key (`Engine.set`'s staleKey), else its tag's.
    nonisolated func wrappingKey(of record: ItemRecord, store: Store) throws(KeychainError) -> (record: WrappingKeyRecord, retired: Bool) {
        // Only these tags ever have a dead key replaced: others skip the lookup.
        let retired = !Self.mayBeRetired(record.protection) ? nil
            : try read { try Self.retiredKey(of: record, marker: store.meta(StoreMeta.retired(service: record.service, key: record.key))) }
        let keyTag = retired.map { Self.retiredTag(record.protection, publicKey: $0) } ?? record.protection
        guard let wrapping = try read({ try store.wrappingKey(service: record.service, protection: keyTag) }) else {
            throw corrupted(record, "its wrapping key is missing from the store")
        }
        return (wrapping, retired != nil)
    }

    /// Tags whose key a later write may replace while items stay with the dead one (`Engine.set`'s
    /// staleKey): CurrentSet keys (enrollment), passcode keys, every access control (a passcode
    /// removal ends them all) and the token's.
    static func mayBeRetired(_ tag: String) -> Bool {
        tag.contains("CurrentSet") || tag.hasPrefix(Accessible.whenPasscodeSetThisDeviceOnly.rawValue)
            || !tag.contains("/\(AccessControl.none.rawValue)") || tag.hasSuffix(TokenSession.tagSuffix)
    }

    /// An item's value from the secret its writer and its wrapping key agreed: the data key, the AEAD.
    nonisolated func open(_ record: ItemRecord, under wrapping: WrappingKeyRecord, shared: SecureBytes) throws(KeychainError) -> SecureBytes {
        let dataKey = ItemEnvelope.dataKey(shared: shared, writerPublic: record.writerPublic,
                                           wrappingPublic: wrapping.publicKey, salt: record.salt)
        do {
            return try Sodium.open(record.ciphertext, key: dataKey, nonce: record.nonce,
                                   associatedData: ItemEnvelope.associatedData(record))
        } catch {
            throw corrupted(record, "it failed authentication: a stored field was changed or swapped")
        }
    }
    func checked(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord) throws(KeychainError) -> SecureBytes {
        guard secret.count == Sodium.x25519KeyLength, Sodium.x25519Public(of: secret) == wrapping.publicKey else {
            throw KeychainError(.dataCorrupted, "The stored public key of service '\(ItemScope.shown(wrapping.service))' does not match its sealed key")
        }
        return secret
    }

    func removeInvalidated(_ record: ItemRecord) throws {
        let store = try store()
        try writeStore(store) { tx in
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
            try CallerPresence.checkBeforeWriting()
            return removed
        }
    }

    /// Removes every item of the service, whatever holds its key, and the service's objects on the
    /// configured token. Without a token configured its objects stay there (the store's sealed
    /// parts that they open are removed all the same).
    func clear(service: String, pkcs11URI: String? = nil) throws(KeychainError) {
        let store = try store()
        if let pkcs11URI {
            let known = try read({ try store.wrappingKeys(service: service).contains { $0.backend == .token }
                                       || store.keys(service: service).contains { try store.item(service: service, key: $0)?.salt.isEmpty == true } })
            // With no token key left in the store (its last item was replaced by a TPM write) the
            // service's object may still be on the token: destroyed too, as far as the token is there.
            do throws(KeychainError) { try TokenBackend(uri: pkcs11URI).destroyKeys(service: service, engine: self) } catch {
                if known { throw error }
            }
        }
        try writeStore(store) { tx in
            for key in try tx.keys(service: service) { _ = try tx.deleteMeta(StoreMeta.retired(service: service, key: key)) }
            _ = try tx.deleteItems(service: service)
            _ = try tx.deleteWrappingKeys(service: service)
            try CallerPresence.checkBeforeWriting()
        }
        unsealed = unsealed.filter { $0.key.service != service }
        agreed.removeAll()
        writers.removeAll()
    }

    func keys(service: String) throws(KeychainError) -> [String] {
        let store = try store()
        return try read { try store.keys(service: service) }
    }

    /// The services whose store names begin with `prefix` (a scope's), without it, sorted.
    func services(prefix: String) throws(KeychainError) -> [String] {
        let store = try store()
        return try read { try store.services() }.filter { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }.sorted()
    }

    func info(service: String, key: String) throws(KeychainError) -> ItemInfo? {
        try checkKey(key)
        let store = try store()
        guard let record = try read({ try store.item(service: service, key: key) }) else { return nil }
        guard let protection = ItemProtection(storageTag: TokenSession.withoutTokenSuffix(record.protection)) else {
            throw corrupted(record, "its protection is not one this library writes")
        }
        // The first format's token items have no wrapping key: their own data key is on the token.
        let wrapping = record.salt.isEmpty ? nil : try read { try store.wrappingKey(service: service, protection: record.protection) }
        let level = try wrapping.map { (w: WrappingKeyRecord) throws(KeychainError) in
            try backend(of: w, readerDirectory: nil, pkcs11URI: nil).securityLevel(engine: self)
        } ?? .pkcs11Token
        return ItemInfo(key: record.key, service: record.service, accessible: protection.accessible,
                        accessControl: protection.accessControl, label: record.label,
                        created: Date(timeIntervalSince1970: Double(record.created) / 1000),
                        modified: Date(timeIntervalSince1970: Double(record.modified) / 1000),
                        securityLevel: level, token: level == .pkcs11Token ? wrapping?.token : nil)
    }

    /// Forgets every secret that opens items: unsealed keys, agreed secrets, this process's writers.
    func forgetSecrets(keepingLongLived: Bool) {
        unsealed = keepingLongLived ? unsealed.filter { $0.value.generation == nil && $0.value.opened == nil } : [:]
        agreed.removeAll()
        writers.removeAll()
        token?.forgetOpened()
    }

    /// Ends the authValidity windows of `service`'s items: the keys kept for a window are forgotten and
    /// the TPM tickets the store keeps for them deleted, so the next read behind an access control asks.
    func endWindows(service: String) throws(KeychainError) {
        unsealed = unsealed.filter { $0.key.service != service || $0.value.opened == nil }
        let store = try store()
        let protections = try read { try Set(store.wrappingKeys(service: service).map(\.protection)) }
        try writeStore(store) { tx in
            for protection in protections { try tx.deleteMeta(StoreMeta.ticket(service: service, protection: protection)) }
        }
    }

    func drainCommandCount() -> Int { defer { tpmCommands = 0 }; return tpmCommands }
    func dropCaches() {
        unsealed.removeAll(); agreed.removeAll(); writers.removeAll(); token?.forgetOpened()
        seenUnlocked = nil
    }

    // MARK: Helpers

    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    func checkKey(_ key: String) throws(KeychainError) {
        if let problem = ItemNames.keyProblem(key) { throw KeychainError.invalidArgument(problem) }
    }

    func passcodeNotSet() -> KeychainError {
        KeychainError(.passcodeNotSet, "No device passcode is set: set one first (keychainctl passcode set)")
    }

    nonisolated func corrupted(_ record: ItemRecord, _ why: String) -> KeychainError {
        KeychainError(.dataCorrupted, "Item '\(record.key)' of service '\(ItemScope.shown(record.service))' cannot be trusted: \(why)")
    }

    nonisolated func read<T>(_ body: () throws -> T) throws(KeychainError) -> T {
        do { return try body() } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch let error as KeychainError {
            throw error
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// A write bound to the store's rollback counter when it has one (`countedWrite`).
    func writeStore<T>(_ store: Store, _ body: (Transaction) throws -> T) throws(KeychainError) -> T {
        try countedWrite(store, body)
    }

    func writeUncounted<T>(_ store: Store, _ body: (Transaction) throws -> T) throws(KeychainError) -> T {
        do { return try store.write(body) } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch let error as KeychainError {
            throw error
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }
}
