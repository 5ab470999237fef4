internal import CTSS2
internal import COpenSSL
import SecureMemory
import KeychainBasics

/// SHA-384 (the high-range EK templates' name algorithm).
public func sha384(_ bytes: [UInt8]) -> [UInt8] {
    var out = [UInt8](repeating: 0, count: 48)
    var length: UInt32 = 0
    _ = EVP_Digest(bytes, bytes.count, &out, &length, EVP_sha384(), nil)
    return out
}

/// Why an attestation does not verify, or cannot be made.
public struct AttestationError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// The attestation key (AK) and what it signs, on the device: TPM2_Create of a restricted signing
/// key under the EK (as `tpm2_createak` makes one), TPM2_ActivateCredential (Part 3, 12.5),
/// TPM2_Quote (18.4) and TPM2_Certify (18.2).
extension TPMContext {
    /// The AK's template: RSA 2048, RSASSA-SHA256, restricted signing, fixedTPM, fixedParent,
    /// sensitiveDataOrigin, userWithAuth (an empty authValue), noDA; no authPolicy.
    static func attestationKeyTemplate() -> TPM2B_PUBLIC {
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.type = UInt16(TPM2_ALG_RSA)
        inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
        inPublic.publicArea.objectAttributes = Attestation.attestationKeyAttributes
        inPublic.publicArea.parameters.rsaDetail.symmetric.algorithm = UInt16(TPM2_ALG_NULL)
        inPublic.publicArea.parameters.rsaDetail.scheme.scheme = UInt16(TPM2_ALG_RSASSA)
        inPublic.publicArea.parameters.rsaDetail.scheme.details.rsassa.hashAlg = UInt16(TPM2_ALG_SHA256)
        inPublic.publicArea.parameters.rsaDetail.keyBits = 2048
        inPublic.publicArea.parameters.rsaDetail.exponent = 0
        return inPublic
    }

    /// A new AK under the EK (authorized by the EK's policy); its blob loads only under that EK.
    public func createAttestationKey(endorsementKey ek: TPMHandle) throws(TPMError) -> SealedBlob {
        try withTransient { () throws(TPMError) -> SealedBlob in
            // continueSession clear: the Create closes the session; on an error the scope flushes it.
            try create(Self.attestationKeyTemplate(), sensitive: nil, parent: ek, session: try endorsementSession(), command: "Create(AK)")
        }
    }

    /// TPM2_ActivateCredential: the credential `credentialBlob` (TPM2B_ID_OBJECT) and `secret`
    /// (TPM2B_ENCRYPTED_SECRET) protect, when they were made for this EK and the loaded `ak`'s name.
    /// The EK's USER role: its policy (PolicySecret on the endorsement hierarchy) for templates L-1
    /// and L-2; its empty authValue for H-3, whose userWithAuth is set (its PolicyB is SHA-384).
    /// - Throws: `INTEGRITY` (or a `VALUE`/`SIZE` error) when they were made for another EK or key.
    public func activateCredential(ak: TPMHandle, endorsementKey ek: TPMHandle, type: EndorsementKeyType = .rsa2048,
                                   credentialBlob: [UInt8], secret: [UInt8]) throws(TPMError) -> SecureBytes {
        var blob = try Marshal.decode("TPM2B_ID_OBJECT", credentialBlob, as: TPM2B_ID_OBJECT(), Tss2_MU_TPM2B_ID_OBJECT_Unmarshal)
        var encrypted = try Marshal.decode("TPM2B_ENCRYPTED_SECRET", secret, as: TPM2B_ENCRYPTED_SECRET(),
                                           Tss2_MU_TPM2B_ENCRYPTED_SECRET_Unmarshal)
        var certInfo: UnsafeMutablePointer<TPM2B_DIGEST>?
        try withTransient { () throws(TPMError) in
            let session = type.userWithAuth ? Self.password : try endorsementSession().tr
            // The AK's role is ADMIN: with adminWithPolicy clear its (empty) authValue serves.
            try call("ActivateCredential", sessions: [session]) {
                Esys_ActivateCredential(esys, ak.tr, ek.tr, Self.password, session, Self.none, &blob, &encrypted, &certInfo)
            }
        }
        guard let certInfo else { throw TPMError(command: "ActivateCredential", code: .failure) }
        defer { TPM2B.wipe(&certInfo.pointee); Esys_Free(certInfo) }
        return withUnsafeBytes(of: certInfo.pointee.buffer) { SecureBytes(copying: $0.prefix(Int(certInfo.pointee.size))) }
    }

