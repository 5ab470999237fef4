import KeychainCore
import KeychainEngine

extension Keychain {
    /// The AK's statement of the wrapping key of this storage's items (of its options' protection:
    /// accessible, accessControl, authValidity), over the caller's `nonce` (1 to 32 bytes)
    /// (`attest key`). Through keychaind it is the key of the caller's own items (its uid's, or an
    /// access group's it is a member of), certified by the AK the administrator made on the
    /// daemon's store (`attest init` where the store is).
    /// - Throws: `INVALID_ARGUMENT` when the service has no key of that protection, or the device no
    ///   AK; `UNSUPPORTED` for a token's key or one sealed before key attestation.
    public func attestKey(nonce: [UInt8]) async throws(KeychainError) -> KeyAttestation {
        try await backing.attestKey(nonce: nonce, in: storage)
    }
}
