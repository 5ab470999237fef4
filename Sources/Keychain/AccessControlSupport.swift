import KeychainCore
import KeychainEngine

/// Whether the default device can protect an item with `value` now; never prompts, never writes.
/// - Throws: `HARDWARE_UNAVAILABLE` when keychaind (`KEYCHAIN_SOCKET`) cannot be reached.
public func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
    try await KeychainDevice().canUseAccessControl(value)
}

/// The biometric sensors of the default device.
public func getBiometryTypes() async -> [BiometryType] { KeychainDevice().biometryTypes() }
