internal import CTSS2
internal import COpenSSL
import SecureMemory

/// Why a duplication blob cannot be made for a parent.
public struct DuplicationError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// TPM2 duplication blobs made without a TPM (Part 1, 23.3 "Duplication"; Part 2, 12.3.2.4–5): a
/// sealed data object whose sensitive area is protected only by the outer wrapper to a new parent,
/// so that `TPM2_Import` on that parent's TPM, and only there, accepts it.
///
/// The seed is exchanged with the parent's ECC P-256 key (ECDH, then KDFe with "DUPLICATE"), or is
/// random and RSA-OAEP encrypted to an RSA 2048 parent (label "DUPLICATE"); the outer
/// wrapper is AES-128-CFB under KDFa(seed, "STORAGE", name) with IV 0, and its integrity an HMAC-SHA256
/// under KDFa(seed, "INTEGRITY") over the encrypted sensitive area and the object's name. A
/// credential (`Attestation.makeCredential`) uses the same machinery with the EK's own hash,
/// curve and AES key size (P-384, SHA-384 and AES-256 for template H-3).
public enum Duplication {
    public struct Blob: Sendable, Hashable {
        /// Marshalled TPM2B_PUBLIC of the object.
        public var publicArea: [UInt8]
        /// Marshalled TPM2B_PRIVATE: the outer HMAC (TPM2B_DIGEST), then the encrypted TPM2B_SENSITIVE.
        public var duplicate: [UInt8]
        /// Marshalled TPM2B_ENCRYPTED_SECRET: the ephemeral ECC point (TPMS_ECC_POINT), or the RSA-OAEP ciphertext.
        public var encryptedSeed: [UInt8]
        /// The object's TPM name (0x000B and the SHA-256 of its public area).
        public var name: [UInt8]
    }

    // MARK: Key derivation (Part 1, 11.4.10)

    /// The hash of a protector's name algorithm: what KDFa, KDFe and the integrity HMAC use (Part 1, 24.4).
    public enum Hash: Sendable {
        case sha256, sha384
        var digestSize: Int { self == .sha256 ? 32 : 48 }
        func digest(_ bytes: [UInt8]) -> [UInt8] { self == .sha256 ? TPM2.sha256(bytes) : TPM2.sha384(bytes) }
        func hmac(key: SecureBytes, message: [UInt8]) -> [UInt8] {
            guard self == .sha384 else { return Sodium.hmacSHA256(key: key, message: message) }
            var out = [UInt8](repeating: 0, count: 48)
            var length = 0
            key.withUnsafeBytes { k in
                _ = EVP_Q_mac(nil, "HMAC", nil, "SHA384", nil, k.baseAddress, k.count, message, message.count, &out, out.count, &length)
            }
            return out
        }
    }

    /// KDFa (SP 800-108 counter mode, HMAC of `hash`): `[i]32 ‖ label ‖ 0x00 ‖ contextU ‖ contextV ‖ [bits]32`.
    public static func kdfa(_ hash: Hash = .sha256, key: [UInt8], label: String, contextU: [UInt8], contextV: [UInt8], bits: Int) -> [UInt8] {
        var out: [UInt8] = []
        var counter: UInt32 = 1
        let keyBytes = SecureBytes(copying: key)
        while out.count * 8 < bits {
            let message = counter.bigEndianBytes + Array(label.utf8) + [0] + contextU + contextV + UInt32(bits).bigEndianBytes
            out += hash.hmac(key: keyBytes, message: message)
            counter += 1
        }
        return Array(out.prefix((bits + 7) / 8))
    }

    /// KDFe (SP 800-56A concatenation, `hash`): `H([i]32 ‖ Z ‖ use ‖ 0x00 ‖ partyU ‖ partyV)`.
    public static func kdfe(_ hash: Hash = .sha256, z: [UInt8], use: String, partyU: [UInt8], partyV: [UInt8], bits: Int) -> [UInt8] {
        var out: [UInt8] = []
        var counter: UInt32 = 1
        while out.count * 8 < bits {
            out += hash.digest(counter.bigEndianBytes + z + Array(use.utf8) + [0] + partyU + partyV)
            counter += 1
        }
        return Array(out.prefix((bits + 7) / 8))
    }

