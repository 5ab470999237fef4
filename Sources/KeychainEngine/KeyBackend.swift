import KeychainCore
import KeychainStore
import SecureMemory

/// What holds a storage's wrapping keys: the TPM or a PKCS#11 token.
///
/// Every item is sealed the same way (`ItemEnvelope`): a data key agreed between a writer's ephemeral
/// X25519 key and the wrapping pair of its service and protection, so a write needs only the pair's
/// public half. A backend keeps the secret half: it makes the pair for a write, opens the secret for
/// a read (with the prompt, ticket and lock-state work it needs), destroys what it holds, and says
/// its security level. The engine picks the backend from the stored wrapping key, never from a name.
protocol KeyBackend {
    /// The wrapping key a write with `protection` goes under: `stored` while it still serves, else a
    /// new one, with the public half of the dead key it replaces (`Engine.retire`). Throws before
    /// anything is made for a protection this backend cannot enforce (seed: never less than asked).
    func wrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                     engine: isolated any BackendContext) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?)

    /// The secret half of `wrapping` for a read of `record`, checked against its public half.
    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated any BackendContext) async throws(KeychainError) -> SecureBytes

    /// Destroys what the backend itself holds for a service (the store's rows are the engine's).
    func destroyKeys(service: String, engine: isolated any BackendContext) throws(KeychainError)

    /// How strongly the secret half is held, as `getItemInfo` reports it.
    func securityLevel(engine: isolated any BackendContext) throws(KeychainError) -> ItemInfo.SecurityLevel
}

/// What a backend may use of the engine, and nothing more of the actor: the store, the keys the engine
/// keeps opened, the TPM's sealing and unsealing of wrapping keys, and the token's session and PIN.
/// The engine hands itself to a backend as this, isolated: a backend's calls run on the engine's
/// thread, within the operation that called it.
protocol BackendContext: Actor {
    // The store.
    func store() throws(KeychainError) -> Store
    func read<T>(_ body: () throws -> T) throws(KeychainError) -> T
    func lockGeneration(_ store: Store) throws(KeychainError) -> UInt64

    // The wrapping keys' secrets the engine keeps opened (`Engine.unsealed`), and their check.
    var unsealed: [Engine.WrappingKeyID: Engine.UnsealedKey] { get set }
    func cachedSecret(_ id: Engine.WrappingKeyID, window: Int, store: Store) throws(KeychainError) -> SecureBytes?
    func checked(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord) throws(KeychainError) -> SecureBytes

    // The TPM (TPMBackend.swift).
    func tpmWrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                        readerDirectory: String?, sealing pair: Sodium.X25519KeyPair?)
        throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?)
    func unsealedSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                        context: Engine.ReadContext) async throws(KeychainError) -> SecureBytes
    func sealPolicy(of wrapping: WrappingKeyRecord) throws(KeychainError) -> SealPolicy
    func unsealedUnattended(_ wrapping: WrappingKeyRecord, policy: SealPolicy, store: Store) throws(KeychainError) -> SecureBytes
    func refuseWhileLocked(_ availability: SealPolicy.Availability) throws(KeychainError)

    // The token (TokenBackend.swift).
    func tokenSession(_ uri: String) throws(KeychainError) -> TokenSession
    func tokenPasscodeSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                             context: Engine.ReadContext) async throws(KeychainError) -> SecureBytes
    func tokenPasscodePart(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                           context: Engine.ReadContext) async throws(KeychainError) -> SecureBytes
}

extension Engine: BackendContext {}
