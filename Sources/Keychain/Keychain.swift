import FoundationEssentials
import KeychainWire
import Synchronization
/// `SecureBytes` is part of the API (passcodes, values): `import Keychain` brings it.
@_exported import SecureMemory
@_exported import KeychainCore
@_exported import KeychainEngine

/// A storage: one service and its defaults for every call, over the TPM-backed store (seed: `createKeychain`).
///
/// Cheap to make and touches nothing until the first call; two storages of the same service see the
/// same items. Every method is async and runs on the store's engine, never on the caller's thread.
public struct Keychain: Sendable {
    /// The storage's options, checked.
    public var options: KeychainOptions { storage.options }
    /// The service its items belong to (the options' service, or the configuration's application identifier).
    public var service: String { storage.service }
    public let configuration: KeychainConfiguration
    /// The engine in this process, or keychaind (`configuration.daemonSocket`).
    let backing: any KeychainService
    /// This storage's scope, service and checked options, as every call passes them.
    let storage: StorageRef

    /// - Throws: `INVALID_ARGUMENT` with the seed's message for options that break a rule.
    public init(options: KeychainOptions = .init(), configuration: KeychainConfiguration = .default) throws(KeychainError) {
        let daemon = configuration.daemonSocket.map { DaemonClient(socketPath: $0) }
        storage = try StorageRef(scope: .process, options: options, defaultService: configuration.applicationIdentifier,
                                 forWire: daemon != nil)
        self.configuration = configuration
        if let daemon {
            backing = daemon
            return
        }
        let local = LocalService(configuration: configuration)
        if let refusal = local.refusal { throw refusal }
        backing = local
    }

    /// This process's engine of the store, nil through keychaind (tests).
    var engine: Engine? { (backing as? LocalService)?.engine }

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
        try await backing.setItem(key, value, options: call, in: storage)
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
        try await backing.getItem(key, options: call, in: storage, authenticator: configuration.authenticator)
    }

    /// Reads of several items, each as `getSecureBytes` would answer it, in the order of `keys`;
    /// through keychaind one exchange (a few for a batch past `WireList.maxKeys` or its reply budget).
    /// - Throws: only what fails the whole batch (keychaind cannot be reached).
    package func getSecureBytes(_ keys: [String]) async throws(KeychainError) -> [ItemRead] {
        try await backing.getItems(keys, in: storage, authenticator: configuration.authenticator)
    }

    /// The read `getSecureBytes` would answer at once (this process holds the item's key and may use
    /// it: no TPM command, no prompt), answered on the calling thread; nil when the read needs the
    /// engine (then call `getSecureBytes`). For a caller that serves on a thread of its own and
    /// would otherwise hop to a task and back for every read (the Secret Service's bus thread).
    package func warmRead(_ key: String) -> WarmRead? {
        backing.warmItem(key, in: storage)
    }

    /// Whether this storage's device can protect an item with `value` now; never prompts, never writes.
    /// - Throws: `HARDWARE_UNAVAILABLE` when keychaind cannot be reached: the service is down, which
    ///   is worth a retry, not an answer.
    public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        await configuration.promptReach(for: value, try await backing.canUseAccessControl(value, in: storage))
    }

    /// Whether an item exists; never prompts and never touches the TPM.
    public func hasItem(_ key: String) async throws(KeychainError) -> Bool {
        try await backing.hasItem(key, in: storage)
    }

    /// Removes an item; removing an absent one is not an error.
    public func removeItem(_ key: String) async throws(KeychainError) {
        try await backing.removeItem(key, in: storage)
    }

    /// Removes every item of this storage's service and its wrapping keys; never prompts.
    public func clear() async throws(KeychainError) {
        try await backing.clear(storage)
    }

    /// Ends the authValidity window of this storage's items: the next read of one behind an access
    /// control asks the user again, in this process and in every other (the key this process keeps
    /// for the window is forgotten, the TPM tickets the store keeps for it deleted). Never prompts.
    public func endAuthenticationWindow() async throws(KeychainError) {
        try await backing.endWindows(in: storage)
    }

    /// The keys of this storage's items, sorted; never prompts and never touches the TPM.
    public func getAllKeys() async throws(KeychainError) -> [String] {
        try await backing.allKeys(in: storage)
    }

    /// The services of this storage's scope that hold items, sorted (keychaind's `credential ls` of
    /// every unit); never prompts and never touches the TPM.
    package func allServicesOfScope() async throws(KeychainError) -> [String] {
        try await backing.allServices(in: storage)
    }

    /// What is known of an item without reading its value: protection, label, dates, security level.
    public func getItemInfo(_ key: String) async throws(KeychainError) -> ItemInfo? {
        try await backing.itemInfo(key, in: storage)
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
        // Made at each use: its caches must outlive the value.
        if let local = storage.backing as? LocalService { Engine.keepForProcess(local.engine) }
        return storage
    }
}

