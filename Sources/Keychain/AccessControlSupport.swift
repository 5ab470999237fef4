/// The answer of `canUseAccessControl` (seed: `{ available, reason }`).
public struct AccessControlCheck: Sendable, Hashable, Codable {
    public enum Reason: String, Sendable, Hashable, Codable {
        case notAvailable, notEnrolled, passcodeNotSet, unsupportedOS
        /// Linux: the backend in use cannot give the value.
        case unsupported
    }
    public var available: Bool
    public var reason: Reason?
    public init(available: Bool, reason: Reason? = nil) { self.available = available; self.reason = reason }
}

/// Biometric sensors (seed: `BiometryType`); Linux offers a (simulated) fingerprint reader.
public enum BiometryType: String, Sendable, Hashable, Codable { case fingerprint }

/// Whether the default device can protect an item with `value` now; never prompts, never writes.
/// - Throws: `HARDWARE_UNAVAILABLE` when keychaind (`KEYCHAIN_SOCKET`) cannot be reached.
public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
    try await KeychainDevice().canUseAccessControl(value)
}

/// The biometric sensors of the default device.
public func getBiometryTypes() async -> [BiometryType] { KeychainDevice().biometryTypes() }