    /// A signed statement and its signature: TPMS_ATTEST as the TPM marshalled it (what
    /// `tpm2_quote -m` writes) and the TPMT_SIGNATURE (`-s`).
    public struct SignedAttestation: Sendable, Hashable {
        public var attest: [UInt8]
        public var signature: [UInt8]
        public init(attest: [UInt8], signature: [UInt8]) { self.attest = attest; self.signature = signature }
    }

    /// TPM2_Quote by `ak` of the SHA-256 bank's `selection`, over `nonce` (qualifyingData).
    public func quote(ak: TPMHandle, selection: PCRSelection, nonce: [UInt8]) throws(TPMError) -> SignedAttestation {
        var pcrs = Marshal.pcrSelection(selection)
        return try statement("Quote", nonce: nonce) { qualifying, scheme, quoted, signature in
            Esys_Quote(esys, ak.tr, Self.password, Self.none, Self.none, qualifying, scheme, &pcrs, quoted, signature)
        }
    }

    /// TPM2_Certify by `ak` of the loaded or persistent `object` (whose admin role its empty
    /// authValue satisfies, as the SRK's), over `nonce`.
    public func certify(_ object: TPMHandle, ak: TPMHandle, nonce: [UInt8]) throws(TPMError) -> SignedAttestation {
        try statement("Certify", nonce: nonce) { qualifying, scheme, info, signature in
            Esys_Certify(esys, object.tr, ak.tr, Self.password, Self.password, Self.none, qualifying, scheme, info, signature)
        }
    }

    /// TPM2_CertifyCreation by `ak` of the loaded `object` (Part 3, 18.3), over `nonce`: that this
    /// TPM made the object whose creation data hashes to `creation.hash`. Needs no authorization of
    /// the object (a wrapping key's ADMIN role is its policy, which has no Certify branch).
    public func certifyCreation(_ object: TPMHandle, ak: TPMHandle, creation: Creation, nonce: [UInt8]) throws(TPMError) -> SignedAttestation {
        var hash = TPM2B_DIGEST()
        hash.size = TPM2B.set(&hash.buffer, creation.hash)
        var ticket = try Marshal.decode("TPMT_TK_CREATION", creation.ticket, as: TPMT_TK_CREATION(), Tss2_MU_TPMT_TK_CREATION_Unmarshal)
        return try statement("CertifyCreation", nonce: nonce) { qualifying, scheme, info, signature in
            Esys_CertifyCreation(esys, ak.tr, object.tr, Self.password, Self.none, Self.none, qualifying, &hash, scheme, &ticket, info, signature)
        }
    }

    /// TPM2_NV_Certify by `ak` of the whole of the NV index `index` (read with its empty authValue:
    /// TPMA_NV_AUTHREAD), over `nonce` (Part 3, 31.16).
    public func certifyNV(_ index: TPMHandle, size: UInt16, ak: TPMHandle, nonce: [UInt8]) throws(TPMError) -> SignedAttestation {
        try statement("NV_Certify", nonce: nonce) { qualifying, scheme, info, signature in
            Esys_NV_Certify(esys, ak.tr, index.tr, index.tr, Self.password, Self.password, Self.none, qualifying, scheme, size, 0, info, signature)
        }
    }

    /// What every attestation command shares: the nonce as qualifyingData, the AK's own scheme
    /// (RSASSA-SHA256), a TPM2B_ATTEST and a TPMT_SIGNATURE out, freed on every path.
    private func statement(_ command: String, nonce: [UInt8],
                           _ body: (UnsafePointer<TPM2B_DATA>, UnsafePointer<TPMT_SIG_SCHEME>,
                                    UnsafeMutablePointer<UnsafeMutablePointer<TPM2B_ATTEST>?>,
                                    UnsafeMutablePointer<UnsafeMutablePointer<TPMT_SIGNATURE>?>) -> TSS2_RC) throws(TPMError) -> SignedAttestation {
        var qualifying = TPM2B_DATA()
        qualifying.size = TPM2B.set(&qualifying.buffer, nonce)
        var scheme = TPMT_SIG_SCHEME()
        scheme.scheme = UInt16(TPM2_ALG_NULL)
        var info: UnsafeMutablePointer<TPM2B_ATTEST>?
        var signature: UnsafeMutablePointer<TPMT_SIGNATURE>?
        defer { Esys_Free(info); Esys_Free(signature) }
        try call(command) { body(&qualifying, &scheme, &info, &signature) }
        return try Self.signed(info, signature)
    }

