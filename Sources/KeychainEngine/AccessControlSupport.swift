import KeychainCore

/// The answer of `canUseAccessControl` (seed: `{ available, reason }`).
public struct AccessControlCheck: Sendable, Hashable, Codable {
    public enum Reason: String, Sendable, Hashable, Codable {
        case notAvailable, notEnrolled, passcodeNotSet, unsupportedOS
        /// Linux: the backend in use cannot give the value.
        case unsupported
        /// Linux: the device can give the value, but no prompt can reach a person to read it (no
        /// terminal or password agent: the authenticator's `reachability()`).
        case noPrompt
    }
    public var available: Bool
    public var reason: Reason?
    public init(available: Bool, reason: Reason? = nil) { self.available = available; self.reason = reason }
}

/// Biometric sensors (seed: `BiometryType`); Linux offers a (simulated) fingerprint reader.
public enum BiometryType: String, Sendable, Hashable, Codable { case fingerprint }

extension KeychainConfiguration {
    /// `check`, or `noPrompt` when the device can give `value` but the authenticator reaches no one
    /// (a read would fail with `INTERACTION_NOT_ALLOWED`). No authenticator at all is the app's
    /// choice (reads answered elsewhere, or never) and leaves `check` as it is.
    package func promptReach(for value: AccessControl, _ check: AccessControlCheck) async -> AccessControlCheck {
        guard check.available, value != .none, let authenticator,
              case .unreachable = await authenticator.reachability() else { return check }
        return AccessControlCheck(available: false, reason: .noPrompt)
    }
}
