/// The seed's five states of a vault; only the two "secured" states carry the credentials.
public enum VaultState<Credentials: Codable & Sendable>: Sendable {
    /// Nothing is stored, and the device can't use biometrics now (no sensor, nothing enrolled, no passcode).
    case unavailable
    /// Nothing is stored (the user is signed out); the credentials can go behind biometrics or not.
    case ready
    /// The credentials are stored without biometrics: the user is signed in.
    case keychainSecured(Credentials)
    /// The credentials are stored behind biometrics and in memory: the user is signed in. 🔓
    case biometricsSecured(Credentials)
    /// The credentials are stored behind biometrics and not in memory: "Sign in with biometrics". 🔒
    case locked

    /// The state without its credentials.
    public var kind: VaultStateKind {
        switch self {
        case .unavailable: .unavailable
        case .ready: .ready
        case .keychainSecured: .keychainSecured
        case .biometricsSecured: .biometricsSecured
        case .locked: .locked
        }
    }

    /// The credentials, in the two states that hold them.
    public var credentials: Credentials? {
        switch self {
        case .keychainSecured(let credentials), .biometricsSecured(let credentials): credentials
        case .unavailable, .ready, .locked: nil
        }
    }

    /// The seed's tests of a state.
    public var isBiometricsSecured: Bool { kind == .biometricsSecured }
    public var isKeychainSecured: Bool { kind == .keychainSecured }
    public var isReady: Bool { kind == .ready }
}

/// A state prints as its kind, never with the credentials: a state written to a log shows no token.
extension VaultState: CustomStringConvertible, CustomDebugStringConvertible {
    public var description: String { kind.rawValue }
    public var debugDescription: String { "VaultState.\(kind.rawValue)" }
}

extension VaultState: Equatable where Credentials: Equatable {}

/// A `VaultState` without its credentials, for errors and tables.
public enum VaultStateKind: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    case unavailable
    case ready
    case keychainSecured
    case biometricsSecured
    case locked

    public var description: String { rawValue }
}

/// How the vault's credentials are stored: which of its two keychain items an `Action` is about.
public enum VaultProtection: String, CaseIterable, Hashable, Sendable, CustomStringConvertible {
    /// The item without access control: read with no prompt.
    case keychain
    /// The item behind biometrics (`biometryCurrentSet`): written with no prompt, read with one.
    case biometrics

    public var description: String { rawValue }
}
