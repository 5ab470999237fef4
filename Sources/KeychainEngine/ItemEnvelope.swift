import KeychainCore
import KeychainStore
import SecureMemory

/// How an item's value is encrypted (format 1).
///
/// The wrapping key is an X25519 pair per (service, protection) whose secret half is sealed in the
/// TPM. A writer never needs it: it agrees a secret with the public half from its own ephemeral pair
/// (one per process and wrapping key), and each item's data key is BLAKE2b keyed with the shared
/// secret over both public keys and the item's salt (so the key is bound to the pair). Only a reader
/// that unsealed the secret half can agree the same secret. The value is XChaCha20-Poly1305 under
/// the data key, with every other stored field as associated data, so any edited or swapped field
/// fails authentication: `DATA_CORRUPTED`, never a wrong value.
enum ItemEnvelope {
    static let saltLength = 16
    private static let domain = Array("keychain-linux item key v1".utf8)

    static func dataKey(shared: SecureBytes, writerPublic: [UInt8], wrappingPublic: [UInt8], salt: [UInt8]) -> SecureBytes {
        Sodium.blake2b(key: shared, message: domain + writerPublic + wrappingPublic + salt)
    }

    /// Every stored field but the nonce and the ciphertext, length-prefixed so no two field lists collide.
    /// A token item's service is authenticated as its namespace of the first format
    /// (`TokenBackend.namespace`), so items migrated from it open unchanged.
    static func associatedData(_ r: ItemRecord) -> [UInt8] {
        var ad: [UInt8] = Array("keychain-linux v1".utf8)
        ad.reserveCapacity(128 + r.service.utf8.count + r.key.utf8.count)
        func field(_ bytes: some Collection<UInt8>) {
            ad += UInt32(bytes.count).bigEndianBytes
            ad += bytes
        }
        field((r.protection.hasSuffix(TokenSession.tagSuffix) ? TokenBackend.namespace(r.service) : r.service).utf8)
        field(r.key.utf8)
        field(r.protection.utf8)
        if let label = r.label { ad.append(1); field(label.utf8) } else { ad.append(0) }
        ad += r.created.bigEndianBytes
        ad += r.modified.bigEndianBytes
        field(r.writerPublic)
        field(r.salt)
        return ad
    }
}
