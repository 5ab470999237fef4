import KeychainCore
import FoundationEssentials
import SecureMemory

/// What keychaind does not serve, done in this process on the store itself: backup and restore of
/// the whole store, provisioning (taking TPM ownership, importing a bundle for one of keychaind's
/// users, the attestation key), boot-state administration. `KeychainDevice` and `Keychain` reach the
/// store in this process or through keychaind alike and have none of these calls; this type holds
/// the store's engine, so whoever has one runs where the store is, as its user.
public struct KeychainAdministration: Sendable {
    let engine: Engine
    let configuration: KeychainConfiguration

    /// `init(configuration:)` (the facade's: its default is `KeychainConfiguration.default`).
    package init(opening configuration: KeychainConfiguration) throws(KeychainError) {
        guard configuration.daemonSocket == nil else {
            throw KeychainError(.unsupported, "The keychain service does not serve this call: run it where the store is, as "
                                + "the service's user (keychainctl --direct --store <the service's store> …)")
        }
        let local = LocalService(configuration: configuration)
        if let refusal = local.refusal { throw refusal }
        (engine, self.configuration) = (local.engine, configuration)
    }

    /// Provisions as `KeychainDevice.initialize()`, then takes ownership of the TPM as a provisioning
    /// tool does: each empty owner or lockout authorization with a file in `ownership` is set to 32
    /// random bytes, written there first (`hex:…`, 0600, never overwritten); an empty one without a
    /// file is refused with `INVALID_ARGUMENT` unless `ownership.allowEmpty`. The embedded software TPM
    /// is taken on its first start without asking (its files are in `<store>/swtpm/`).
    @discardableResult
    public func initialize(takingOwnership ownership: Ownership) async throws(KeychainError) -> DeviceStatus {
        _ = try await engine.initialize()
        try await engine.takeOwnership(ownership)
        // The owner authorization just set, else the one given: NV_DefineSpace of the rollback counter needs it.
        var owner = configuration.ownerAuthorization
        if let file = ownership.ownerAuthorizationFile, FileManager.default.fileExists(atPath: file) {
            owner = try AuthorizationText.readFile(file)
        }
        try await engine.bindRollbackCounter(ownerAuthorization: owner)
        return try await engine.status()
    }

    /// The administrator's recovery from a rollback (`status` says `rolled-back`, every operation
    /// refuses with `DATA_CORRUPTED`): keeps the store as it is now and binds it to a new TPM counter,
    /// undefining the old one. Items removed since the copy was made stay back; nothing else changes.
    /// Also binds a store that is not bound yet, as `initialize` does.
    /// - Parameter ownerAuthorization: the TPM's owner authorization (`configuration.ownerAuthorization`
    ///   when nil); whoever put a copy back does not have it.
    /// - Throws: `AUTHENTICATION_FAILED` when the TPM refuses it, before the store changes.
    @discardableResult
    public func acceptStore(ownerAuthorization: SecureBytes? = nil) async throws(KeychainError) -> RollbackCounterStatus {
        try await engine.acceptStore(ownerAuthorization: ownerAuthorization ?? configuration.ownerAuthorization)
    }
}
