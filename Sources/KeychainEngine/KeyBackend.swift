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
                     engine: isolated Engine) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?)

    /// The secret half of `wrapping` for a read of `record`, checked against its public half.
    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated Engine) async throws(KeychainError) -> SecureBytes

    /// Destroys what the backend itself holds for a service (the store's rows are the engine's).
    func destroyKeys(service: String, engine: isolated Engine) throws(KeychainError)

    /// How strongly the secret half is held, as `getItemInfo` reports it.
    func securityLevel(engine: isolated Engine) throws(KeychainError) -> ItemInfo.SecurityLevel
}
