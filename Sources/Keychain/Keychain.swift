import Foundation
import KeychainWire
/// `SecureBytes` is part of the API (passcodes, values): `import Keychain` brings it.
@_exported import SecureMemory

/// A storage: one service and its defaults for every call, over the TPM-backed store (seed: `createKeychain`).
///
/// Cheap to make and touches nothing until the first call; two storages of the same service see the
/// same items. Every method is async and runs on the store's engine, never on the caller's thread.
public struct Keychain: Sendable {
    /// The storage's options, checked.
    public let options: KeychainOptions
    /// The service its items belong to (the options' service, or the configuration's application identifier).
    public let service: String
    public let configuration: KeychainConfiguration
    /// This process's engine of the store; nil through keychaind (`configuration.daemonSocket`).
    private let local: Engine?
    private let remote: DaemonClient?
    /// Through keychaind: the options as each call sends them (service resolved), encoded once.
    private let wireOptions: [UInt8]
    /// Before every service name in the store: keychaind's per-uid or per-group part ("" in-process).
    let namespace: String

    /// - Throws: `INVALID_ARGUMENT` with the seed's message for options that break a rule.
    public init(options: KeychainOptions = .init(), configuration: KeychainConfiguration = .default) throws(KeychainError) {
        try self.init(options: options, configuration: configuration, namespace: "")
    }

    /// - Parameter engine: keychaind's own engine (it holds it), spared the lookup by store path.
    init(options: KeychainOptions, configuration: KeychainConfiguration, namespace: String, engine: Engine? = nil) throws(KeychainError) {
        self.options = try options.validated()
        guard let service = options.service ?? configuration.applicationIdentifier else { throw ApplicationIdentity.missing }
        self.service = service
        if options.service == nil { _ = try KeychainOptions(service: service).validated() }  // a bad KEYCHAIN_APP_ID
        self.configuration = configuration
        self.namespace = namespace
        if let socket = configuration.daemonSocket {
            var resolved = self.options
            resolved.service = service
            (local, remote, wireOptions) = (nil, DaemonClient(socketPath: socket), WireJSON.encode(resolved))
            return
        }
        wireOptions = []
        if let engine {
            (local, remote) = (engine, nil)
            return
        }
        let shared = Engine.shared(for: configuration)
        if let refusal = shared.refusal { throw refusal }
        (local, remote) = (shared.engine, nil)
    }

    /// Every in-process path checks `remote` first.
    var engine: Engine { local! }

    /// keychaind's namespace of an access group's shared items (DaemonServer): `group:NAME/`.
    static let groupNamespacePrefix = "group:"

    /// The service's name in the store: keychaind puts its caller's namespace before it.
    var storeService: String { namespace + service }

    /// One call through keychaind: the options (with the service resolved here), the key, the rest.
    private func daemon(_ op: WireOp, key: String? = nil, authenticator: (any Authenticator)? = nil,
                        _ build: (inout WireMessage) -> Void = { _ in }) async throws(KeychainError) -> WireMessage {
        try await remote!.call(op, { message in
            message.add(WireTag.options, wireOptions)
            message.add(WireTag.key, key)
            build(&message)
        }, authenticator: authenticator)
    }

    /// The largest value `setItem` stores, in bytes (16 MiB); read input in a bounded way up to it.
    public static let maxValueLength = Engine.maxValueLength

    /// Stores `value` under `key`, replacing any value atomically; never prompts.
    public func setItem(_ key: String, _ value: String, options call: SetItemOptions? = nil) async throws(KeychainError) {
        try await setItem(key, SecureBytes(copying: Array(value.utf8)), options: call)
    }

    public func setItem(_ key: String, _ value: Data, options call: SetItemOptions? = nil) async throws(KeychainError) {
        try await setItem(key, SecureBytes(copying: value), options: call)
    }

