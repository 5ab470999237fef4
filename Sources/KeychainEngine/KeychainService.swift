import KeychainCore
import KeychainBasics
import KeychainWire

/// The store's engine in this process, as a `KeychainService`: the calls of one configuration
/// (its reader, token and authenticator; the engine is shared by every configuration of the store).
package struct LocalService: KeychainService {
    package let engine: Engine
    let configuration: KeychainConfiguration
    /// Why this configuration cannot use the store's engine; thrown by every call that can throw.
    package let refusal: KeychainError?
    /// Whose call this is (`serving`): its own reader failures and passcode budget; nil in-process.
    var caller: Caller?

    package init(configuration: KeychainConfiguration) {
        let shared = Engine.shared(for: configuration)
        (engine, refusal, self.configuration) = (shared.engine, shared.refusal, configuration)
    }

    /// keychaind's: its own engine, which it holds for its life.
    init(engine: Engine, configuration: KeychainConfiguration) {
        (self.engine, self.configuration, refusal) = (engine, configuration, nil)
    }

    /// A server's (keychaind's): the store's engine, which the server holds for its life, its writes
    /// checked against `quota` in each of the server's scopes.
    package init(server configuration: KeychainConfiguration, quota: UserLimits) {
        self.init(engine: Engine.shared(for: configuration, quota: quota).engine, configuration: configuration)
    }

    /// The engine's thread, for a server's connection thread to run the engine's jobs on while it
    /// waits for its call (`SerialThreadExecutor.drive`).
    package var executor: SerialThreadExecutor { engine.executor }

    /// What the first call after a TPM reset would begin with, done before a server says it is ready
    /// (`Engine.unlockWithoutPasscodeAtStart`). - Returns: whether it unlocked.
    package func unlockWithoutPasscodeAtStart() async throws(KeychainError) -> Bool {
        try await engine.unlockWithoutPasscodeAtStart()
    }

    /// On a chip, before a server says it is ready: the kept salted session (`Engine.prepareKeptSession`).
    /// - Returns: the line to log, nil when there was nothing to do.
    package func prepareKeptSession() async throws(KeychainError) -> String? {
        try await engine.prepareKeptSession()
    }

    /// After "ready", on a chip: the wrapping keys' contexts saved, one key per engine call so that
    /// requests are served between two, at most `limit` keys. - Returns: the line to log, nil when
    /// there was nothing to do.
    package func saveWrappingKeyContexts(limit: Int) async -> String? {
        let began = ContinuousClock.now
        var saved = 0
        do throws(KeychainError) {
            let blobs = try await engine.wrappingKeysToSave(limit: limit)
            guard !blobs.isEmpty else { return nil }
            for blob in blobs where try await engine.saveContext(of: blob) { saved += 1 }
            return "keychaind: saved the contexts of \(saved) wrapping keys in \(ContinuousClock.now - began)"
        } catch {
            return "keychaind: saving the wrapping keys' contexts stopped after \(saved) (\(error.code.rawValue): \(error.message)); "
                + "the others are loaded when read"
        }
    }

    package func serving(_ caller: Caller) -> any KeychainService {
        var service = LocalService(engine: engine, configuration: configuration)
        service.caller = caller
        return service
    }

    private func checked() throws(KeychainError) -> Engine {
        if let refusal { throw refusal }
        return engine
    }

    package func setItem(_ key: String, _ value: SecureBytes, options call: SetItemOptions?, in storage: StorageRef) async throws(KeychainError) {
        let engine = try checked()
        let protection = try storage.options.resolved(for: call)
        if storage.options.android.keyStorage == .strongbox {
            guard let uri = configuration.pkcs11URI else {
                // Never store with less protection than asked: without a token there is no strongbox.
                throw KeychainError(.unsupported, "keyStorage 'strongbox' needs a PKCS#11 token: set KEYCHAIN_PKCS11_URI or --pkcs11-uri")
            }
            switch protection.accessControl {
            case .none, .passcode:
                try await engine.set(value, service: storage.storeName, key: key, protection: protection, label: call?.label,
                                     backend: TokenBackend(uri: uri), tag: protection.storageTag + TokenSession.tagSuffix)
            default:
                // The token has no fingerprint reader: refuse rather than store with less protection.
                throw KeychainError(.unsupported, "accessControl '\(protection.accessControl.rawValue)' is not available with keyStorage 'strongbox': use 'none' or 'passcode' (the token's PIN)")
            }
            return
        }
        try await engine.set(value, service: storage.storeName, key: key, protection: protection, label: call?.label,
                             backend: TPMBackend(readerDirectory: configuration.readerDirectory), tag: protection.storageTag)
    }

    package func getItem(_ key: String, options call: GetItemOptions?, in storage: StorageRef,
                         authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes? {
        let engine = try checked()
        // No hop to the engine's thread and back for a read that needs neither.
        if let warm = warmItem(key, in: storage) { return warm.value }
        return try await engine.get(service: storage.storeName, key: key,
                                    context: readContext(storage, prompt: storage.options.resolvedPrompt(for: call), authenticator))
    }

    package func warmItem(_ key: String, in storage: StorageRef) -> WarmRead? {
        guard refusal == nil else { return nil }
        let context = readContext(storage, prompt: Prompt(), nil)
        return engine.warmGet(service: storage.storeName, key: key) { context.window(stored: $0) }
    }

    /// The prompt is the storage's, then the call's, field by field (seed: createKeychain). An access
    /// group's items open no window: one member's prompt would open them for every other member.
    private func readContext(_ storage: StorageRef, prompt: Prompt, _ authenticator: (any Authenticator)?) -> Engine.ReadContext {
        Engine.ReadContext(prompt: prompt, authValidity: storage.options.authValidity, authenticator: authenticator,
                           readerDirectory: configuration.readerDirectory, pkcs11URI: configuration.pkcs11URI,
                           windowAllowed: !storage.scope.isGroup, caller: caller)
    }

    package func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool {
        try await checked().has(service: storage.storeName, key: key)
    }

    package func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError) {
        try await checked().remove(service: storage.storeName, key: key)
    }

    package func clear(_ storage: StorageRef) async throws(KeychainError) {
        try await checked().clear(service: storage.storeName, pkcs11URI: configuration.pkcs11URI)
    }

    package func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await checked().keys(service: storage.storeName)
    }

    package func allServices(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await checked().services(prefix: storage.scope.storePrefix)
    }

    package func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo? {
        guard var info = try await checked().info(service: storage.storeName, key: key) else { return nil }
        info.service = storage.service  // as the caller named it
        return info
    }

    package func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck {
        if storage.options.android.keyStorage == .strongbox {
            // The token's user PIN is the passcode; the token has no biometrics.
            guard let uri = configuration.pkcs11URI else { return .init(available: false, reason: .unsupported) }
            guard value == .none || value == .passcode else { return .init(available: false, reason: .unsupported) }
            return await engine.tokenCanKeepKeys(uri: uri)
        }
        return try await engine.canUse(value, readerDirectory: configuration.readerDirectory)
    }

    // MARK: The device

    package func endWindows(in storage: StorageRef) async throws(KeychainError) {
        try await checked().endWindows(service: storage.storeName)
    }

    private func readerDirectory() throws(KeychainError) -> String {
        guard let dir = configuration.readerDirectory else {
            throw KeychainError(.biometryNotAvailable, "This device has no fingerprint reader (KEYCHAIN_READER=none)")
        }
        return dir
    }

    package func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {
        try await checked().enroll(name, passcode: passcode, readerDirectory: try readerDirectory())
    }
    package func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await checked().removeFinger(name, passcode: passcode, readerDirectory: try readerDirectory())
    }
    package func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await checked().deleteReader(passcode: passcode, readerDirectory: try readerDirectory())
    }
    package func enrolledFingers() async throws(KeychainError) -> [String] {
        try await checked().enrolledFingers(readerDirectory: try readerDirectory())
    }
    package func biometryTypes() -> [BiometryType] { configuration.readerDirectory == nil ? [] : [.fingerprint] }
    package func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        try await engine.canUse(value, readerDirectory: configuration.readerDirectory)
    }
    package func initialize() async throws(KeychainError) -> DeviceStatus { try await checked().initialize() }
    package func status() async throws(KeychainError) -> DeviceStatus {
        try await checked().status(readerDirectory: configuration.readerDirectory)
    }
    package func resetTokenPINTries() async throws(KeychainError) { try await checked().resetTokenPINTries() }
    package func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        guard let uri = configuration.pkcs11URI else { return nil }
        return try await checked().tokenStatus(uri: uri)
    }
    package func unlock(passcode: SecureBytes?) async throws(KeychainError) {
        try await checked().unlock(passcode: passcode, readerDirectory: configuration.readerDirectory, caller: caller)
    }
    package func lock() async throws(KeychainError) { try await checked().lock() }
    package func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError) {
        // Removing it ends the reader's fingers too (DeviceLockOperations).
        try await checked().setPasscode(old: old, new: new, readerDirectory: new == nil ? configuration.readerDirectory : nil)
    }
    package func resetPasscodeTries() async throws(KeychainError) { try await checked().resetPasscodeTries() }
    package func takeTPMCommandCount() async -> Int { await engine.drainCommandCount() }
    package func dropCaches() async { await engine.dropCaches() }
    package func identity() async throws(KeychainError) -> DeviceIdentity { try await checked().identity() }
    package func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?,
                              in scope: ItemScope) async throws(KeychainError) -> ImportOutcome {
        try await checked().importBundle(bundle, passcode: passcode, readerDirectory: configuration.readerDirectory, scope: scope)
    }
}