    /// What an outer wrapper is made with (Part 1, 24.4): the protector's name algorithm and the
    /// AES key size of its symmetric definition (CFB, the only mode a storage key has here).
    struct Protector {
        var area: TPMT_PUBLIC
        var hash: Hash
        var aesBits: Int
    }

    // MARK: The object

    /// A sealed data object (KEYEDHASH, SHA-256 name, not fixedTPM/fixedParent) holding `secret`
    /// (at most 128 bytes), with `policy` as authPolicy (userWithAuth only when it is empty).
    /// Returns the public area and the marshalled TPM2B_SENSITIVE (in locked memory).
    public static func sealedObject(_ secret: SecureBytes, policy: [UInt8]) throws(DuplicationError) -> (publicArea: [UInt8], sensitive: SecureBytes) {
        guard secret.count <= 128 else { throw DuplicationError("a sealed data object holds at most 128 bytes") }
        var attributes = TPMA_OBJECT_NODA | TPMA_OBJECT_ADMINWITHPOLICY
        if policy.isEmpty { attributes |= TPMA_OBJECT_USERWITHAUTH }
        var pub = TPMContext.keyedHash(attributes: attributes, policy: policy, hmac: false)
        // unique = H(seedValue ‖ data): the TPM checks this binding on import (Part 1, 27.7.4).
        let seedValue = Sodium.randomBytes(32)
        let unique = secret.withUnsafeBytes { sha256(seedValue, Array($0)) }
        pub.publicArea.unique.keyedHash.size = TPM2B.set(&pub.publicArea.unique.keyedHash.buffer, unique)
        var sensitive = TPM2B_SENSITIVE()
        defer { withUnsafeMutableBytes(of: &sensitive) { _ = $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        sensitive.sensitiveArea.sensitiveType = UInt16(TPM2_ALG_KEYEDHASH)
        sensitive.sensitiveArea.seedValue.size = TPM2B.set(&sensitive.sensitiveArea.seedValue.buffer, seedValue)
        secret.withUnsafeBytes { sensitive.sensitiveArea.sensitive.bits.size = TPM2B.set(&sensitive.sensitiveArea.sensitive.bits.buffer, $0) }
        let marshalled = SecureBytes(count: MemoryLayout<TPM2B_SENSITIVE>.size + 8)
        var offset = 0
        let rc = marshalled.withUnsafeMutableBytes { raw in
            Tss2_MU_TPM2B_SENSITIVE_Marshal(&sensitive, raw.baseAddress!.assumingMemoryBound(to: UInt8.self), raw.count, &offset)
        }
        guard rc == 0 else { throw DuplicationError("cannot marshal the sensitive area (\(rc))") }
        let publicArea: [UInt8]
        do { publicArea = try Marshal.public(pub) } catch { throw DuplicationError("cannot marshal the public area") }
        return (publicArea, marshalled.withUnsafeBytes { SecureBytes(copying: $0.prefix(offset)) })
    }

    /// The TPM name of a marshalled TPM2B_PUBLIC whose nameAlg is SHA-256.
    public static func name(ofPublic bytes: [UInt8]) -> [UInt8] {
        [0x00, 0x0B] + sha256(Array(bytes.dropFirst(2)))
    }

    // MARK: The blob

    /// A duplication blob of `secret` under `policy` for the parent whose public area is `parentPublic`:
    /// a restricted decryption ECC NIST P-256 key, nameAlg SHA-256, AES-128-CFB (the keychain's SRK).
    public static func blob(_ secret: SecureBytes, policy: [UInt8], parentPublic: [UInt8]) throws(DuplicationError) -> Blob {
        let protector = try storageParent(parentPublic)
        let (seed, encryptedSeed) = try seed(to: protector, label: "DUPLICATE")
        let object = try sealedObject(secret, policy: policy)
        let name = name(ofPublic: object.publicArea)
        let body = try outerWrap(object.sensitive, seed: seed, name: name, protector: protector)
        return Blob(publicArea: object.publicArea, duplicate: UInt16(body.count).bigEndianBytes + body,
                    encryptedSeed: encryptedSeed, name: name)
    }

    /// The public area of a parent a duplication blob can be made for: a restricted decryption key
    /// with a SHA-256 name and AES-128-CFB (the keychain's SRK, an EK of template L-1 or L-2).
    static func storageParent(_ parentPublic: [UInt8]) throws(DuplicationError) -> Protector {
        let parent: TPM2B_PUBLIC
        do { parent = try Marshal.public(parentPublic) } catch { throw DuplicationError("the parent's public area does not parse") }
        let protector = try protector(parent.publicArea)
        guard protector.hash == .sha256, protector.aesBits == 128 else {
            throw DuplicationError("the parent is not a restricted decryption key with a SHA-256 name and AES-128-CFB")
        }
        return protector
    }

    /// `area` as a protector: a restricted decryption key whose name algorithm is SHA-256 or SHA-384
    /// and whose symmetric definition is AES-128-CFB or AES-256-CFB.
    static func protector(_ area: TPMT_PUBLIC) throws(DuplicationError) -> Protector {
        let restrictedDecrypt = TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT
        guard area.objectAttributes & restrictedDecrypt == restrictedDecrypt else {
            throw DuplicationError("the parent is not a restricted decryption key")
        }
        let hash: Hash
        switch area.nameAlg {
        case UInt16(TPM2_ALG_SHA256): hash = .sha256
        case UInt16(TPM2_ALG_SHA384): hash = .sha384
        default: throw DuplicationError("the parent's name algorithm is neither SHA-256 nor SHA-384")
        }
        let symmetric = area.type == UInt16(TPM2_ALG_ECC) ? area.parameters.eccDetail.symmetric : area.parameters.rsaDetail.symmetric
        guard symmetric.algorithm == UInt16(TPM2_ALG_AES), symmetric.mode.aes == UInt16(TPM2_ALG_CFB),
              symmetric.keyBits.aes == 128 || symmetric.keyBits.aes == 256 else {
            throw DuplicationError("the parent's symmetric definition is not AES-128-CFB or AES-256-CFB")
        }
        return Protector(area: area, hash: hash, aesBits: Int(symmetric.keyBits.aes))
    }

    /// A seed only the protector's private key recovers (Part 1, 11.4.10.4 and B.10.3 / C.6.4), as
    /// long as its name algorithm's digest, and its TPM2B_ENCRYPTED_SECRET: ECDH on the protector's
    /// curve (P-256 or P-384) and KDFe(`label`), or random and RSA-OAEP(`label`) for RSA 2048.
    /// `label` is "DUPLICATE" for TPM2_Import, "IDENTITY" for TPM2_ActivateCredential.
    static func seed(to protector: Protector, label: String) throws(DuplicationError) -> (seed: SecureBytes, encryptedSeed: [UInt8]) {
        let area = protector.area
        let bits = protector.hash.digestSize * 8
        if area.type == UInt16(TPM2_ALG_ECC) {
            let curve: Curve
            switch (area.parameters.eccDetail.curveID, protector.hash) {
            case (UInt16(TPM2_ECC_NIST_P256), .sha256): curve = .p256
            case (UInt16(TPM2_ECC_NIST_P384), .sha384): curve = .p384
            default: throw DuplicationError("the ECC parent is neither P-256 with SHA-256 nor P-384 with SHA-384")
            }
            let n = curve.coordinateSize
            guard area.parameters.eccDetail.kdf.scheme == UInt16(TPM2_ALG_NULL),
                  Int(area.unique.ecc.x.size) == n, Int(area.unique.ecc.y.size) == n else {
                throw DuplicationError("the ECC parent's point is not two \(n)-byte coordinates (or it names a KDF)")
            }
            let px = TPM2B.bytes(area.unique.ecc.x.buffer, size: UInt16(n)), py = TPM2B.bytes(area.unique.ecc.y.buffer, size: UInt16(n))
            let exchange = try ecdh(curve, peerX: px, peerY: py)
            let seed = SecureBytes(copying: kdfe(protector.hash, z: exchange.z, use: label, partyU: exchange.x, partyV: px, bits: bits))
            let point = UInt16(n).bigEndianBytes + exchange.x + UInt16(n).bigEndianBytes + exchange.y
            return (seed, UInt16(point.count).bigEndianBytes + point)
        } else if area.type == UInt16(TPM2_ALG_RSA) {
            guard protector.hash == .sha256, area.parameters.rsaDetail.keyBits == 2048,
                  area.parameters.rsaDetail.exponent == 0 || area.parameters.rsaDetail.exponent == 65537,
                  area.unique.rsa.size == 256 else {
                throw DuplicationError("the RSA parent is not RSA 2048 with a SHA-256 name")
            }
            // The seed is random; RSA-OAEP (SHA-256, the label with its zero) carries it (Part 1, B.10.3).
            let seed = SecureBytes(random: 32)
            let sealed = try rsaOAEP(modulus: TPM2B.bytes(area.unique.rsa.buffer, size: 256), seed, label: label)
            return (seed, UInt16(sealed.count).bigEndianBytes + sealed)
        }
        throw DuplicationError("the parent is neither ECC nor RSA")
    }

    /// The outer wrapper of `plaintext` for the object `name` (Part 1, 23.3.2.3 and 24.4): the
    /// integrity HMAC (TPM2B_DIGEST, HMAC under KDFa(seed, "INTEGRITY") over the ciphertext and the
    /// name), then the ciphertext (AES-CFB under KDFa(seed, "STORAGE", name)), unsized; the hash and
    /// the key size are the protector's.
    static func outerWrap(_ plaintext: SecureBytes, seed: SecureBytes, name: [UInt8], protector: Protector) throws(DuplicationError) -> [UInt8] {
        let hash = protector.hash
        let seedBytes = seed.withUnsafeBytes { Array($0) }
        let symKey = kdfa(hash, key: seedBytes, label: "STORAGE", contextU: name, contextV: [], bits: protector.aesBits)
        let encrypted = try aesCFB(key: symKey, plaintext)
        let hmacKey = SecureBytes(copying: kdfa(hash, key: seedBytes, label: "INTEGRITY", contextU: [], contextV: [], bits: hash.digestSize * 8))
        let outerHMAC = hash.hmac(key: hmacKey, message: encrypted + name)
        return UInt16(outerHMAC.count).bigEndianBytes + outerHMAC + encrypted
    }

    /// RSA-OAEP with SHA-256 (hash and MGF1) and the label with its terminating zero, to a public
    /// exponent of 65537 (a TPM's 0).
    static func rsaOAEP(modulus: [UInt8], _ message: SecureBytes, label: String) throws(DuplicationError) -> [UInt8] {
        let key = try rsaPublicKey(modulus: modulus)
        defer { EVP_PKEY_free(key) }
        guard let ctx = EVP_PKEY_CTX_new(key, nil) else { throw DuplicationError("libcrypto: no key context") }
        defer { EVP_PKEY_CTX_free(ctx) }
        // set0 takes the label: it must come from OpenSSL's allocator.
        let text = Array(label.utf8) + [0]
        guard let copy = CRYPTO_malloc(text.count, nil, 0) else { throw DuplicationError("libcrypto: out of memory") }
        copy.copyMemory(from: text, byteCount: text.count)
        guard EVP_PKEY_encrypt_init(ctx) == 1, EVP_PKEY_CTX_set_rsa_padding(ctx, RSA_PKCS1_OAEP_PADDING) == 1,
              EVP_PKEY_CTX_set_rsa_oaep_md(ctx, EVP_sha256()) == 1, EVP_PKEY_CTX_set_rsa_mgf1_md(ctx, EVP_sha256()) == 1 else {
            CRYPTO_free(copy, nil, 0)
            throw DuplicationError("libcrypto: cannot set RSA-OAEP")
        }
        guard EVP_PKEY_CTX_set0_rsa_oaep_label(ctx, copy, Int32(text.count)) == 1 else {
            CRYPTO_free(copy, nil, 0)
            throw DuplicationError("libcrypto: cannot set the OAEP label")
        }
        var out = [UInt8](repeating: 0, count: 256)
        var length = out.count
        let status = message.withUnsafeBytes { m in
            EVP_PKEY_encrypt(ctx, &out, &length, m.baseAddress!.assumingMemoryBound(to: UInt8.self), m.count)
        }
        guard status == 1 else { throw DuplicationError("libcrypto: RSA-OAEP failed") }
        return Array(out.prefix(length))
    }

    /// The RSA public key (`modulus`, 65537) as OpenSSL 3.0 builds one from parameters.
    static func rsaPublicKey(modulus: [UInt8]) throws(DuplicationError) -> OpaquePointer {
        let n = BN_bin2bn(modulus, Int32(modulus.count), nil), e = BN_new(), builder = OSSL_PARAM_BLD_new()
        defer { BN_free(n); BN_free(e); OSSL_PARAM_BLD_free(builder) }
        guard let n, let e, let builder, BN_set_word(e, 65537) == 1,
              KC_OSSL_PARAM_BLD_push_rsa_public(builder, n, e) == 1,
              let parameters = OSSL_PARAM_BLD_to_param(builder) else {
            throw DuplicationError("libcrypto: cannot make the RSA key")
        }
        defer { OSSL_PARAM_free(parameters) }
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "RSA", nil) else { throw DuplicationError("libcrypto: no RSA") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var key: OpaquePointer?
        guard EVP_PKEY_fromdata_init(ctx) == 1, EVP_PKEY_fromdata(ctx, &key, KC_EVP_PKEY_PUBLIC_KEY, parameters) == 1, let key else {
            throw DuplicationError("libcrypto: cannot make the RSA key")
        }
        return key
    }

    /// The curves a protector's seed is shared on.
    enum Curve {
        case p256, p384
        var coordinateSize: Int { self == .p256 ? 32 : 48 }
        var nid: Int32 { self == .p256 ? NID_X9_62_prime256v1 : NID_secp384r1 }
        var label: String { self == .p256 ? "P-256" : "P-384" }
    }

    /// An ephemeral key `d` on `curve`: its public point (x, y) and the x-coordinate of d·peer.
    static func ecdh(_ curve: Curve = .p256, peerX: [UInt8], peerY: [UInt8]) throws(DuplicationError) -> (x: [UInt8], y: [UInt8], z: [UInt8]) {
        let n = curve.coordinateSize
        guard peerX.count == n, peerY.count == n else { throw DuplicationError("the parent's point is not on \(curve.label)") }
        guard let group = EC_GROUP_new_by_curve_name(curve.nid), let ctx = BN_CTX_new() else {
            throw DuplicationError("libcrypto has no \(curve.label)")
        }
        defer { EC_GROUP_free(group); BN_CTX_free(ctx) }
        let d = BN_secure_new(), bx = BN_new(), by = BN_new(), zx = BN_new()
        let peer = EC_POINT_new(group), ephemeral = EC_POINT_new(group), shared = EC_POINT_new(group)
        defer {
            BN_clear_free(d); BN_free(bx); BN_free(by); BN_free(zx)
            EC_POINT_free(peer); EC_POINT_free(ephemeral); EC_POINT_clear_free(shared)
        }
        // set_affine_coordinates refuses a point that is not on the curve.
        guard BN_bin2bn(peerX, Int32(n), bx) != nil, BN_bin2bn(peerY, Int32(n), by) != nil,
              EC_POINT_set_affine_coordinates(group, peer, bx, by, ctx) == 1 else {
            throw DuplicationError("the parent's public point is not on \(curve.label)")
        }
        guard BN_priv_rand_range(d, EC_GROUP_get0_order(group)) == 1, BN_is_zero(d) == 0,
              EC_POINT_mul(group, ephemeral, d, nil, nil, ctx) == 1,
              EC_POINT_mul(group, shared, nil, peer, d, ctx) == 1,
              EC_POINT_get_affine_coordinates(group, ephemeral, bx, by, ctx) == 1,
              EC_POINT_get_affine_coordinates(group, shared, zx, nil, ctx) == 1 else {
            throw DuplicationError("\(curve.label) key agreement failed")
        }
        var x = [UInt8](repeating: 0, count: n), y = x, z = x
        guard BN_bn2binpad(bx, &x, Int32(n)) == Int32(n), BN_bn2binpad(by, &y, Int32(n)) == Int32(n), BN_bn2binpad(zx, &z, Int32(n)) == Int32(n) else {
            throw DuplicationError("\(curve.label) coordinates do not fit \(n) bytes")
        }
        return (x, y, z)
    }

    /// AES-CFB with a zero IV (Part 1, 23.3.2.3: the key is used once); AES-128 or AES-256 by the key's length.
    static func aesCFB(key: [UInt8], _ plaintext: SecureBytes) throws(DuplicationError) -> [UInt8] {
        guard key.count == 16 || key.count == 32 else { throw DuplicationError("an AES key is 16 or 32 bytes") }
        guard let ctx = EVP_CIPHER_CTX_new() else { throw DuplicationError("libcrypto: no cipher context") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        let cipher = key.count == 16 ? EVP_aes_128_cfb128() : EVP_aes_256_cfb128()
        let iv = [UInt8](repeating: 0, count: 16)
        var out = [UInt8](repeating: 0, count: plaintext.count + 16)
        var n: Int32 = 0, tail: Int32 = 0
        let ok = plaintext.withUnsafeBytes { input in
            EVP_EncryptInit_ex(ctx, cipher, nil, key, iv) == 1
                && EVP_EncryptUpdate(ctx, &out, &n, input.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32(input.count)) == 1
                && out.withUnsafeMutableBufferPointer { EVP_EncryptFinal_ex(ctx, $0.baseAddress! + Int(n), &tail) } == 1
        }
        guard ok else { throw DuplicationError("libcrypto: AES-CFB failed") }
        return Array(out.prefix(Int(n + tail)))
    }
}

extension TPMContext {
    /// TPM2_Import (Part 3, 13.3) of a duplication blob under `parent` (no inner wrapper): the
    /// object's private area as this TPM wraps it, loadable under `parent` with `load`.
    /// - Throws: `INTEGRITY` when the outer HMAC fails (another parent, or a changed blob), `BINDING`
    ///   when the public and sensitive areas do not belong together.
    public func importDuplicate(publicArea: [UInt8], duplicate: [UInt8], encryptedSeed: [UInt8],
                                parent: TPMHandle) throws(TPMError) -> [UInt8] {
        try importDuplicate(publicArea: publicArea, duplicate: duplicate, encryptedSeed: encryptedSeed, parent: parent,
                            authorization: Self.password)
    }

    func importDuplicate(publicArea: [UInt8], duplicate: [UInt8], encryptedSeed: [UInt8],
                         parent: TPMHandle, authorization: ESYS_TR) throws(TPMError) -> [UInt8] {
        var objectPublic = try Marshal.public(publicArea)
        var dup = try Marshal.private(duplicate)
        var seed = try Marshal.decode("TPM2B_ENCRYPTED_SECRET", encryptedSeed, as: TPM2B_ENCRYPTED_SECRET(),
                                      Tss2_MU_TPM2B_ENCRYPTED_SECRET_Unmarshal)
        var encryptionKey = TPM2B_DATA()
        var symmetric = TPMT_SYM_DEF_OBJECT()
        symmetric.algorithm = UInt16(TPM2_ALG_NULL)
        var outPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
        try call("Import", sessions: [authorization]) {
            Esys_Import(esys, parent.tr, authorization, Self.none, Self.none, &encryptionKey, &objectPublic, &dup, &seed,
                        &symmetric, &outPrivate)
        }
        defer { Esys_Free(outPrivate) }
        return try Marshal.private(outPrivate!.pointee)
    }
}