    private static func signed(_ attest: UnsafeMutablePointer<TPM2B_ATTEST>?,
                               _ signature: UnsafeMutablePointer<TPMT_SIGNATURE>?) throws(TPMError) -> SignedAttestation {
        guard let attest, let signature else { throw TPMError(command: "attest", code: .failure) }
        return SignedAttestation(attest: TPM2B.bytes(attest.pointee.attestationData, size: attest.pointee.size),
                                 signature: try Marshal.encode("TPMT_SIGNATURE", signature.pointee, Tss2_MU_TPMT_SIGNATURE_Marshal))
    }
}

/// The server's half, with no TPM: TPM2_MakeCredential computed offline, and the checks of what the
/// AK signed.
public enum Attestation {
    static let attestationKeyAttributes: TPMA_OBJECT = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
        | TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA
        | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_SIGN_ENCRYPT

    /// TPM2_MakeCredential (Part 3, 12.6) as a verifier computes it: the credential (at most 32
    /// bytes) wrapped for the object named `objectName` in the TPM holding the EK `endorsementPublic`,
    /// with the machinery of a duplication blob (the seed's label is "IDENTITY"). The EK decides the
    /// rest (Part 1, 24.4): RSA-OAEP for an RSA EK; for an ECC EK an ephemeral key on its curve,
    /// Z = ECDH, seed = KDFe(nameAlg, Z, "IDENTITY", ephemeral x, EK x); KDFa, the HMAC and the
    /// AES key size are its name algorithm's and its symmetric definition's.
    /// - Returns: the TPM2B_ID_OBJECT and the TPM2B_ENCRYPTED_SECRET, marshalled.
    public static func makeCredential(_ credential: SecureBytes, objectName: [UInt8],
                                      endorsementPublic: [UInt8]) throws(AttestationError) -> (credentialBlob: [UInt8], secret: [UInt8]) {
        guard (1...32).contains(credential.count) else { throw AttestationError("a credential is 1 to 32 bytes") }
        guard objectName.count == 34, objectName.starts(with: [0x00, 0x0B]) else {
            throw AttestationError("the key's name is not a SHA-256 name (34 bytes, 000b…)")
        }
        do {
            let protector = try Duplication.protector(try parsePublic(endorsementPublic, what: "the EK").publicArea)
            let (seed, encryptedSeed) = try Duplication.seed(to: protector, label: "IDENTITY")
            // encIdentity covers the credential's TPM2B size field too (Part 2, 12.4.2).
            let plaintext = credential.withUnsafeBytes { SecureBytes(copying: UInt16(credential.count).bigEndianBytes + Array($0)) }
            let body = try Duplication.outerWrap(plaintext, seed: seed, name: objectName, protector: protector)
            return (UInt16(body.count).bigEndianBytes + body, encryptedSeed)
        } catch let error as DuplicationError {
            throw AttestationError(error.description)
        } catch {
            throw AttestationError("\(error)")
        }
    }

    /// What an AK's public area must be for its signatures to mean "this TPM": a restricted
    /// signing RSA 2048 key (RSASSA-SHA256), fixedTPM and fixedParent, made in the TPM.
    /// - Returns: its modulus.
    public static func checkAttestationKey(_ publicArea: [UInt8]) throws(AttestationError) -> [UInt8] {
        let area = try parsePublic(publicArea, what: "the attestation key").publicArea
        guard area.type == UInt16(TPM2_ALG_RSA), area.nameAlg == UInt16(TPM2_ALG_SHA256),
              area.parameters.rsaDetail.symmetric.algorithm == UInt16(TPM2_ALG_NULL),
              area.parameters.rsaDetail.keyBits == 2048, area.unique.rsa.size == 256,
              area.parameters.rsaDetail.exponent == 0 || area.parameters.rsaDetail.exponent == 65537,
              area.parameters.rsaDetail.scheme.scheme == UInt16(TPM2_ALG_RSASSA),
              area.parameters.rsaDetail.scheme.details.rsassa.hashAlg == UInt16(TPM2_ALG_SHA256) else {
            throw AttestationError("the attestation key is not a restricted RSA 2048 RSASSA-SHA256 signing key, fixedTPM and fixedParent, made in the TPM")
        }
        let differences = attributeDifferences(area.objectAttributes, expected: attestationKeyAttributes)
            + (area.authPolicy.size == 0 ? [] : ["an authPolicy (the template's is empty)"])
        guard differences.isEmpty else {
            throw AttestationError("the attestation key is not made from the keychain's AK template: " + differences.joined(separator: ", ")
                                   + ". Only an AK whose ADMIN role is its authValue proves it lives in the TPM: a software key's "
                                   + "public area with a policy anyone satisfies, loaded with TPM2_LoadExternal, activates the credential too")
        }
        return TPM2B.bytes(area.unique.rsa.buffer, size: 256)
    }

