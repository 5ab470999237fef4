internal import CTSS2
import SecureMemory

/// PolicySigned (Part 3, 23.3) with an HMAC verification key: the simulated fingerprint reader holds
/// the HMAC key in software and signs the session's nonce; the TPM holds a copy that can only *verify*
/// (its authPolicy is a random digest nobody can satisfy, so TPM2_HMAC with it is impossible).
extension TPMContext {
    /// Creates and loads the verification key (keyedHash, HMAC-SHA256, sign, fixedTPM) holding
    /// `hmacKey`, sent encrypted (`session` has the decrypt attribute). Its name is known before it
    /// is made persistent (`persist`), so the caller can record it first.
    /// - Returns: the loaded object (flush it) and its name.
    public func loadVerificationKey(_ hmacKey: SecureBytes, parent: TPMHandle,
                                    session: TPMHandle) throws(TPMError) -> (object: TPMHandle, name: [UInt8]) {
        let attributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_NODA
            | TPMA_OBJECT_SIGN_ENCRYPT | TPMA_OBJECT_ADMINWITHPOLICY
        let blob = try create(Self.keyedHash(attributes: attributes, policy: Sodium.randomBytes(32), hmac: true),
                              sensitive: hmacKey, parent: parent, session: session, command: "Create(reader key)")
        let object = try load(blob, parent: parent)
        return (object, try self.name(of: object))
    }

    /// Makes a loaded object persistent at `handle` (owner authorization).
    public func persist(_ object: TPMHandle, at handle: UInt32) throws(TPMError) {
        var persistent: ESYS_TR = 0
        let owner = try ownerAuthorization()
        try call("EvictControl(persist)") {
            Esys_EvictControl(esys, KC_ESYS_TR_RH_OWNER, object.tr, owner, Self.none, Self.none, handle, &persistent)
        }
    }

    /// Removes a persistent object (owner authorization).
    public func evict(_ persistent: TPMHandle, at handle: UInt32) throws(TPMError) {
        var out: ESYS_TR = 0
        let owner = try ownerAuthorization()
        try call("EvictControl(remove)") {
            Esys_EvictControl(esys, KC_ESYS_TR_RH_OWNER, persistent.tr, owner, Self.none, Self.none, handle, &out)
        }
    }

    /// The TPM's current nonce of a session: what a PolicySigned signer must sign.
    public func nonceTPM(_ session: TPMHandle) throws(TPMError) -> [UInt8] {
        var nonce: UnsafeMutablePointer<TPM2B_NONCE>?
        try Self.local("TRSess_GetNonceTPM") { Esys_TRSess_GetNonceTPM(esys, session.tr, &nonce) }
        guard let nonce else { throw TPMError(command: "TRSess_GetNonceTPM", code: .size) }
        defer { Esys_Free(nonce) }
        return TPM2B.bytes(nonce.pointee.buffer, size: nonce.pointee.size)
    }

    /// The digest a PolicySigned signer signs: H(nonceTPM || expiration || cpHashA || policyRef).
    public static func policySignedDigest(nonceTPM: [UInt8], expiration: Int32 = 0, policyRef: [UInt8]) -> [UInt8] {
        sha256(nonceTPM, UInt32(bitPattern: expiration).bigEndianBytes, [], policyRef)
    }

    /// PolicySigned with an HMAC-SHA256 signature verified by `authObject` (no authorization needed).
    /// With a negative `expiration`, the TPM returns a ticket valid for that many seconds.
    @discardableResult
    public func policySigned(_ session: TPMHandle, authObject: TPMHandle, nonceTPM: [UInt8], policyRef: [UInt8],
                             hmac: [UInt8], expiration: Int32 = 0) throws(TPMError) -> PolicyTicket? {
        var nonce = TPM2B_NONCE()
        nonce.size = TPM2B.set(&nonce.buffer, nonceTPM)
        var cpHash = TPM2B_DIGEST()
        var ref = TPM2B_NONCE()
        ref.size = TPM2B.set(&ref.buffer, policyRef)
        var signature = TPMT_SIGNATURE()
        signature.sigAlg = UInt16(TPM2_ALG_HMAC)
        signature.signature.hmac.hashAlg = UInt16(TPM2_ALG_SHA256)
        withUnsafeMutableBytes(of: &signature.signature.hmac.digest) { $0.copyBytes(from: hmac) }
        var timeout: UnsafeMutablePointer<TPM2B_TIMEOUT>?
        var ticket: UnsafeMutablePointer<TPMT_TK_AUTH>?
        try call("PolicySigned") {
            Esys_PolicySigned(esys, authObject.tr, session.tr, Self.none, Self.none, Self.none,
                              &nonce, &cpHash, &ref, expiration, &signature, &timeout, &ticket)
        }
        defer { Esys_Free(timeout); Esys_Free(ticket) }
        guard expiration < 0 else { return nil }
        return try Self.ticket(timeout: timeout, ticket: ticket, authName: try name(of: authObject), policyRef: policyRef)
    }
}

