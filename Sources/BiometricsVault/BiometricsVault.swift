import Foundation
public import Keychain
import Synchronization

/// Biometric sign-in for app and appliance code (seed: BiometricsVault), built only on the public
/// `Keychain` API: the credentials either in a plain keychain item (`keychainSecured`) or behind the
/// fingerprint reader (`biometricsSecured`, `locked`), with every transition of the seed, and the
/// seed's calls as written:
///
/// ```swift
/// let vault = BiometricsVault<Credentials>(key: "biometrics_credentials")
/// switch vault.state {
/// case .keychainSecured(let credentials): signIn(with: credentials)
/// case .locked: let credentials = try await vault.unlockWithBiometrics()   // the prompt
/// default: showSignIn()
/// }
/// ```
///
/// The calls the seed makes synchronous (`init`, `state`, `biometricsAvailable`,
/// `enableKeychainVault(saving:)`, `lock()`, `resetEverything()`) never prompt; they wait for the
/// keychain on a thread of the vault's own, never on Swift's shared pool, so they are safe from any
/// thread, task or actor. Each one costs what its keychain calls cost (a store read and, the first
/// time, one TPM unseal: milliseconds; see docs/performance.md), so call them off a UI thread that
/// must not stall. The calls that may prompt are `async`.
///
/// A transition that is not allowed throws `VaultError` and changes nothing; one that fails in the
/// keychain (a canceled prompt, `KEY_INVALIDATED`) throws that `KeychainError` after the state was
/// settled to match what is stored. When locked, the credentials are not in memory.
public final class BiometricsVault<Credentials: Codable & Sendable>: Sendable {
    public let key: String
    typealias Machine = VaultStateMachine<Credentials>
    private let storages: Result<Storages, KeychainError>
    private let device: KeychainDevice
    /// Nil until the stored state is first read (by `state`, or the first transition).
    private let machine = Mutex<Machine?>(nil)

    private struct Storages: Sendable {
        let plain: Keychain
        let biometric: Keychain
    }

    /// Touches nothing yet: the state is read from the keychain, without a prompt, on first use.
    /// - Parameters:
    ///   - key: the item's name in both storages.
    ///   - service: the plain storage's service; the biometric one is `service + ".biometrics"`.
    ///   - prompt: what the fingerprint prompt says.
    public init(key: String, service: String = "biometrics-vault",
                prompt: Prompt = .init(title: "Unlock your account", cancel: "Use password"),
                configuration: KeychainConfiguration = .default) {
        self.key = key
        device = KeychainDevice(configuration: configuration)
        do throws(KeychainError) {
            storages = .success(Storages(
                plain: try createKeychain(.init(service: service, accessible: .afterFirstUnlockThisDeviceOnly),
                                          configuration: configuration),
                biometric: try createKeychain(.init(service: service + ".biometrics", accessible: .whenUnlockedThisDeviceOnly,
                                                    accessControl: .biometryCurrentSet, prompt: prompt),
                                              configuration: configuration)))
        } catch {
            storages = .failure(error)
        }
    }

    /// The vault's state. The first read asks the keychain what is stored (no prompt); when that
    /// fails (no TPM, before the first unlock) it is `unavailable` and the next read asks again.
    public var state: VaultState<Credentials> { (try? started().state) ?? .unavailable }

    /// Whether the device can protect the credentials with biometrics now.
    public var biometricsAvailable: Bool { (try? started().biometricsAvailable) ?? false }

    /// Asks the device again whether biometrics can be used (after an enrollment, say).
    public func refreshAvailability() async {
        let available = (try? await device.canUseAccessControl(.biometryCurrentSet))?.available ?? false
        _ = try? await startedAsync()
        machine.withLock { $0?.biometricsAvailabilityChanged(available) }
    }

