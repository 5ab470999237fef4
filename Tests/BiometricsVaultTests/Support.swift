@testable import BiometricsVault
import Keychain

struct Token: Codable, Sendable, Equatable {
    var value: String
}

typealias Machine = VaultStateMachine<Token>

/// The credentials the machines below are signed in with.
let token = Token(value: "refresh-1")
/// Credentials a transition saves, different from `token` so that a mix-up shows.
let newToken = Token(value: "refresh-2")

/// The seed's failure codes for a prompt or a biometric item.
let seedCodes: [KeychainError.Code] = [
    .userCanceled, .userFallback, .systemCanceled, .lockout, .lockoutPermanent, .keyInvalidated, .authenticationFailed,
]

/// The codes that say the device can't use biometrics (the `canUseAccessControl` reasons).
let unavailabilityCodes: [KeychainError.Code] = [.biometryNotAvailable, .biometryNotEnrolled, .passcodeNotSet]

/// The inputs that answer an action rather than start a transition.
let outcomes: [VaultEvent] = [.operationSucceeded, .credentialsRead, .operationFailed]

/// The seed's transitions: every input but the outcomes.
let transitions = VaultEvent.allCases.filter { !outcomes.contains($0) }

/// The transitions each state allows, written out independently of the implementation.
let allowed: [VaultStateKind: Set<VaultEvent>] = [
    .unavailable: [.enableKeychainVault, .reauthenticateOwner, .resetEverything],
    .ready: [.enableKeychainVault, .enableSecureVaultWithBiometrics, .reauthenticateOwner, .resetEverything],
    .keychainSecured: [.upgradeKeychainWithBiometrics, .reauthenticateOwner, .resetEverything],
    .biometricsSecured: [.lock, .downgradeBiometricsToKeychain, .disableBiometricsSecureVault, .reauthenticateOwner, .resetEverything],
    .locked: [.unlockWithBiometrics, .reauthenticateOwner, .resetEverything],
]

/// A machine settled in `kind`, reached through the public inputs only.
///
/// `biometricsAvailable` applies to the states that store something; `ready` and `unavailable` are
/// defined by it.
func machine(in kind: VaultStateKind, biometricsAvailable: Bool = true) throws -> Machine {
    switch kind {
    case .unavailable:
        return Machine(startupFound: .init(), biometricsAvailable: false)
    case .ready:
        return Machine(startupFound: .init(), biometricsAvailable: true)
    case .keychainSecured:
        return Machine(startupFound: .init(keychainItem: token), biometricsAvailable: biometricsAvailable)
    case .locked:
        return Machine(startupFound: .init(biometricItemExists: true), biometricsAvailable: biometricsAvailable)
    case .biometricsSecured:
        var machine = try machine(in: .locked, biometricsAvailable: biometricsAvailable)
        _ = try machine.unlockWithBiometrics()
        _ = try machine.credentialsRead(token)
        return machine
    }
}

/// Sends `event` with fixed arguments: `newToken` to save, `token` read back, `USER_CANCELED` as the failure.
@discardableResult
func perform(_ event: VaultEvent, on machine: inout Machine) throws(VaultError) -> Machine.Action {
    switch event {
    case .enableKeychainVault: try machine.enableKeychainVault(saving: newToken)
    case .upgradeKeychainWithBiometrics: try machine.upgradeKeychainWithBiometrics()
    case .enableSecureVaultWithBiometrics: try machine.enableSecureVaultWithBiometrics(saving: newToken)
    case .lock: try machine.lock()
    case .unlockWithBiometrics: try machine.unlockWithBiometrics()
    case .downgradeBiometricsToKeychain: try machine.downgradeBiometricsToKeychain()
    case .disableBiometricsSecureVault: try machine.disableBiometricsSecureVault()
    case .resetEverything: try machine.resetEverything()
    case .reauthenticateOwner: try machine.reauthenticateOwner()
    case .operationSucceeded: try machine.operationSucceeded()
    case .credentialsRead: try machine.credentialsRead(token)
    case .operationFailed: try machine.operationFailed(.userCanceled)
    }
}

/// Whether `value` holds a `Token` anywhere inside, private stored properties included.
func holdsCredentials(_ value: Any) -> Bool {
    if value is Token {
        return true
    }
    return Mirror(reflecting: value).children.contains { holdsCredentials($0.value) }
}
