/// An input of `VaultStateMachine`, named as it is called: the seed's transitions, then the outcomes
/// the driver reports back.
public enum VaultEvent: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    case enableKeychainVault = "enableKeychainVault(saving:)"
    case upgradeKeychainWithBiometrics = "upgradeKeychainWithBiometrics()"
    case enableSecureVaultWithBiometrics = "enableSecureVaultWithBiometrics(saving:)"
    case lock = "lock()"
    case unlockWithBiometrics = "unlockWithBiometrics()"
    case downgradeBiometricsToKeychain = "downgradeBiometricsToKeychain()"
    case disableBiometricsSecureVault = "disableBiometricsSecureVault()"
    case resetEverything = "resetEverything()"
    case reauthenticateOwner = "reauthenticateOwner()"
    case operationSucceeded = "operationSucceeded()"
    case credentialsRead = "credentialsRead(_:)"
    case operationFailed = "operationFailed(_:)"

    public var description: String { rawValue }

    /// The states this transition starts from; empty for the driver's outcomes.
    ///
    /// Used for the messages; `VaultStateMachine` checks each transition where it is performed, and
    /// the tests hold both to the same table.
    var allowedStates: [VaultStateKind] {
        switch self {
        case .enableKeychainVault: [.unavailable, .ready]
        case .upgradeKeychainWithBiometrics: [.keychainSecured]
        case .enableSecureVaultWithBiometrics: [.ready]
        case .lock, .downgradeBiometricsToKeychain, .disableBiometricsSecureVault: [.biometricsSecured]
        case .unlockWithBiometrics: [.locked]
        case .reauthenticateOwner, .resetEverything: VaultStateKind.allCases
        case .operationSucceeded, .credentialsRead, .operationFailed: []
        }
    }
}

/// Why `VaultStateMachine` refused an input. A refused input changes nothing.
public enum VaultError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The seed's diagrams have no such transition from this state.
    case transitionNotAllowed(from: VaultStateKind, event: VaultEvent)
    /// The transition puts the credentials behind biometrics, and the device can't use them now.
    case biometricsUnavailable(event: VaultEvent)
    /// `event` came while `pending` still waits for the outcome of its keychain operation.
    case operationInProgress(pending: VaultEvent, event: VaultEvent)
    /// The driver reported an outcome that doesn't answer the pending operation, or there is none.
    case unexpectedOutcome(VaultEvent, pending: VaultEvent?)

    public var description: String {
        switch self {
        case .transitionNotAllowed(let state, let event):
            let from = event.allowedStates.map(\.rawValue).joined(separator: " or ")
            return "\(event) is not allowed in state \(state), only from \(from); nothing changed"
        case .biometricsUnavailable(let event):
            return "\(event) needs biometrics, and this device can't use them now "
                + "(no sensor, nothing enrolled or no passcode); nothing changed"
        case .operationInProgress(let pending, let event):
            return "\(event) came while \(pending) still waits for its keychain operation; "
                + "report that outcome first; nothing changed"
        case .unexpectedOutcome(let outcome, nil):
            return "\(outcome) was reported, but no keychain operation is in progress; nothing changed"
        case .unexpectedOutcome(let outcome, let pending?):
            return "\(outcome) doesn't answer the keychain operation of \(pending); nothing changed"
        }
    }
}