    /// The object attributes by their names in Part 2, 8.3 (TPMA_OBJECT).
    private static let attributeNames: [(TPMA_OBJECT, String)] = [
        (TPMA_OBJECT_FIXEDTPM, "fixedTPM"), (TPMA_OBJECT_STCLEAR, "stClear"), (TPMA_OBJECT_FIXEDPARENT, "fixedParent"),
        (TPMA_OBJECT_SENSITIVEDATAORIGIN, "sensitiveDataOrigin"), (TPMA_OBJECT_USERWITHAUTH, "userWithAuth"),
        (TPMA_OBJECT_ADMINWITHPOLICY, "adminWithPolicy"), (TPMA_OBJECT_NODA, "noDA"),
        (TPMA_OBJECT_ENCRYPTEDDUPLICATION, "encryptedDuplication"), (TPMA_OBJECT_RESTRICTED, "restricted"),
        (TPMA_OBJECT_DECRYPT, "decrypt"), (TPMA_OBJECT_SIGN_ENCRYPT, "sign"),
    ]

    /// How `attributes` differ from `expected`, in words: "adminWithPolicy set", "fixedTPM clear".
    static func attributeDifferences(_ attributes: TPMA_OBJECT, expected: TPMA_OBJECT) -> [String] {
        var differences: [String] = []
        for (bit, name) in attributeNames where attributes & bit != expected & bit {
            differences.append(name + (attributes & bit != 0 ? " set" : " clear"))
        }
        let named = attributeNames.reduce(TPMA_OBJECT(0)) { $0 | $1.0 }
        if case let other = (attributes ^ expected) & ~named, other != 0 {
            differences.append("reserved bits 0x" + Hex.encode(other, digits: 1))
        }
        return differences
    }

    /// fixedTPM and fixedParent of a marshalled public area: an object that never leaves its TPM.
    public static func isFixedToItsTPM(_ publicArea: [UInt8]) throws(AttestationError) -> Bool {
        let attributes = try parsePublic(publicArea, what: "the certified key").publicArea.objectAttributes
        let fixed = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
        return attributes & fixed == fixed
    }

    /// What a TPM2_Quote says, once its signature verified.
    public struct Quote: Sendable, Hashable {
        public var nonce: [UInt8]
        /// The SHA-256 bank's PCR indices it covers.
        public var pcrs: [Int]
        /// SHA-256 of the selected PCR values in index order.
        public var pcrDigest: [UInt8]
        /// The TPM's clock: resets (TPM2_Startup(CLEAR), a reboot) and restarts since it was made.
        public var resetCount: UInt32
        public var restartCount: UInt32
    }

    /// What a TPM2_Certify says, once its signature verified: the certified object's name.
    public struct Certification: Sendable, Hashable {
        public var nonce: [UInt8]
        public var name: [UInt8]
    }

