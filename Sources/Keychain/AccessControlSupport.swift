/// Which access-control values this build can enforce, in one place.
///
/// - Important: the fingerprint reader and the passcode prompt (issue: every `AccessControl` value)
///   are not built yet; until then only `none` is written, and the others fail without writing.
enum AccessControlSupport {
    static func writeError(for value: AccessControl) -> KeychainError {
        if value.usesBiometry && !value.allowsPasscode || value == .biometryCurrentSetOrPasscode {
            return KeychainError(.biometryNotAvailable,
                                 "accessControl '\(value.rawValue)' needs a fingerprint reader, and this device has none")
        }
        return KeychainError(.unsupported,
                             "accessControl '\(value.rawValue)' needs the passcode prompt, which this version does not provide yet")
    }

    static func check(_ value: AccessControl) -> AccessControlCheck {
        switch value {
        case .none: AccessControlCheck(available: true, reason: nil)
        case .passcode, .biometryAnyOrPasscode: AccessControlCheck(available: false, reason: .unsupported)
        default: AccessControlCheck(available: false, reason: .notAvailable)
        }
    }
}

/// The answer of `canUseAccessControl` (seed: `{ available, reason }`).
public struct AccessControlCheck: Sendable, Hashable, Codable {
    public enum Reason: String, Sendable, Hashable, Codable {
        case notAvailable, notEnrolled, passcodeNotSet, unsupportedOS
        /// Linux: this build or backend cannot give the value.
        case unsupported
    }
    public var available: Bool
    public var reason: Reason?
}

/// Biometric sensors (seed: `BiometryType`); Linux offers a (simulated) fingerprint reader.
public enum BiometryType: String, Sendable, Hashable, Codable { case fingerprint }

/// Whether the device can protect an item with `value` now; never prompts, never writes.
public func canUseAccessControl(_ value: AccessControl) async -> AccessControlCheck {
    AccessControlSupport.check(value)
}

/// The biometric sensors present: none until the fingerprint reader exists.
public func getBiometryTypes() async -> [BiometryType] { [] }
