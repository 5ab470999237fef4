internal import CTSS2

/// A signing key known only by its public half (a vendor's boot-policy key): its TPM2B_PUBLIC and
/// name computed offline, its signatures checked by the TPM (LoadExternal, VerifySignature), the
/// verification ticket kept and later presented to PolicyAuthorize.
extension TPMContext {
    /// Marshalled TPM2B_PUBLIC of an ECC P-256 ECDSA-SHA256 verification key (x, y: 32 bytes each).
    public static func eccVerificationPublic(x: [UInt8], y: [UInt8]) throws(TPMError) -> [UInt8] {
        var pub = TPM2B_PUBLIC()
        pub.publicArea.type = UInt16(TPM2_ALG_ECC)
        pub.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
        pub.publicArea.objectAttributes = TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_SIGN_ENCRYPT
        pub.publicArea.parameters.eccDetail.symmetric.algorithm = UInt16(TPM2_ALG_NULL)
        pub.publicArea.parameters.eccDetail.scheme.scheme = UInt16(TPM2_ALG_ECDSA)
        pub.publicArea.parameters.eccDetail.scheme.details.ecdsa.hashAlg = UInt16(TPM2_ALG_SHA256)
        pub.publicArea.parameters.eccDetail.curveID = UInt16(TPM2_ECC_NIST_P256)
        pub.publicArea.parameters.eccDetail.kdf.scheme = UInt16(TPM2_ALG_NULL)
        pub.publicArea.unique.ecc.x.size = TPM2B.set(&pub.publicArea.unique.ecc.x.buffer, x)
        pub.publicArea.unique.ecc.y.size = TPM2B.set(&pub.publicArea.unique.ecc.y.buffer, y)
        return try Marshal.public(pub)
    }

    /// The name of a key from its marshalled TPM2B_PUBLIC: nameAlg || SHA-256(TPMT_PUBLIC).
    public static func name(ofPublic bytes: [UInt8]) throws(TPMError) -> [UInt8] {
        guard bytes.count > 2 else { throw TPMError(command: "name of a public area", code: .size) }
        return UInt16(0x000B).bigEndianBytes + sha256(Array(bytes.dropFirst(2)))
    }

    /// Marshalled TPMT_SIGNATURE of an ECDSA-SHA256 signature.
    public static func ecdsaSignature(r: [UInt8], s: [UInt8]) -> [UInt8] {
        UInt16(0x0018).bigEndianBytes + UInt16(0x000B).bigEndianBytes
            + UInt16(r.count).bigEndianBytes + r + UInt16(s.count).bigEndianBytes + s
    }

    /// Checks `signature` over `digest` with the public key in the TPM (LoadExternal in the owner
    /// hierarchy, VerifySignature, FlushContext): returns the marshalled TPMT_TK_VERIFIED, which stays
    /// valid on this TPM until it is cleared.
    public func verifySignature(keyPublic: [UInt8], digest: [UInt8], signature: [UInt8]) throws(TPMError) -> [UInt8] {
        try withVerifiedSignature(
            keyPublic: keyPublic, digest: digest, signature: signature,
            loading: "LoadExternal(boot-policy key)", verifying: "VerifySignature(boot policy)"
        ) { ticket throws(TPMError) in
            try Marshal.encode("TPMT_TK_VERIFIED", ticket.pointee, Tss2_MU_TPMT_TK_VERIFIED_Marshal)
        }
    }

    /// LoadExternal of `keyPublic` in the owner hierarchy, VerifySignature of `signature` over `digest`,
    /// then `body` with the TPM's ticket while the key is still loaded; the key is flushed after.
    /// `loading` and `verifying` name the two commands in errors.
    func withVerifiedSignature<T>(
        keyPublic: [UInt8], digest: [UInt8], signature: [UInt8], loading: String, verifying: String,
        _ body: (UnsafePointer<TPMT_TK_VERIFIED>) throws(TPMError) -> T
    ) throws(TPMError) -> T {
        try withTransient { () throws(TPMError) -> T in
            var pub = try Marshal.public(keyPublic)
            var key: ESYS_TR = 0
            try call(loading) {
                Esys_LoadExternal(esys, Self.none, Self.none, Self.none, nil, &pub, KC_ESYS_TR_RH_OWNER, &key)
            }
            _ = adopt(key)
            var sig = try Marshal.decode("TPMT_SIGNATURE", signature, as: TPMT_SIGNATURE(), Tss2_MU_TPMT_SIGNATURE_Unmarshal)
            var hash = TPM2B_DIGEST()
            hash.size = TPM2B.set(&hash.buffer, digest)
            var ticket: UnsafeMutablePointer<TPMT_TK_VERIFIED>?
            try call(verifying) {
                Esys_VerifySignature(esys, key, Self.none, Self.none, Self.none, &hash, &sig, &ticket)
            }
            defer { Esys_Free(ticket) }
            guard let ticket else { throw TPMError(command: verifying, code: .size) }
            return try body(ticket)
        }
    }

    /// PolicyAuthorize with a kept verification ticket (no key loaded, one command).
    public func policyAuthorize(_ session: TPMHandle, approvedPolicy: [UInt8], policyRef: [UInt8], keyName: [UInt8],
                                ticket: [UInt8]) throws(TPMError) {
        var tk = try Marshal.decode("TPMT_TK_VERIFIED", ticket, as: TPMT_TK_VERIFIED(), Tss2_MU_TPMT_TK_VERIFIED_Unmarshal)
        try policyAuthorize(session, approvedPolicy: approvedPolicy, policyRef: policyRef, keyName: keyName, verified: &tk)
    }

    /// PolicyAuthorize itself, with a ticket from VerifySignature now or kept from an earlier one.
    func policyAuthorize(_ session: TPMHandle, approvedPolicy: [UInt8], policyRef: [UInt8], keyName: [UInt8],
                         verified: UnsafePointer<TPMT_TK_VERIFIED>) throws(TPMError) {
        var approved = TPM2B_DIGEST()
        approved.size = TPM2B.set(&approved.buffer, approvedPolicy)
        var ref = TPM2B_NONCE()
        ref.size = TPM2B.set(&ref.buffer, policyRef)
        var name = TPM2B_NAME()
        name.size = TPM2B.set(&name.name, keyName)
        try call("PolicyAuthorize") {
            Esys_PolicyAuthorize(esys, session.tr, Self.none, Self.none, Self.none, &approved, &ref, &name, verified)
        }
    }

    /// NV_SetBits: ORs `bits` into a bit-field index (owner authorization, or a policy session).
    public func setBitsNV(_ index: TPMHandle, bits: UInt64, authHandle: TPMHandle, session: TPMHandle?) throws(TPMError) {
        let auth: ESYS_TR
        if let session { auth = session.tr } else if authHandle == Self.owner { auth = try ownerAuthorization() } else { auth = Self.password }
        try call("NV_SetBits") { Esys_NV_SetBits(esys, authHandle.tr, index.tr, auth, Self.none, Self.none, bits) }
    }
}
