import KeychainCore
import KeychainEngine
import SecureMemory

extension KeychainDevice {
    /// Imports a bundle sealed to this device: TPM2_Import under the SRK, the TPM opens K under the
    /// item's policy (the lock state; the passcode for a passcode item), and the value becomes an
    /// ordinary item of its service, sealed under this keychain's own keys (fixedTPM for ThisDeviceOnly).
    /// - Throws: `INVALID_ARGUMENT` for a bundle of another device or an older version than the
    ///   installed one; `DATA_CORRUPTED` for a changed bundle (the TPM refuses it, or the value fails
    ///   authentication); `INTERACTION_NOT_ALLOWED` when the device is locked; `AUTHENTICATION_FAILED`
    ///   for a wrong passcode; `INVALID_ARGUMENT` for a service that names keychaind's scope of a user or
    ///   a group (`uid:1600/bank`): the importer chooses whose item it becomes, never the bundle.
    ///   In this process it becomes this process's item; through keychaind (root and the access
    ///   group `admin` only) the caller's. A credential bundle (`seal-for --credential`) becomes the
    ///   system manager's credential.
    public func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes? = nil) async throws(KeychainError) -> ImportOutcome {
        try await backing.importBundle(bundle, passcode: passcode, in: .process)
    }
}

extension KeychainDevice {
    /// This device's identity document (provisions the TPM and the store first, as `initialize` does).
    /// Through keychaind: root and the access group `admin` only.
    public func identity() async throws(KeychainError) -> DeviceIdentity {
        try await backing.identity()
    }
}