    /// Verifies `signed` as a TPM2_Quote by the AK `akPublic` and reads it.
    /// - Throws: why not: a malformed structure, not made by a TPM, not a quote, a bad signature.
    public static func verifyQuote(_ signed: TPMContext.SignedAttestation, akPublic: [UInt8]) throws(AttestationError) -> Quote {
        let attest = try verified(signed, akPublic: akPublic, type: TPM2_ST_ATTEST_QUOTE, what: "quote")
        let quote = attest.attested.quote
        guard quote.pcrSelect.count == 1, quote.pcrSelect.pcrSelections.0.hash == UInt16(TPM2_ALG_SHA256),
              quote.pcrSelect.pcrSelections.0.sizeofSelect == 3 else {
            throw AttestationError("the quote does not cover one SHA-256 bank of 24 PCRs")
        }
        let bitmap = withUnsafeBytes(of: quote.pcrSelect.pcrSelections.0.pcrSelect) { Array($0.prefix(3)) }
        let pcrs = (0..<24).filter { bitmap[$0 / 8] & UInt8(1 << ($0 % 8)) != 0 }
        return Quote(nonce: TPM2B.bytes(attest.extraData.buffer, size: attest.extraData.size), pcrs: pcrs,
                     pcrDigest: TPM2B.bytes(quote.pcrDigest.buffer, size: quote.pcrDigest.size),
                     resetCount: attest.clockInfo.resetCount, restartCount: attest.clockInfo.restartCount)
    }

    /// What a TPM2_CertifyCreation says: the TPM made the object `name`, with creation data hashing to `creationHash`.
    public struct CreationCertification: Sendable, Hashable {
        public var nonce: [UInt8]
        public var name: [UInt8]
        public var creationHash: [UInt8]
    }

    /// What a TPM2_NV_Certify says: the index's name (its public area, attributes and policy) and contents.
    public struct NVCertification: Sendable, Hashable {
        public var nonce: [UInt8]
        public var indexName: [UInt8]
        public var offset: UInt16
        public var contents: [UInt8]
    }

    /// Verifies `signed` as a TPM2_CertifyCreation by the AK `akPublic` and reads it.
    public static func verifyCreationCertification(_ signed: TPMContext.SignedAttestation,
                                                   akPublic: [UInt8]) throws(AttestationError) -> CreationCertification {
        let attest = try verified(signed, akPublic: akPublic, type: TPM2_ST_ATTEST_CREATION, what: "creation certification")
        let info = attest.attested.creation
        return CreationCertification(nonce: TPM2B.bytes(attest.extraData.buffer, size: attest.extraData.size),
                                     name: TPM2B.bytes(info.objectName.name, size: info.objectName.size),
                                     creationHash: TPM2B.bytes(info.creationHash.buffer, size: info.creationHash.size))
    }

    /// Verifies `signed` as a TPM2_NV_Certify by the AK `akPublic` and reads it.
    public static func verifyNVCertification(_ signed: TPMContext.SignedAttestation, akPublic: [UInt8]) throws(AttestationError) -> NVCertification {
        let attest = try verified(signed, akPublic: akPublic, type: TPM2_ST_ATTEST_NV, what: "NV certification")
        let info = attest.attested.nv
        return NVCertification(nonce: TPM2B.bytes(attest.extraData.buffer, size: attest.extraData.size),
                               indexName: TPM2B.bytes(info.indexName.name, size: info.indexName.size), offset: info.offset,
                               contents: TPM2B.bytes(info.nvContents.buffer, size: info.nvContents.size))
    }

    /// The parent's name in a marshalled TPM2B_CREATION_DATA whose TPMS_CREATION_DATA hashes (SHA-256) to `hash`.
    public static func creationParent(_ creationData: [UInt8], hash: [UInt8]) throws(AttestationError) -> [UInt8] {
        guard creationData.count > 2, Int(creationData[0]) << 8 | Int(creationData[1]) == creationData.count - 2,
              sha256(Array(creationData[2...])) == hash else {
            throw AttestationError("the key's creation data is not the one the TPM certified")
        }
        let data: TPM2B_CREATION_DATA
        do {
            data = try Marshal.decode("TPM2B_CREATION_DATA", creationData, as: TPM2B_CREATION_DATA(), Tss2_MU_TPM2B_CREATION_DATA_Unmarshal)
        } catch { throw AttestationError("the key's creation data does not parse (\(error))") }
        return TPM2B.bytes(data.creationData.parentName.name, size: data.creationData.parentName.size)
    }

    /// What a sealed object's public area says: its attributes as flags, and its authPolicy.
    public struct SealedObject: Sendable, Hashable {
        public var fixedTPM: Bool
        public var fixedParent: Bool
        public var userWithAuth: Bool
        public var adminWithPolicy: Bool
        public var authPolicy: [UInt8]
    }