/// The device: its passcode and lock, shared by every storage of a store; in this process or through
/// keychaind alike. What keychaind does not serve is `KeychainAdministration`'s.
public struct KeychainDevice: Sendable {
    /// The engine in this process, or keychaind (`configuration.daemonSocket`).
    let backing: any KeychainService
    let configuration: KeychainConfiguration
    public init(configuration: KeychainConfiguration = .default) {
        backing = configuration.daemonSocket.map { DaemonClient(socketPath: $0) } ?? LocalService(configuration: configuration)
        self.configuration = configuration
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

    /// The changes this process made that can change `canUseAccessControl`'s answer (a finger
    /// enrolled or removed, the reader deleted, the passcode set or removed; attempted ones too),
    /// so a cache of that answer (the vault's) knows it is out of date. Other processes' changes
    /// are not counted: such a cache also ends on a clock.
    package static var availabilityChanges: Int { changes.load(ordering: .acquiring) }
    private static let changes = Atomic<Int>(0)
    private static func changedAvailability() { changes.add(1, ordering: .releasing) }

    /// Enrolls a finger on the simulated reader; needs the device passcode when one is set.
    public func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {
        defer { Self.changedAvailability() }
        try await backing.enrollFinger(name, passcode: passcode)
    }
    /// Removes a finger; needs the device passcode when one is set. CurrentSet items are invalidated.
    @discardableResult
    public func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        defer { Self.changedAvailability() }
        return try await backing.removeFinger(name, passcode: passcode)
    }
    /// Deletes the fingerprint reader (its fingers and its TPM key); needs the device passcode when
    /// one is set. - Returns: false when there was no reader.
    @discardableResult
    public func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        defer { Self.changedAvailability() }
        return try await backing.deleteReader(passcode: passcode)
    }
    public func enrolledFingers() async throws(KeychainError) -> [String] {
        try await backing.enrolledFingers()
    }
    /// The biometric sensors present: a fingerprint reader when one is configured.
    /// Through keychaind, the daemon's reader (asked with a blocking call; [] when it does not answer).
    public func biometryTypes() -> [BiometryType] { backing.biometryTypes() }
    /// - Throws: `HARDWARE_UNAVAILABLE` when keychaind cannot be reached.
    public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        await configuration.promptReach(for: value, try await backing.canUseAccessControl(value))
    }

    /// Closes every store this process opened, so committed data is folded from SQLite's write-ahead
    /// log into `keychain.db`; a later call opens them again. Call it before the process exits.
    public static func closeStores() async { await Engine.closeAll() }

    /// Provisions the TPM (SRK, device-lock indices) and the store when needed, and reports the state.
    /// It never changes the TPM's hierarchy authorizations: `status().warnings` says when they are empty.
    @discardableResult
    public func initialize() async throws(KeychainError) -> DeviceStatus {
        try await backing.initialize()
    }

    public func status() async throws(KeychainError) -> DeviceStatus {
        try await backing.status()
    }
    /// Resets this library's count of wrong token PINs (SoftHSM2-like tokens keep none themselves).
    public func resetTokenPINTries() async throws(KeychainError) {
        try await backing.resetTokenPINTries()
    }

    /// The configured PKCS#11 token: label, manufacturer, model, PIN state flags.
    public func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        try await backing.tokenStatus()
    }

    /// Unlocks with the passcode, checked by the TPM (wrong ones count toward its limit).
    public func unlock(passcode: SecureBytes?) async throws(KeychainError) {
        try await backing.unlock(passcode: passcode)
    }
    /// Locks: `whenUnlocked*` items become `INTERACTION_NOT_ALLOWED` until the next unlock.
    public func lock() async throws(KeychainError) {
        try await backing.lock()
    }
    public func setPasscode(_ passcode: SecureBytes) async throws(KeychainError) {
        try passcode.checkAsNewPasscode()
        defer { Self.changedAvailability() }
        try await backing.setPasscode(old: nil, new: passcode)
    }
    public func changePasscode(from old: SecureBytes, to new: SecureBytes) async throws(KeychainError) {
        try new.checkAsNewPasscode()
        try await backing.setPasscode(old: old, new: new)
    }
    /// Removes the passcode; `whenPasscodeSetThisDeviceOnly` items are destroyed, as on iOS, the
    /// enrolled fingers are removed, and every item behind an access control is `KEY_INVALIDATED` at
    /// its next read (and removed), as on Android: the TPM no longer opens their keys.
    public func removePasscode(current: SecureBytes) async throws(KeychainError) {
        defer { Self.changedAvailability() }
        try await backing.setPasscode(old: current, new: nil)
    }
    /// Resets the TPM's count of wrong passcodes (needs the owner authorization of the configuration).
    public func resetPasscodeTries() async throws(KeychainError) {
        try await backing.resetPasscodeTries()
    }

    /// TPM commands this process sent since the last call (for benchmarks); through keychaind, the
    /// daemon's (all its callers').
    public func takeTPMCommandCount() async -> Int { await backing.takeTPMCommandCount() }
    /// Forgets unsealed keys held in memory, as a new process would start (for benchmarks and tests);
    /// through keychaind, the daemon's (root or `admin` only).
    public func dropCaches() async { await backing.dropCaches() }
}