    public func setItem(_ key: String, _ value: SecureBytes, options call: SetItemOptions? = nil) async throws(KeychainError) {
        if remote != nil {
            _ = try await daemon(.setItem, key: key) { message in
                message.add(WireTag.value, value.withUnsafeBytes { Array($0) })
                call?.add(to: &message)
            }
            return
        }
        let protection = try options.resolved(for: call)
        if options.android.keyStorage == .strongbox {
            guard let uri = configuration.pkcs11URI else {
                // Never store with less protection than asked: without a token there is no strongbox.
                throw KeychainError(.unsupported, "keyStorage 'strongbox' needs a PKCS#11 token: set KEYCHAIN_PKCS11_URI or --pkcs11-uri")
            }
            switch protection.accessControl {
            case .none, .passcode:
                try await engine.set(value, service: storeService, key: key, protection: protection, label: call?.label,
                                     backend: TokenBackend(uri: uri), tag: protection.storageTag + TokenSession.tagSuffix)
            default:
                // The token has no fingerprint reader: refuse rather than store with less protection.
                throw KeychainError(.unsupported, "accessControl '\(protection.accessControl.rawValue)' is not available with keyStorage 'strongbox': use 'none' or 'passcode' (the token's PIN)")
            }
            return
        }
        try await engine.set(value, service: storeService, key: key, protection: protection, label: call?.label,
                             backend: TPMBackend(readerDirectory: configuration.readerDirectory), tag: protection.storageTag)
    }

    /// The value as UTF-8 text, or nil when there is none.
    /// - Throws: `INVALID_ARGUMENT` when the stored bytes are not UTF-8 (read them with `getData`).
    public func getItem(_ key: String, options call: GetItemOptions? = nil) async throws(KeychainError) -> String? {
        guard let bytes = try await getSecureBytes(key, options: call) else { return nil }
        guard let text = bytes.withUnsafeBytes({ String(validating: $0.bindMemory(to: UInt8.self), as: UTF8.self) }) else {
            throw KeychainError.invalidArgument("Item '\(key)' holds bytes that are not UTF-8 text: read it with getData")
        }
        return text
    }

    /// The value's bytes, or nil when there is none.
    public func getData(_ key: String, options call: GetItemOptions? = nil) async throws(KeychainError) -> Data? {
        guard let bytes = try await getSecureBytes(key, options: call) else { return nil }
        return bytes.withUnsafeBytes { Data($0) }
    }

    /// The value in locked memory, wiped when released: for keys and tokens that should not linger.
    public func getSecureBytes(_ key: String, options call: GetItemOptions? = nil) async throws(KeychainError) -> SecureBytes? {
        if remote != nil {
            let authenticator = configuration.authenticator
            var reply = try await daemon(.getItem, key: key, authenticator: authenticator) { message in
                message.add(WireTag.prompt, call?.prompt.map { WireJSON.encode($0) })
                message.add(WireTag.attempts, authenticator.map { UInt64(max(1, $0.attemptsPerRead)) })
            }
            defer { reply.wipe() }
            return reply.bytes(WireTag.resultBytes).map { SecureBytes(copying: $0) }
        }
        return try await engine.get(service: storeService, key: key, context: readContext(call))
    }

    /// The prompt is the storage's, then the call's, field by field (seed: createKeychain).
    func readContext(_ call: GetItemOptions?) -> Engine.ReadContext {
        .init(prompt: options.resolvedPrompt(for: call), authValidity: options.authValidity,
              authenticator: configuration.authenticator, readerDirectory: configuration.readerDirectory,
              pkcs11URI: configuration.pkcs11URI, windowAllowed: !namespace.hasPrefix(Self.groupNamespacePrefix),
              caller: configuration.caller)
    }