    /// A keyedHash (sealed data) public area, read.
    public static func sealedObject(_ publicArea: [UInt8]) throws(AttestationError) -> SealedObject {
        let area = try parsePublic(publicArea, what: "the wrapping key").publicArea
        guard area.type == UInt16(TPM2_ALG_KEYEDHASH), area.nameAlg == UInt16(TPM2_ALG_SHA256) else {
            throw AttestationError("the wrapping key is not a sealed data object with a SHA-256 name")
        }
        let a = area.objectAttributes
        return SealedObject(fixedTPM: a & TPMA_OBJECT_FIXEDTPM != 0, fixedParent: a & TPMA_OBJECT_FIXEDPARENT != 0,
                            userWithAuth: a & TPMA_OBJECT_USERWITHAUTH != 0, adminWithPolicy: a & TPMA_OBJECT_ADMINWITHPOLICY != 0,
                            authPolicy: TPM2B.bytes(area.authPolicy.buffer, size: area.authPolicy.size))
    }

    /// Verifies `signed` as a TPM2_Certify by the AK `akPublic` and reads it.
    public static func verifyCertification(_ signed: TPMContext.SignedAttestation, akPublic: [UInt8]) throws(AttestationError) -> Certification {
        let attest = try verified(signed, akPublic: akPublic, type: TPM2_ST_ATTEST_CERTIFY, what: "certification")
        let name = attest.attested.certify.name
        return Certification(nonce: TPM2B.bytes(attest.extraData.buffer, size: attest.extraData.size),
                             name: TPM2B.bytes(name.name, size: name.size))
    }

    /// The TPMS_ATTEST of `signed`, once its RSASSA-SHA256 signature by the AK verified; of `type`
    /// and marked TPM_GENERATED_VALUE (the TPM signs that mark only over what it made itself).
    private static func verified(_ signed: TPMContext.SignedAttestation, akPublic: [UInt8], type: TPM2_ST,
                                 what: String) throws(AttestationError) -> TPMS_ATTEST {
        let modulus = try checkAttestationKey(akPublic)
        let signature: TPMT_SIGNATURE
        do {
            signature = try Marshal.decode("TPMT_SIGNATURE", signed.signature, as: TPMT_SIGNATURE(), Tss2_MU_TPMT_SIGNATURE_Unmarshal)
        } catch {
            throw AttestationError("the \(what)'s signature is not a TPMT_SIGNATURE (\(error))")
        }
        guard signature.sigAlg == UInt16(TPM2_ALG_RSASSA), signature.signature.rsassa.hash == UInt16(TPM2_ALG_SHA256),
              signature.signature.rsassa.sig.size == 256 else {
            throw AttestationError("the \(what) is not signed with RSASSA-SHA256 by an RSA 2048 key")
        }
        let bytes = TPM2B.bytes(signature.signature.rsassa.sig.buffer, size: 256)
        guard try verifyRSASSA(modulus: modulus, message: signed.attest, signature: bytes) else {
            throw AttestationError("the \(what)'s signature does not verify with the attestation key")
        }
        let attest: TPMS_ATTEST
        do { attest = try Marshal.decode("TPMS_ATTEST", signed.attest, as: TPMS_ATTEST(), Tss2_MU_TPMS_ATTEST_Unmarshal) } catch {
            throw AttestationError("the \(what) is not a TPMS_ATTEST (\(error))")
        }
        guard attest.magic == 0xFF54_4347,  // TPM_GENERATED_VALUE (the header's form does not import)
              attest.type == type else {
            throw AttestationError("the signed statement is not a TPM-made \(what)")
        }
        return attest
    }

    /// RSASSA-PKCS1-v1_5 with SHA-256 under the public key (`modulus`, 65537).
    private static func verifyRSASSA(modulus: [UInt8], message: [UInt8], signature: [UInt8]) throws(AttestationError) -> Bool {
        let key: OpaquePointer
        do { key = try Duplication.rsaPublicKey(modulus: modulus) } catch { throw AttestationError(error.description) }
        defer { EVP_PKEY_free(key) }
        guard let ctx = EVP_MD_CTX_new() else { throw AttestationError("libcrypto: no digest context") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, key) == 1 else { throw AttestationError("libcrypto: cannot verify RSASSA") }
        return EVP_DigestVerify(ctx, signature, signature.count, message, message.count) == 1
    }

    private static func parsePublic(_ bytes: [UInt8], what: String) throws(AttestationError) -> TPM2B_PUBLIC {
        do { return try Marshal.public(bytes) } catch { throw AttestationError("\(what)'s public area does not parse (\(error))") }
    }
}
