import Foundation
public import Keychain

/// Biometric sign-in for app and appliance code (seed: BiometricsVault), built only on the public
/// `Keychain` API: the credentials either in a plain keychain item (`keychainSecured`) or behind the
/// fingerprint reader (`biometricsSecured`, `locked`), with every transition of the seed.
///
/// ```swift
/// let vault = try await BiometricsVault<Credentials>(key: "credentials")
/// switch await vault.state {
/// case .keychainSecured(let credentials): signIn(with: credentials)
/// case .locked: try await vault.unlockWithBiometrics()   // the prompt
/// default: showSignIn()
/// }
/// ```
///
/// A transition that is not allowed throws `VaultError` and changes nothing; one that fails in the
/// keychain (a canceled prompt, `KEY_INVALIDATED`) throws that `KeychainError` after the state was
/// settled to match what is stored. When locked, the credentials are not in memory.
public actor BiometricsVault<Credentials: Codable & Sendable> {
    public let key: String
    private let plain: Keychain
    private let biometric: Keychain
    private let device: KeychainDevice
    private var machine: VaultStateMachine<Credentials>

    public var state: VaultState<Credentials> { machine.state }
    public var biometricsAvailable: Bool { machine.biometricsAvailable }

    /// Opens the vault and derives its state from what is stored, without a prompt.
    /// - Parameters:
    ///   - key: the item's name in both storages.
    ///   - service: the plain storage's service; the biometric one is `service + ".biometrics"`.
    ///   - prompt: what the fingerprint prompt says.
    public init(key: String, service: String = "biometrics-vault",
                prompt: Prompt = .init(title: "Unlock your account", cancel: "Use password"),
                configuration: KeychainConfiguration = .default) async throws {
        self.key = key
        plain = try createKeychain(.init(service: service, accessible: .afterFirstUnlockThisDeviceOnly),
                                   configuration: configuration)
        biometric = try createKeychain(.init(service: service + ".biometrics", accessible: .whenUnlockedThisDeviceOnly,
                                             accessControl: .biometryCurrentSet, prompt: prompt),
                                       configuration: configuration)
        device = KeychainDevice(configuration: configuration)
        let stored = VaultStateMachine<Credentials>.Stored(
            keychainItem: try await plain.getData(key).map { try JSONDecoder().decode(Credentials.self, from: $0) },
            biometricItemExists: try await biometric.hasItem(key))
        let available = await device.canUseAccessControl(.biometryCurrentSet).available
        machine = VaultStateMachine(startupFound: stored, biometricsAvailable: available)
    }

    /// Asks the device again whether biometrics can be used (after an enrollment, say).
    public func refreshAvailability() async {
        machine.biometricsAvailabilityChanged(await device.canUseAccessControl(.biometryCurrentSet).available)
    }

    public func enableKeychainVault(saving credentials: Credentials) async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.enableKeychainVault(saving: credentials) }
    }
    public func upgradeKeychainWithBiometrics() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.upgradeKeychainWithBiometrics() }
    }
    public func enableSecureVaultWithBiometrics(saving credentials: Credentials) async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.enableSecureVaultWithBiometrics(saving: credentials) }
    }
    public func lock() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.lock() }
    }
    public func unlockWithBiometrics() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.unlockWithBiometrics() }
    }
    public func downgradeBiometricsToKeychain() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.downgradeBiometricsToKeychain() }
    }
    public func disableBiometricsSecureVault() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.disableBiometricsSecureVault() }
    }
    public func resetEverything() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.resetEverything() }
    }
    /// After a biometric lockout: the device passcode, which ends it; the vault stays `locked`.
    public func reauthenticateOwner() async throws {
        try await run { (m: inout VaultStateMachine<Credentials>) throws(VaultError) in try m.reauthenticateOwner() }
    }

    /// Performs the machine's actions on the keychain, feeding back each outcome, until `.none`.
    /// The first keychain failure is rethrown once the machine has settled.
    private func run(_ start: (inout VaultStateMachine<Credentials>) throws(VaultError) -> VaultStateMachine<Credentials>.Action) async throws {
        var action = try start(&machine)
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
                    action = try machine.operationSucceeded()
                case .read(let protection):
                    let data = try await storage(protection).getData(key)
                    action = try machine.credentialsRead(try data.map { try JSONDecoder().decode(Credentials.self, from: $0) })
                case .remove(let protection):
                    try await storage(protection).removeItem(key)
                    action = try machine.operationSucceeded()
                case .authenticateOwner:
                    try await device.reauthenticateOwner()
                    action = try machine.operationSucceeded()
                }
            } catch let error as KeychainError {
                failure = failure ?? error
                action = try machine.operationFailed(error.code)
            } catch let error as DecodingError {
                let corrupted = KeychainError(.dataCorrupted, "The vault's credentials cannot be decoded: \(error)")
                failure = failure ?? corrupted
                action = try machine.operationFailed(corrupted.code)
            }
        }
    }

    private func storage(_ protection: VaultProtection) -> Keychain {
        protection == .keychain ? plain : biometric
    }
}