    /// Whether this storage's device can protect an item with `value` now; never prompts, never writes.
    /// - Throws: `HARDWARE_UNAVAILABLE` when keychaind cannot be reached: the service is down, which
    ///   is worth a retry, not an answer.
    public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        if remote != nil {
            return try await daemon(.storageCanUse) { $0.add(WireTag.accessControl, value.rawValue) }.result(AccessControlCheck.self)
        }
        if options.android.keyStorage == .strongbox {
            // The token's user PIN is the passcode; the token has no biometrics.
            guard let uri = configuration.pkcs11URI else { return .init(available: false, reason: .unsupported) }
            guard value == .none || value == .passcode else { return .init(available: false, reason: .unsupported) }
            return await engine.tokenCanKeepKeys(uri: uri)
        }
        return await engine.canUse(value, readerDirectory: configuration.readerDirectory)
    }

    /// Whether an item exists; never prompts and never touches the TPM.
    public func hasItem(_ key: String) async throws(KeychainError) -> Bool {
        if remote != nil { return try await daemon(.hasItem, key: key).resultBool() }
        return try await engine.has(service: storeService, key: key)
    }

    /// Removes an item; removing an absent one is not an error.
    public func removeItem(_ key: String) async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.removeItem, key: key); return }
        try await engine.remove(service: storeService, key: key)
    }

    /// Removes every item of this storage's service and its wrapping keys; never prompts.
    public func clear() async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.clear); return }
        try await engine.clear(service: storeService, pkcs11URI: configuration.pkcs11URI)
    }

    /// The keys of this storage's items, sorted; never prompts and never touches the TPM.
    public func getAllKeys() async throws(KeychainError) -> [String] {
        if remote != nil { return try await daemon(.allKeys).result([String].self) }
        return try await engine.keys(service: storeService)
    }

    /// What is known of an item without reading its value: protection, label, dates, security level.
    public func getItemInfo(_ key: String) async throws(KeychainError) -> ItemInfo? {
        if remote != nil {
            let reply = try await daemon(.itemInfo, key: key)
            return reply.bytes(WireTag.resultJSON) == nil ? nil : try reply.result(ItemInfo.self)
        }
        return try await engine.info(service: storeService, key: key)
    }
}

/// Makes a storage (seed: `createKeychain(options)`); the options are checked at once.
public func createKeychain(_ options: KeychainOptions = .init(),
                           configuration: KeychainConfiguration = .default) throws(KeychainError) -> Keychain {
    try Keychain(options: options, configuration: configuration)
}

/// The default storage: the application identifier as its service (`KEYCHAIN_APP_ID`, the systemd
/// unit, the desktop file id: `KeychainConfiguration.applicationIdentifier`), `afterFirstUnlock`, no
/// access control. Made at each use from `KeychainConfiguration.default` (cheap), so a test's
/// `taskDefault` redirects it too.
/// - Throws: `INVALID_ARGUMENT` when the process has no application identifier (or a bad `KEYCHAIN_APP_ID`).
public var keychain: Keychain {
    get throws(KeychainError) {
        let storage = try Keychain()
        if storage.configuration.daemonSocket == nil {
            Engine.keepForProcess(storage.engine)  // made at each use: its caches must outlive the value
        }
        return storage
    }
}

/// What `getItemInfo` returns.
public struct ItemInfo: Sendable, Hashable, Codable {
    public enum SecurityLevel: String, Sendable, Hashable, Codable {
        /// Sealed by a hardware TPM.
        case hardwareTPM
        /// Sealed by a software TPM (swtpm): no protection against someone who can read its state files.
        case softwareTPM
        /// Its wrapping key is on a PKCS#11 token (`keyStorage: 'strongbox'`); SoftHSM2 is software too.
        case pkcs11Token
    }
    public var key: String
    public var service: String
    public var accessible: Accessible
    public var accessControl: AccessControl
    public var label: String?
    public var created: Date
    public var modified: Date
    public var securityLevel: SecurityLevel
    /// The label of the token that holds its key (`pkcs11Token`), when known.
    public var token: String?
}

