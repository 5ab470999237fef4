internal import CTSS2
import SecureMemory

/// PolicyAuthorize (Part 3, 23.16): a policy approved once by a signing key whose private part is then
/// destroyed, so the set of approved policies is fixed forever. The device lock uses it to let anyone
/// *lock* (write 0) without letting anyone *unlock*, which a self-referencing cpHash cannot express.
extension TPMContext {
    public struct Approval: Sendable, Hashable {
        /// Marshalled TPM2B_PUBLIC of the (now private-less) signing key.
        public var keyPublic: [UInt8]
        /// The key's name, as it appears in PolicyAuthorize digests.
        public var keyName: [UInt8]
        /// Marshalled TPMT_SIGNATURE over H(approvedPolicy || policyRef), one per approved policy.
        public var signatures: [[UInt8]]
        public init(keyPublic: [UInt8], keyName: [UInt8], signatures: [[UInt8]]) {
            self.keyPublic = keyPublic; self.keyName = keyName; self.signatures = signatures
        }
    }

    /// Creates a one-time ECDSA key under `parent`, signs each of `policies` (with `policyRef`), and
    /// forgets the private blob: nobody, this library included, can approve another policy.
    /// `policies` may be produced after the key's name is known, which is what breaks the cycle.
    public func approveOnce(parent: TPMHandle, policyRef: [UInt8],
                            policies: (_ keyName: [UInt8]) -> [[UInt8]]) throws(TPMError) -> Approval {
        try withTransient { () throws(TPMError) -> Approval in
            var inPublic = TPM2B_PUBLIC()
            inPublic.publicArea.type = UInt16(TPM2_ALG_ECC)
            inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
            inPublic.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
                | TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA | TPMA_OBJECT_SIGN_ENCRYPT
            inPublic.publicArea.parameters.eccDetail.symmetric.algorithm = UInt16(TPM2_ALG_NULL)
            inPublic.publicArea.parameters.eccDetail.scheme.scheme = UInt16(TPM2_ALG_ECDSA)
            inPublic.publicArea.parameters.eccDetail.scheme.details.ecdsa.hashAlg = UInt16(TPM2_ALG_SHA256)
            inPublic.publicArea.parameters.eccDetail.curveID = UInt16(TPM2_ECC_NIST_P256)
            inPublic.publicArea.parameters.eccDetail.kdf.scheme = UInt16(TPM2_ALG_NULL)
            // The private blob is never stored: once this function returns, nobody can sign again.
            let blob = try create(inPublic, sensitive: nil, parent: parent, session: nil, command: "Create(approval key)")
            let handle = try load(blob, parent: parent)
            let keyName = try name(of: handle)
            var signatures: [[UInt8]] = []
            for policy in policies(keyName) {
                var digest = TPM2B_DIGEST()
                digest.size = TPM2B.set(&digest.buffer, sha256(policy, policyRef))
                var scheme = TPMT_SIG_SCHEME()
                scheme.scheme = UInt16(TPM2_ALG_ECDSA)
                scheme.details.ecdsa.hashAlg = UInt16(TPM2_ALG_SHA256)
                var validation = TPMT_TK_HASHCHECK()
                validation.tag = UInt16(TPM2_ST_HASHCHECK)
                validation.hierarchy = UInt32(TPM2_RH_NULL)
                var signature: UnsafeMutablePointer<TPMT_SIGNATURE>?
                try call("Sign(approval)") {
                    Esys_Sign(esys, handle.tr, Self.password, Self.none, Self.none, &digest, &scheme, &validation, &signature)
                }
                defer { Esys_Free(signature) }
                guard let signature else { throw TPMError(command: "Sign(approval)", code: .size) }
                signatures.append(try Marshal.encode("TPMT_SIGNATURE", signature.pointee, Tss2_MU_TPMT_SIGNATURE_Marshal))
            }
            return Approval(keyPublic: blob.publicArea, keyName: keyName, signatures: signatures)
        }
    }

    /// Runs PolicyAuthorize on `session` for an approved policy: LoadExternal, VerifySignature, flush.
    public func policyAuthorize(_ session: TPMHandle, approvedPolicy: [UInt8], policyRef: [UInt8],
                                keyPublic: [UInt8], keyName: [UInt8], signature: [UInt8]) throws(TPMError) {
        try withVerifiedSignature(
            keyPublic: keyPublic, digest: sha256(approvedPolicy, policyRef), signature: signature,
            loading: "LoadExternal(approval key)", verifying: "VerifySignature(approval)"
        ) { ticket throws(TPMError) in
            try policyAuthorize(session, approvedPolicy: approvedPolicy, policyRef: policyRef, keyName: keyName, verified: ticket)
        }
    }
}

extension PolicyStep {
    /// PolicyAuthorize's digest: reset, then extend with the key's name and the policyRef.
    public static func authorizeDigest(keyName: [UInt8], policyRef: [UInt8]) -> [UInt8] {
        let first = sha256(PolicyDigest.empty, UInt32(0x16A).bigEndianBytes, keyName)
        return sha256(first, policyRef)
    }
}