    public func enableKeychainVault(saving credentials: Credentials) throws {
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.enableKeychainVault(saving: credentials) }
        }
    }
    public func upgradeKeychainWithBiometrics() async throws {
        try await run { (m: inout Machine) throws(VaultError) in try m.upgradeKeychainWithBiometrics() }
    }
    public func enableSecureVaultWithBiometrics(saving credentials: Credentials) async throws {
        try await run { (m: inout Machine) throws(VaultError) in try m.enableSecureVaultWithBiometrics(saving: credentials) }
    }
    /// Forgets the credentials in memory; needs no keychain operation.
    public func lock() throws {
        try VaultThread.shared.wait { try await self.run { (m: inout Machine) throws(VaultError) in try m.lock() } }
    }
    /// The prompt; the credentials it opened.
    @discardableResult
    public func unlockWithBiometrics() async throws -> Credentials {
        try await run { (m: inout Machine) throws(VaultError) in try m.unlockWithBiometrics() }
        guard let credentials = machine.withLock({ $0?.state.credentials }) else {
            throw KeychainError(.internal, "The vault unlocked without credentials")
        }
        return credentials
    }
    /// Synchronous, as in the seed: the credentials are in memory (`biometricsSecured`), so the plain
    /// write and the removal need no prompt.
    public func downgradeBiometricsToKeychain() throws {
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.downgradeBiometricsToKeychain() }
        }
    }
    /// Synchronous, as in the seed: removes the biometric item, no prompt.
    public func disableBiometricsSecureVault() throws {
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.disableBiometricsSecureVault() }
        }
    }
    /// Sign-out, or "change account": removes both items, from any state. It does not throw, as in
    /// the seed: a removal that fails leaves the state matching what is still stored.
    public func resetEverything() {
        try? VaultThread.shared.wait { try await self.run { (m: inout Machine) throws(VaultError) in try m.resetEverything() } }
    }
    /// After a biometric lockout: the device passcode, which ends it; the vault stays `locked`.
    /// - Returns: true once the passcode was accepted.
    @discardableResult
    public func reauthenticateOwner() async throws -> Bool {
        try await run { (m: inout Machine) throws(VaultError) in try m.reauthenticateOwner() }
        return true
    }

    // MARK: Driving the machine

    private func storagesOrThrow() throws(KeychainError) -> Storages {
        switch storages {
        case .success(let storages): storages
        case .failure(let error): throw error
        }
    }

    /// The machine, started from what is stored (no prompt) on first use.
    private func startedAsync() async throws -> Machine {
        if let current = machine.withLock({ $0 }) { return current }
        let storages = try storagesOrThrow()
        let stored = Machine.Stored(
            keychainItem: try await storages.plain.getData(key).map { try JSONDecoder().decode(Credentials.self, from: $0) },
            biometricItemExists: try await storages.biometric.hasItem(key))
        let available = try await device.canUseAccessControl(.biometryCurrentSet).available
        return machine.withLock { current in
            if current == nil { current = Machine(startupFound: stored, biometricsAvailable: available) }
            return current!
        }
    }

    private func started() throws -> Machine {
        if let current = machine.withLock({ $0 }) { return current }
        return try VaultThread.shared.wait { try await self.startedAsync() }
    }

    /// Starts a transition, performs the machine's actions on the keychain, feeding back each
    /// outcome, until `.none`. The first keychain failure is rethrown once the machine has settled.
    private func run(_ start: (inout Machine) throws(VaultError) -> Machine.Action) async throws {
        _ = try await startedAsync()
        var action = try machine.withLock { (m: inout Machine?) throws(VaultError) in try start(&m!) }
        func next(_ event: (inout Machine) throws(VaultError) -> Machine.Action) throws(VaultError) {
            action = try machine.withLock { (m: inout Machine?) throws(VaultError) in try event(&m!) }
        }
        let storages = try storagesOrThrow()
        func storage(_ protection: VaultProtection) -> Keychain { protection == .keychain ? storages.plain : storages.biometric }
        var failure: KeychainError?
        while true {
            if case .none = action {
                if let failure { throw failure }
                return
            }
            do {
                switch action {
                case .none:
                    return
                case .store(let credentials, let protection):
                    try await storage(protection).setItem(key, try JSONEncoder().encode(credentials))
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                case .read(let protection):
                    let data = try await storage(protection).getData(key)
                    let credentials = try data.map { try JSONDecoder().decode(Credentials.self, from: $0) }
                    try next { m throws(VaultError) in try m.credentialsRead(credentials) }
                case .remove(let protection):
                    try await storage(protection).removeItem(key)
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                case .authenticateOwner:
                    try await device.reauthenticateOwner()
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                }
            } catch let error as KeychainError {
                failure = failure ?? error
                try next { m throws(VaultError) in try m.operationFailed(error.code) }
            } catch let error as DecodingError {
                let corrupted = KeychainError(.dataCorrupted, "The vault's credentials cannot be decoded: \(error)")
                failure = failure ?? corrupted
                try next { m throws(VaultError) in try m.operationFailed(corrupted.code) }
            }
        }
    }
}

/// The thread the synchronous calls wait on: their keychain work runs as a task on this executor
/// (and on the keychain engine's own thread), so waiting never needs a thread of Swift's shared
/// pool, which a caller on that pool may be holding.
enum VaultThread {
    static let name = "biometrics-vault"
    static let shared = SerialThreadExecutor(name: name)
}

extension SerialThreadExecutor {
    /// Runs `body` as a task on this thread and blocks the caller until it ends.
    func wait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        precondition(Thread.current.name != VaultThread.name, "a synchronous vault call from inside another")
        let result = Mutex<Result<T, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task(executorPreference: self) {
            let outcome: Result<T, any Error>
            do { outcome = .success(try await body()) } catch { outcome = .failure(error) }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return try result.withLock { $0! }.get()
    }
}