/// The device lock as the TPM sees it.
public struct DeviceStatus: Sendable, Hashable, Codable {
    public enum LockState: String, Sendable, Hashable, Codable { case beforeFirstUnlock, locked, unlocked }
    public var passcodeSet: Bool
    public var lockState: LockState
    public var securityLevel: ItemInfo.SecurityLevel
    public var tpm: String
    /// Whether the TPM's owner and lockout authorizations are set (TPM_PT_PERMANENT): empty ones let
    /// anyone with TPM access get round the passcode or clear the TPM (see `warnings`).
    public var ownerAuthorizationSet: Bool
    public var lockoutAuthorizationSet: Bool
    /// The persistent storage root key compared with the one this store pinned at provisioning.
    public enum StorageRootKey: String, Sendable, Hashable, Codable { case pinned, missing, replaced }
    public var storageRootKey: StorageRootKey
    /// What is weak or wrong, in words: empty authorizations and what they cost, a missing or replaced SRK.
    public var warnings: [String]
}

/// The device: its passcode and lock, shared by every storage of a store.
public struct KeychainDevice: Sendable {
    /// This process's engine of the store; nil through keychaind (`configuration.daemonSocket`).
    private let local: Engine?
    private let remote: DaemonClient?
    /// Why this configuration cannot use the store's engine; thrown by the first call that can throw.
    private let refusal: KeychainError?
    let configuration: KeychainConfiguration
    public init(configuration: KeychainConfiguration = .default) {
        if let socket = configuration.daemonSocket {
            (local, remote, refusal) = (nil, DaemonClient(socketPath: socket), nil)
        } else {
            let shared = Engine.shared(for: configuration)
            (local, remote, refusal) = (shared.engine, nil, shared.refusal)
        }
        self.configuration = configuration
    }

    /// The store's engine in this process; through keychaind, calls it does not serve (backup and
    /// restore of the whole store) are refused rather than run on a store this process does not own.
    var engine: Engine {
        get throws(KeychainError) {
            if let refusal { throw refusal }
            guard let local else {
                throw KeychainError(.unsupported, "The keychain service does not serve this call: run it where the store is, as "
                                    + "the service's user (keychainctl --direct --store <the service's store> …)")
            }
            return local
        }
    }
    private var sharedEngine: Engine { local! }

    private func daemon(_ op: WireOp, _ build: (inout WireMessage) -> Void = { _ in }) async throws(KeychainError) -> WireMessage {
        try await remote!.call(op, build)
    }

    /// Asks the owner for the device passcode (the authenticator, passcode only) and proves it to the
    /// TPM: this ends a biometric lockout (seed: BiometricsVault's `reauthenticateOwner`).
    public func reauthenticateOwner(prompt: Prompt = .init(title: "Enter the device passcode")) async throws(KeychainError) {
        guard let authenticator = configuration.authenticator else {
            throw KeychainError(.interactionNotAllowed, "Reauthenticating needs the user, and no authenticator can ask")
        }
        try await authenticator.ask(prompt: prompt, methods: [.passcode], service: "", key: "",
                                    unnamedFailure: "wrong passcode") { answer throws(KeychainError) -> PromptOutcome<Void> in
            guard case .passcode(let pin) = answer else { return .failed("enter the passcode") }
            do throws(KeychainError) {
                try await unlock(passcode: pin)
                return .opened(())
            } catch where error.code == .authenticationFailed {
                return .failed("wrong passcode")
            }
        }
    }

    // MARK: The fingerprint reader

    /// Enrolls a finger on the simulated reader; needs the device passcode when one is set.
    public func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {
        if remote != nil {
            _ = try await daemon(.enrollFinger) { $0.add(WireTag.finger, name); $0.add(WireTag.passcode, passcode?.wireBytes) }
            return
        }
        try await engine.enroll(name, passcode: passcode, readerDirectory: try readerDirectory())
    }
    /// Removes a finger; needs the device passcode when one is set. CurrentSet items are invalidated.
    @discardableResult
    public func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        if remote != nil {
            return try await daemon(.removeFinger) { $0.add(WireTag.finger, name); $0.add(WireTag.passcode, passcode?.wireBytes) }.resultBool()
        }
        return try await engine.removeFinger(name, passcode: passcode, readerDirectory: try readerDirectory())
    }
    /// Deletes the fingerprint reader (its fingers and its TPM key); needs the device passcode when
    /// one is set. - Returns: false when there was no reader.
    @discardableResult
    public func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        if remote != nil { return try await daemon(.deleteReader) { $0.add(WireTag.passcode, passcode?.wireBytes) }.resultBool() }
        return try await engine.deleteReader(passcode: passcode, readerDirectory: try readerDirectory())
    }
    public func enrolledFingers() async throws(KeychainError) -> [String] {
        if remote != nil { return try await daemon(.enrolledFingers).result([String].self) }
        return try FingerprintReader(directory: try readerDirectory()).enrolled
    }
    /// The biometric sensors present: a fingerprint reader when one is configured.
    /// Through keychaind, the daemon's reader (asked with a blocking call; [] when it does not answer).
    public func biometryTypes() -> [BiometryType] {
        if let remote { return remote.callBlocking(.biometryTypes).flatMap { try? $0.result([BiometryType].self) } ?? [] }
        return configuration.readerDirectory == nil ? [] : [.fingerprint]
    }
    /// - Throws: `HARDWARE_UNAVAILABLE` when keychaind cannot be reached.
    public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        if remote != nil {
            return try await daemon(.deviceCanUse) { $0.add(WireTag.accessControl, value.rawValue) }.result(AccessControlCheck.self)
        }
        return await sharedEngine.canUse(value, readerDirectory: configuration.readerDirectory)
    }

    private func readerDirectory() throws(KeychainError) -> String {
        guard let dir = configuration.readerDirectory else {
            throw KeychainError(.biometryNotAvailable, "This device has no fingerprint reader (KEYCHAIN_READER=none)")
        }
        return dir
    }

    /// Closes every store this process opened, so committed data is folded from SQLite's write-ahead
    /// log into `keychain.db`; a later call opens them again. Call it before the process exits.
    public static func closeStores() async { await Engine.closeAll() }

    /// Provisions the TPM (SRK, device-lock indices) and the store when needed, and reports the state.
    /// It never changes the TPM's hierarchy authorizations: `status().warnings` says when they are empty.
    @discardableResult
    public func initialize() async throws(KeychainError) -> DeviceStatus {
        if remote != nil { return try await daemon(.initialize).result(DeviceStatus.self) }
        return try await engine.initialize()
    }

    /// Provisions as `initialize()`, then takes ownership of the TPM as a provisioning tool does: each
    /// empty owner or lockout authorization with a file in `ownership` is set to 32 random bytes,
    /// written there first (`hex:…`, 0600, never overwritten); an empty one without a file is refused
    /// with `INVALID_ARGUMENT` unless `ownership.allowEmpty`. The embedded software TPM is taken on
    /// its first start without asking (its files are in `<store>/swtpm/`).
    @discardableResult
    public func initialize(takingOwnership ownership: Ownership) async throws(KeychainError) -> DeviceStatus {
        if remote != nil {
            // The authorization files are the TPM owner's, on the daemon's side: provision there.
            throw KeychainError(.unsupported, "Taking TPM ownership is not done through the keychain service: run "
                                + "'keychainctl --direct --store <the service's store> init …' as the service's user")
        }
        _ = try await engine.initialize()
        try await engine.takeOwnership(ownership)
        return try await engine.status()
    }
    public func status() async throws(KeychainError) -> DeviceStatus {
        if remote != nil { return try await daemon(.status).result(DeviceStatus.self) }
        return try await engine.status()
    }
    /// Resets this library's count of wrong token PINs (SoftHSM2-like tokens keep none themselves).
    public func resetTokenPINTries() async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.resetTokenPINTries); return }
        try await engine.resetTokenPINTries()
    }

    /// The configured PKCS#11 token: label, manufacturer, model, PIN state flags.
    public func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        if remote != nil {
            let reply = try await daemon(.tokenStatus)
            return reply.bytes(WireTag.resultJSON) == nil ? nil : try reply.result(TokenStatus.self)
        }
        guard let uri = configuration.pkcs11URI else { return nil }
        return try await engine.tokenStatus(uri: uri)
    }

    /// Unlocks with the passcode, checked by the TPM (wrong ones count toward its limit).
    public func unlock(passcode: SecureBytes?) async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.unlock) { $0.add(WireTag.passcode, passcode?.wireBytes) }; return }
        try await engine.unlock(passcode: passcode, readerDirectory: configuration.readerDirectory, caller: configuration.caller)
    }
    /// Locks: `whenUnlocked*` items become `INTERACTION_NOT_ALLOWED` until the next unlock.
    public func lock() async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.lock); return }
        try await engine.lock()
    }
    public func setPasscode(_ passcode: SecureBytes) async throws(KeychainError) {
        try checkPasscode(passcode)
        if remote != nil { _ = try await daemon(.setPasscode) { $0.add(WireTag.newPasscode, passcode.wireBytes) }; return }
        try await engine.setPasscode(old: nil, new: passcode)
    }
    public func changePasscode(from old: SecureBytes, to new: SecureBytes) async throws(KeychainError) {
        try checkPasscode(new)
        if remote != nil {
            _ = try await daemon(.changePasscode) { $0.add(WireTag.passcode, old.wireBytes); $0.add(WireTag.newPasscode, new.wireBytes) }
            return
        }
        try await engine.setPasscode(old: old, new: new)
    }
    /// Removes the passcode; `whenPasscodeSetThisDeviceOnly` items are destroyed, as on iOS, the
    /// enrolled fingers are removed, and every item behind an access control is `KEY_INVALIDATED` at
    /// its next read (and removed), as on Android: the TPM no longer opens their keys.
    public func removePasscode(current: SecureBytes) async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.removePasscode) { $0.add(WireTag.passcode, current.wireBytes) }; return }
        try await engine.setPasscode(old: current, new: nil, readerDirectory: configuration.readerDirectory)
    }
    /// Resets the TPM's count of wrong passcodes (needs the owner authorization of the configuration).
    public func resetPasscodeTries() async throws(KeychainError) {
        if remote != nil { _ = try await daemon(.resetPasscodeTries); return }
        try await engine.resetPasscodeTries()
    }

    /// TPM commands this process sent since the last call (for benchmarks); through keychaind, the
    /// daemon's (all its callers').
    public func takeTPMCommandCount() async -> Int {
        if remote != nil { return (try? await daemon(.takeTPMCommandCount).uint(WireTag.resultNumber)).flatMap { $0 }.map(Int.init) ?? 0 }
        return await sharedEngine.drainCommandCount()
    }
    /// Forgets unsealed keys held in memory, as a new process would start (for benchmarks and tests);
    /// through keychaind, the daemon's (root or `admin` only).
    public func dropCaches() async {
        if remote != nil { _ = try? await daemon(.dropCaches); return }
        await sharedEngine.dropCaches()
    }

    private func checkPasscode(_ passcode: SecureBytes) throws(KeychainError) {
        // The PIN index's authValue holds at most one SHA-256 digest: 32 bytes.
        guard (4...32).contains(passcode.count) else {
            throw KeychainError.invalidArgument("Invalid passcode: expected 4 to 32 bytes, got \(passcode.count)")
        }
    }
}

extension SecureBytes {
    /// The bytes for a request field (the message is wiped once sent).
    var wireBytes: [UInt8] { withUnsafeBytes { Array($0) } }
}
