internal import CP11Kit
import SecureMemory

/// A storage's wrapping key on the token, in one of the three schemes, named by its label and ID.
///
/// The object handles are this session's; in a later session they are looked up again by label,
/// ID and class.
public struct WrappingKey: Sendable, Hashable {
    public let scheme: WrappingScheme
    public let label: String
    public let id: [UInt8]
    /// The AES key, or the private key of the pair.
    let secret: CK_OBJECT_HANDLE
    /// The public key of an RSA or EC pair.
    let publicKey: CK_OBJECT_HANDLE?
    /// The EC pair's public point, uncompressed (65 bytes): the peer of every ECDH seal.
    let publicPoint: [UInt8]?
    /// The token session the handles are valid in.
    let epoch: UInt64
}

/// A key's attributes as the token reports them (`C_GetAttributeValue`), as `pkcs11-tool --list-objects` shows them.
public struct KeyAttributes: Sendable, Equatable {
    public let token: Bool
    public let sensitive: Bool
    public let extractable: Bool
    public let alwaysSensitive: Bool
    public let neverExtractable: Bool
    public let encrypt: Bool
    public let decrypt: Bool
    public let sign: Bool
    public let verify: Bool
    public let wrap: Bool
    public let unwrap: Bool
    public let derive: Bool
}

/// The first byte of every sealed data key: the scheme and its parameters, so a reader knows how to
/// open it whatever the token's key is. A sealed key of exactly 60 bytes has no such byte: AES-GCM from
/// before the byte existed (IV ‖ ciphertext ‖ tag of a 32-byte key); no format below is 60 bytes long.
enum SealedFormat: UInt8 {
    case aesGCM = 1
    case rsaOAEPSHA256 = 2
    case rsaOAEPSHA1 = 3
    case ecdhP256 = 4
    /// AES-GCM without the format byte, and its associated data as given.
    static let legacyAESGCMLength = 12 + 32 + 16

    var scheme: WrappingScheme {
        switch self {
        case .aesGCM: .aesGCM
        case .rsaOAEPSHA256, .rsaOAEPSHA1: .rsaOAEP
        case .ecdhP256: .ecdhP256
        }
    }
}

extension PKCS11Token {
    /// AES-GCM as PKCS#11 2.40 §2.12.3 describes it: a 96-bit IV and a 128-bit tag.
    static let gcmIVLength = 12
    static let gcmTagLength = 16
    /// P-256 (prime256v1) as a DER object identifier, for `CKA_EC_PARAMS`.
    static let p256Parameters: [UInt8] = [0x06, 0x08, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]
    static let p256PointLength = 65

    /// The wrapping key with this label and ID, whatever its scheme; nil when the token has none.
    public func wrappingKey(label: String, id: [UInt8]) throws(PKCS11Error) -> WrappingKey? {
        try withSession { session throws(PKCS11Error) in try findWrappingKey(session, label: label, id: id) }
    }

    /// The wrapping key with this label and ID; when missing and `create` is true, made on the token
    /// in the first scheme its mechanisms allow. A token with none of the three throws
    /// `CKR_MECHANISM_INVALID` naming what each lacks, and nothing is made.
    ///
    /// - Important: making a key is not atomic across processes. Hold the store's lock around a call
    ///   with `create: true`; if two keys with one label and ID exist anyway, the lowest handle wins.
    public func wrappingKey(label: String, id: [UInt8], create: Bool) throws(PKCS11Error) -> WrappingKey? {
        if let found = try wrappingKey(label: label, id: id) { return found }
        guard create else { return nil }
        return try createWrappingKey(label: label, id: id, scheme: preferredScheme())
    }

    /// Makes a wrapping key in `scheme` and checks it seals and opens; any step that fails destroys
    /// what the earlier ones made, so a failure leaves nothing on the token.
    ///
    /// The secret half never leaves the token: sensitive, not extractable, private, not modifiable,
    /// usable only for its one operation (decrypt, or derive for EC).
    public func createWrappingKey(label: String, id: [UInt8], scheme: WrappingScheme) throws(PKCS11Error) -> WrappingKey {
        try withSession { session throws(PKCS11Error) in
            var made: [CK_OBJECT_HANDLE] = []
            do throws(PKCS11Error) {
                let key: WrappingKey
                switch scheme {
                case .aesGCM:
                    let template = secretTemplate(label: label, id: id)
                    made = try generate(session, "AES key", [template]) { templates throws(PKCS11Error) in
                        [try module.generateKey(session, mechanism: CK_MECHANISM_TYPE(CKM_AES_KEY_GEN), template: templates[0])]
                    }
                    try checkSecretStays(session, made[0], template, what: "AES key")
                    key = WrappingKey(scheme: scheme, label: label, id: id, secret: made[0], publicKey: nil, publicPoint: nil, epoch: epoch)
                case .rsaOAEP, .ecdhP256:
                    let mechanism = CK_MECHANISM_TYPE(scheme == .ecdhP256 ? CKM_EC_KEY_PAIR_GEN : CKM_RSA_PKCS_KEY_PAIR_GEN)
                    let privateHalf = privateTemplate(label: label, id: id, scheme: scheme)
                    made = try generate(session, "\(scheme) key pair", [publicTemplate(label: label, id: id, scheme: scheme), privateHalf]) {
                        templates throws(PKCS11Error) in
                        let (publicKey, privateKey) = try module.generateKeyPair(session, mechanism: mechanism, publicTemplate: templates[0],
                                                                                 privateTemplate: templates[1])
                        return [privateKey, publicKey]
                    }
                    let (privateKey, publicKey) = (made[0], made[1])
                    try checkSecretStays(session, privateKey, privateHalf, what: "\(scheme) key pair")
                    let point = scheme == .ecdhP256 ? try ecPoint(session, publicKey) : nil
                    key = WrappingKey(scheme: scheme, label: label, id: id, secret: privateKey, publicKey: publicKey,
                                      publicPoint: point, epoch: epoch)
                }
                #if DEBUG
                try injectFault(.afterKeyGeneration)
                #endif
                // A token may list a mechanism it then refuses with our parameters: try it before any item relies on it.
                let probe = SecureBytes(random: 32)
                let sealed = try seal(session, probe, with: key, associatedData: Array("keychain-linux probe".utf8))
                #if DEBUG
                try injectFault(.afterProbeSeal)
                #endif
                guard try open(session, sealed, with: key, associatedData: Array("keychain-linux probe".utf8)) == probe else {
                    throw PKCS11Error(rv: CKR_FUNCTION_FAILED, operation: "check the new \(scheme) key",
                                      detail: "the token opened the probe to other bytes")
                }
                return key
            } catch {
                for object in made { try? module.destroyObject(session, object) }
                throw error
            }
        }
    }

    /// Destroys every key with this label (secret, private and public), whatever its ID; returns how many there were.
    @discardableResult
    public func destroyKeys(label: String) throws(PKCS11Error) -> Int {
        try withSession { session throws(PKCS11Error) in
            var objects: [CK_OBJECT_HANDLE] = []
            for objectClass in [CKO_SECRET_KEY, CKO_PRIVATE_KEY, CKO_PUBLIC_KEY] {
                objects += try findObjects(session, class: CK_OBJECT_CLASS(objectClass), label: label, id: nil,
                                           requireLogin: false)
            }
            if objects.isEmpty { try requireLogin(session, label: label) }
            for object in objects { try module.destroyObject(session, object) }
            lookedUpAgain = lookedUpAgain.filter { $0.key.label != label }
            return objects.count
        }
    }

    /// The attributes of the key that holds the secret: the AES key or the private key.
    public func attributes(of key: WrappingKey) throws(PKCS11Error) -> KeyAttributes {
        let types = [CKA_TOKEN, CKA_SENSITIVE, CKA_EXTRACTABLE, CKA_ALWAYS_SENSITIVE, CKA_NEVER_EXTRACTABLE,
                     CKA_ENCRYPT, CKA_DECRYPT, CKA_SIGN, CKA_VERIFY, CKA_WRAP, CKA_UNWRAP, CKA_DERIVE].map { CK_ATTRIBUTE_TYPE($0) }
        let values = try withSession { session throws(PKCS11Error) in
            // A private key has no CKA_ENCRYPT or CKA_VERIFY: read each attribute alone, a missing one as false.
            try types.map { type throws(PKCS11Error) in
                do throws(PKCS11Error) {
                    return try module.attributeValues(session, resolve(key, in: session).secret, [type])[0]
                } catch where error.returnValue == .attributeTypeInvalid {
                    return []
                }
            }
        }
        let flag = { (index: Int) in values[index].first.map { $0 != CK_FALSE } ?? false }
        return KeyAttributes(token: flag(0), sensitive: flag(1), extractable: flag(2), alwaysSensitive: flag(3),
                             neverExtractable: flag(4), encrypt: flag(5), decrypt: flag(6), sign: flag(7),
                             verify: flag(8), wrap: flag(9), unwrap: flag(10), derive: flag(11))
    }

    /// Seals a data key with the wrapping key, `associatedData` authenticated; the result starts with
    /// its format byte (the scheme and its parameters).
    public func seal(_ dataKey: SecureBytes, with key: WrappingKey, associatedData: [UInt8]) throws(PKCS11Error) -> [UInt8] {
        try withSession { session throws(PKCS11Error) in try seal(session, dataKey, with: resolve(key, in: session), associatedData: associatedData) }
    }

    /// Opens what `seal` made (or a sealed key from before the format byte), into locked memory.
    /// Altered bytes or other associated data throw a `PKCS11Error` whose `isDataRejected` is true.
    public func open(_ sealed: [UInt8], with key: WrappingKey, associatedData: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        try withSession { session throws(PKCS11Error) in try open(session, sealed, with: resolve(key, in: session), associatedData: associatedData) }
    }

    /// The scheme a sealed key says it was made with; nil when the bytes name none.
    public static func scheme(ofSealed sealed: [UInt8]) -> WrappingScheme? {
        if sealed.count == SealedFormat.legacyAESGCMLength { return .aesGCM }
        return sealed.first.flatMap(SealedFormat.init(rawValue:))?.scheme
    }

    // MARK: The three schemes

    private func seal(_ session: CK_SESSION_HANDLE, _ dataKey: SecureBytes, with key: WrappingKey,
                      associatedData: [UInt8]) throws(PKCS11Error) -> [UInt8] {
        switch key.scheme {
        case .aesGCM:
            let header = [SealedFormat.aesGCM.rawValue]
            return header + (try gcmSeal(session, dataKey, key: key.secret, associatedData: header + associatedData))
        case .rsaOAEP:
            // OAEP takes no associated data here (SoftHSM2 refuses a label): a fresh key-encryption key
            // goes through OAEP, and seals the data key with the associated data in software.
            let kek = SecureBytes(random: Sodium.xchachaKeyLength)
            let (format, encrypted) = try oaepEncrypt(session, kek, publicKey: key.publicKey ?? 0)
            guard encrypted.count <= Int(UInt16.max) else {
                throw PKCS11Error(rv: CKR_ENCRYPTED_DATA_LEN_RANGE, operation: "seal a data key", detail: "an RSA key over 512 kbit")
            }
            let header = [format.rawValue, UInt8(encrypted.count >> 8), UInt8(encrypted.count & 0xFF)] + encrypted
            return header + Self.softwareSeal(dataKey, kek: kek, header: header, associatedData: associatedData)
        case .ecdhP256:
            let (ephemeralPoint, shared) = try ephemeralAgreement(session, peer: key.publicPoint ?? [])
            let header = [SealedFormat.ecdhP256.rawValue] + ephemeralPoint
            let kek = Self.ecdhKEK(shared: shared, ephemeral: ephemeralPoint, staticPoint: key.publicPoint ?? [])
            return header + Self.softwareSeal(dataKey, kek: kek, header: header, associatedData: associatedData)
        }
    }

    private func open(_ session: CK_SESSION_HANDLE, _ sealed: [UInt8], with key: WrappingKey,
                      associatedData: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        if sealed.count == SealedFormat.legacyAESGCMLength, key.scheme == .aesGCM {
            return try gcmOpen(session, sealed[...], key: key.secret, associatedData: associatedData)
        }
        guard let format = sealed.first.flatMap(SealedFormat.init(rawValue:)) else {
            throw Self.rejected("the sealed key names no known format")
        }
        guard format.scheme == key.scheme else {
            throw Self.rejected("the sealed key is \(format.scheme), and this token's key is \(key.scheme)")
        }
        let body = sealed.dropFirst()
        switch format {
        case .aesGCM:
            return try gcmOpen(session, body, key: key.secret, associatedData: [format.rawValue] + associatedData)
        case .rsaOAEPSHA256, .rsaOAEPSHA1:
            guard body.count >= 2 else { throw Self.rejected("the sealed key is cut short") }
            let length = Int(body[body.startIndex]) << 8 | Int(body[body.startIndex + 1])
            guard body.count >= 2 + length + Sodium.xchachaNonceLength + Sodium.xchachaTagLength else {
                throw Self.rejected("the sealed key is cut short")
            }
            let encrypted = body.dropFirst(2).prefix(length)
            let kek = try decryptOnToken(session, key: key.secret) { _ throws(PKCS11Error) in
                try withOAEP(sha1: format == .rsaOAEPSHA1) { oaep throws(PKCS11Error) in
                    try module.decrypt(session, oaep, key: key.secret, encrypted)
                }
            }
            let header = Array(sealed.prefix(1 + 2 + length))
            return try Self.softwareOpen(sealed[header.count...], kek: kek, header: header, associatedData: associatedData)
        case .ecdhP256:
            guard body.count >= Self.p256PointLength + Sodium.xchachaNonceLength + Sodium.xchachaTagLength else {
                throw Self.rejected("the sealed key is cut short")
            }
            let ephemeralPoint = Array(body.prefix(Self.p256PointLength))
            let shared = try decryptOnToken(session, key: key.secret) { _ throws(PKCS11Error) in
                try derive(session, base: key.secret, peer: ephemeralPoint)
            }
            let header = Array(sealed.prefix(1 + Self.p256PointLength))
            let kek = Self.ecdhKEK(shared: shared, ephemeral: ephemeralPoint, staticPoint: key.publicPoint ?? [])
            return try Self.softwareOpen(sealed[header.count...], kek: kek, header: header, associatedData: associatedData)
        }
    }

    // MARK: AES-GCM

    /// IV ‖ ciphertext ‖ tag: a fresh 12-byte IV from libsodium, a 16-byte tag.
    private func gcmSeal(_ session: CK_SESSION_HANDLE, _ dataKey: SecureBytes, key: CK_OBJECT_HANDLE,
                         associatedData: [UInt8]) throws(PKCS11Error) -> [UInt8] {
        let iv = Sodium.randomBytes(Self.gcmIVLength)
        let ciphertext = try withGCM(iv: iv[...], associatedData: associatedData) { mechanism throws(PKCS11Error) in
            try module.encrypt(session, mechanism, key: key, dataKey, overhead: Self.gcmTagLength)
        }
        return iv + ciphertext
    }

    #if DEBUG
    /// A data key sealed as before the format byte (AES-GCM, `associatedData` as given): tests make
    /// stores of the previous format with it (debug builds only).
    func legacySeal(_ dataKey: SecureBytes, with key: WrappingKey, associatedData: [UInt8]) throws(PKCS11Error) -> [UInt8] {
        try withSession { session throws(PKCS11Error) in
            try gcmSeal(session, dataKey, key: resolve(key, in: session).secret, associatedData: associatedData)
        }
    }
    #endif

    private func gcmOpen(_ session: CK_SESSION_HANDLE, _ sealed: ArraySlice<UInt8>, key: CK_OBJECT_HANDLE,
                         associatedData: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        guard sealed.count >= Self.gcmIVLength + Self.gcmTagLength else {
            throw Self.rejected("\(sealed.count) bytes can't hold a \(Self.gcmIVLength)-byte IV and a \(Self.gcmTagLength)-byte tag")
        }
        let iv = sealed.prefix(Self.gcmIVLength)
        return try decryptOnToken(session, key: key) { _ throws(PKCS11Error) in
            try withGCM(iv: iv, associatedData: associatedData) { mechanism throws(PKCS11Error) in
                try module.decrypt(session, mechanism, key: key, sealed.dropFirst(Self.gcmIVLength))
            }
        }
    }

    /// A `CKM_AES_GCM` mechanism whose parameters point at `iv` and `associatedData` during `body`.
    ///
    /// `ulIvBits` is set too: SoftHSM2 reads only `ulIvLen`, but checks the structure's full 2.40 size.
    private func withGCM<R>(iv: ArraySlice<UInt8>, associatedData: [UInt8],
                            _ body: (UnsafeMutablePointer<CK_MECHANISM>) throws(PKCS11Error) -> R) throws(PKCS11Error) -> R {
        try iv.withUnsafeBufferPointer { (ivBytes) throws(PKCS11Error) -> R in
            try associatedData.withUnsafeBufferPointer { (aad) throws(PKCS11Error) -> R in
                var parameters = CK_GCM_PARAMS(
                    pIv: UnsafeMutablePointer(mutating: ivBytes.baseAddress), ulIvLen: CK_ULONG(ivBytes.count),
                    ulIvBits: CK_ULONG(ivBytes.count * 8),
                    pAAD: UnsafeMutablePointer(mutating: aad.baseAddress), ulAADLen: CK_ULONG(aad.count),
                    ulTagBits: CK_ULONG(Self.gcmTagLength * 8))
                return try withMechanism(CKM_AES_GCM, &parameters, body)
            }
        }
    }

    // MARK: RSA-OAEP

    /// Encrypts with OAEP on the token: SHA-256 where the token takes it, else SHA-1 (SoftHSM2 2.6
    /// takes only SHA-1). The token's answer is remembered for the session.
    private func oaepEncrypt(_ session: CK_SESSION_HANDLE, _ plaintext: SecureBytes,
                             publicKey: CK_OBJECT_HANDLE) throws(PKCS11Error) -> (SealedFormat, [UInt8]) {
        if oaepTakesSHA256 != false {
            do {
                let encrypted = try withOAEP(sha1: false) { mechanism throws(PKCS11Error) in
                    try oaepCiphertext(session, mechanism, publicKey: publicKey, plaintext)
                }
                oaepTakesSHA256 = true
                return (.rsaOAEPSHA256, encrypted)
            } catch where [.mechanismParamInvalid, .argumentsBad, .mechanismInvalid].contains(error.returnValue) {
                oaepTakesSHA256 = false
            }
        }
        let encrypted = try withOAEP(sha1: true) { mechanism throws(PKCS11Error) in
            try oaepCiphertext(session, mechanism, publicKey: publicKey, plaintext)
        }
        return (.rsaOAEPSHA1, encrypted)
    }

    /// An RSA ciphertext is exactly as long as the modulus: the output buffer is that long, and a
    /// token that says another length is refused. tpm2-pkcs11 (1.9) reports the caller's buffer size
    /// when the buffer is larger (512 bytes for a 256-byte ciphertext, then garbage), and the sealed
    /// key then never opened.
    private func oaepCiphertext(_ session: CK_SESSION_HANDLE, _ mechanism: UnsafeMutablePointer<CK_MECHANISM>,
                                publicKey: CK_OBJECT_HANDLE, _ plaintext: SecureBytes) throws(PKCS11Error) -> [UInt8] {
        let modulus = Int(WrappingScheme.rsaBits) / 8
        let encrypted = try module.encrypt(session, mechanism, key: publicKey, plaintext, overhead: modulus - plaintext.count)
        guard encrypted.count == modulus else {
            throw PKCS11Error(rv: CKR_ENCRYPTED_DATA_LEN_RANGE, operation: "seal a data key",
                              detail: "the token's C_Encrypt gave \(encrypted.count) bytes for a \(WrappingScheme.rsaBits)-bit RSA ciphertext")
        }
        return encrypted
    }

    private func withOAEP<R>(sha1: Bool, _ body: (UnsafeMutablePointer<CK_MECHANISM>) throws(PKCS11Error) -> R) throws(PKCS11Error) -> R {
        var parameters = CK_RSA_PKCS_OAEP_PARAMS(
            hashAlg: CK_MECHANISM_TYPE(sha1 ? CKM_SHA_1 : CKM_SHA256), mgf: CK_RSA_PKCS_MGF_TYPE(sha1 ? CKG_MGF1_SHA1 : CKG_MGF1_SHA256),
            source: CK_RSA_PKCS_OAEP_SOURCE_TYPE(CKZ_DATA_SPECIFIED), pSourceData: nil, ulSourceDataLen: 0)
        return try withMechanism(CKM_RSA_PKCS_OAEP, &parameters, body)
    }

    // MARK: ECDH P-256

    /// An ephemeral P-256 pair made on the token as session objects, its agreement with `peer`, and its
    /// public point; the ephemeral objects are destroyed before this returns, whatever happens.
    private func ephemeralAgreement(_ session: CK_SESSION_HANDLE, peer: [UInt8]) throws(PKCS11Error) -> ([UInt8], SecureBytes) {
        var publicTemplate = KeyTemplate(part: "public key")
        publicTemplate.add(CKA_TOKEN, false)
        publicTemplate.add(CKA_EC_PARAMS, bytes: Self.p256Parameters)
        var privateTemplate = KeyTemplate(part: "private key")
        privateTemplate.add(CKA_TOKEN, false)
        privateTemplate.add(CKA_SENSITIVE, true, .keepsSecretIn)
        privateTemplate.add(CKA_EXTRACTABLE, false, .keepsSecretIn)
        privateTemplate.add(CKA_DERIVE, true)
        let made = try generate(session, "ephemeral EC key pair", [publicTemplate, privateTemplate]) { templates throws(PKCS11Error) in
            let (publicKey, privateKey) = try module.generateKeyPair(session, mechanism: CK_MECHANISM_TYPE(CKM_EC_KEY_PAIR_GEN),
                                                                     publicTemplate: templates[0], privateTemplate: templates[1])
            return [publicKey, privateKey]
        }
        let (publicKey, privateKey) = (made[0], made[1])
        defer {
            try? module.destroyObject(session, privateKey)
            try? module.destroyObject(session, publicKey)
        }
        return (try ecPoint(session, publicKey), try derive(session, base: privateKey, peer: peer))
    }

    /// ECDH with `CKD_NULL` (the shared x coordinate), as a session secret read out and destroyed at once.
    private func derive(_ session: CK_SESSION_HANDLE, base: CK_OBJECT_HANDLE, peer: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        let template = AttributeTemplate()
        template.add(CKA_CLASS, CK_OBJECT_CLASS(CKO_SECRET_KEY))
        template.add(CKA_KEY_TYPE, CK_KEY_TYPE(CKK_GENERIC_SECRET))
        template.add(CKA_VALUE_LEN, CK_ULONG(32))
        template.add(CKA_TOKEN, false)
        template.add(CKA_SENSITIVE, false)
        template.add(CKA_EXTRACTABLE, true)
        let derived = try peer.withUnsafeBufferPointer { (point) throws(PKCS11Error) -> CK_OBJECT_HANDLE in
            var parameters = CK_ECDH1_DERIVE_PARAMS(kdf: ck_ec_kdf_t(CKD_NULL), ulSharedDataLen: 0, pSharedData: nil,
                                                    ulPublicDataLen: CK_ULONG(point.count),
                                                    pPublicData: UnsafeMutablePointer(mutating: point.baseAddress))
            return try withMechanism(CKM_ECDH1_DERIVE, &parameters) { mechanism throws(PKCS11Error) in
                try module.deriveKey(session, mechanism, base: base, template: template)
            }
        }
        defer { try? module.destroyObject(session, derived) }
        return try module.secretValue(session, derived)
    }

    /// A public key's `CKA_EC_POINT` as the raw uncompressed point (tokens give it DER-wrapped, as 2.40 says, or raw).
    private func ecPoint(_ session: CK_SESSION_HANDLE, _ publicKey: CK_OBJECT_HANDLE) throws(PKCS11Error) -> [UInt8] {
        let value = try module.attributeValues(session, publicKey, [CK_ATTRIBUTE_TYPE(CKA_EC_POINT)])[0]
        let length = Self.p256PointLength
        if value.count == length + 2, value[0] == 0x04, value[1] == UInt8(length), value[2] == 0x04 { return Array(value.dropFirst(2)) }
        if value.count == length, value[0] == 0x04 { return value }
        throw PKCS11Error(rv: CKR_FUNCTION_FAILED, operation: "read the EC public point", detail: "not an uncompressed P-256 point")
    }

    private static func ecdhKEK(shared: SecureBytes, ephemeral: [UInt8], staticPoint: [UInt8]) -> SecureBytes {
        Sodium.blake2b(key: shared, message: Array("keychain-linux token ECDH-P256 v1".utf8) + ephemeral + staticPoint)
    }

    // MARK: Shared steps

    /// XChaCha20-Poly1305 of the data key under a one-seal key: nonce ‖ ciphertext ‖ tag, the header in the associated data.
    private static func softwareSeal(_ dataKey: SecureBytes, kek: SecureBytes, header: [UInt8], associatedData: [UInt8]) -> [UInt8] {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        return nonce + Sodium.seal(dataKey, key: kek, nonce: nonce, associatedData: header + associatedData)
    }

    private static func softwareOpen(_ body: ArraySlice<UInt8>, kek: SecureBytes, header: [UInt8],
                                     associatedData: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        do {
            return try Sodium.open(Array(body.dropFirst(Sodium.xchachaNonceLength)), key: kek,
                                   nonce: Array(body.prefix(Sodium.xchachaNonceLength)), associatedData: header + associatedData)
        } catch {
            throw rejected("the sealed key failed authentication")
        }
    }

    static func rejected(_ detail: String) -> PKCS11Error {
        PKCS11Error(rv: CKR_ENCRYPTED_DATA_INVALID, operation: "open a sealed key", detail: detail, isDataRejected: true)
    }

    /// Runs a decryption or derivation on the token. SoftHSM2 before 2.7 reports a failed GCM tag, a
    /// bad OAEP padding or a point off the curve as `CKR_GENERAL_ERROR` (or `CKR_ARGUMENTS_BAD` for
    /// the point): if the session and the key are fine, the data is what was wrong.
    private func decryptOnToken<R>(_ session: CK_SESSION_HANDLE, key: CK_OBJECT_HANDLE,
                                   _ body: (CK_OBJECT_HANDLE) throws(PKCS11Error) -> R) throws(PKCS11Error) -> R {
        do {
            return try body(key)
        } catch where [.generalError, .argumentsBad, .functionFailed, .mechanismParamInvalid].contains(error.returnValue) {
            guard (try? module.sessionState(session)) != nil,
                  (try? module.attributeValues(session, key, [CK_ATTRIBUTE_TYPE(CKA_CLASS)])) != nil else {
                throw error
            }
            throw PKCS11Error(rv: error.rv, operation: error.operation,
                              detail: "the token refused the sealed key (reported as \(error.name))", isDataRejected: true)
        }
    }

    private func withMechanism<P, R>(_ type: UInt, _ parameters: inout P,
                                     _ body: (UnsafeMutablePointer<CK_MECHANISM>) throws(PKCS11Error) -> R) throws(PKCS11Error) -> R {
        try withUnsafeMutablePointer(to: &parameters) { (pointer) throws(PKCS11Error) -> R in
            var mechanism = CK_MECHANISM(mechanism: CK_MECHANISM_TYPE(type), pParameter: pointer,
                                         ulParameterLen: CK_ULONG(MemoryLayout<P>.size))
            return try withUnsafeMutablePointer(to: &mechanism) { (mechanismPointer) throws(PKCS11Error) -> R in
                try body(mechanismPointer)
            }
        }
    }

    // MARK: Finding keys

    /// The key with this label and ID in whichever scheme it was made; an AES key wins over a pair.
    private func findWrappingKey(_ session: CK_SESSION_HANDLE, label: String, id: [UInt8]) throws(PKCS11Error) -> WrappingKey? {
        if let secret = try findObjects(session, class: CK_OBJECT_CLASS(CKO_SECRET_KEY), label: label, id: id, requireLogin: false).min() {
            return WrappingKey(scheme: .aesGCM, label: label, id: id, secret: secret, publicKey: nil, publicPoint: nil, epoch: epoch)
        }
        guard let privateKey = try findObjects(session, class: CK_OBJECT_CLASS(CKO_PRIVATE_KEY), label: label, id: id,
                                               requireLogin: true).min() else { return nil }
        let keyType = try module.attributeValues(session, privateKey, [CK_ATTRIBUTE_TYPE(CKA_KEY_TYPE)])[0]
        let scheme: WrappingScheme = keyType == withUnsafeBytes(of: CK_KEY_TYPE(CKK_RSA), Array.init) ? .rsaOAEP : .ecdhP256
        guard let publicKey = try findObjects(session, class: CK_OBJECT_CLASS(CKO_PUBLIC_KEY), label: label, id: id,
                                              requireLogin: false).min() else {
            throw PKCS11Error(rv: CKR_KEY_HANDLE_INVALID, operation: "find key '\(label)'",
                              detail: "the \(scheme) key pair has lost its public key")
        }
        return WrappingKey(scheme: scheme, label: label, id: id, secret: privateKey, publicKey: publicKey,
                           publicPoint: scheme == .ecdhP256 ? try ecPoint(session, publicKey) : nil, epoch: epoch)
    }

    /// Objects of one class with this label (and ID, when given).
    ///
    /// Without a login a token hides private objects rather than failing, so an empty answer is
    /// trusted only from a logged-in session (when `requireLogin`); otherwise it is
    /// `CKR_USER_NOT_LOGGED_IN`, which `withSession` answers by logging in again when it can.
    private func findObjects(_ session: CK_SESSION_HANDLE, class objectClass: CK_OBJECT_CLASS, label: String, id: [UInt8]?,
                             requireLogin: Bool) throws(PKCS11Error) -> [CK_OBJECT_HANDLE] {
        let template = AttributeTemplate()
        template.add(CKA_CLASS, objectClass)
        template.add(CKA_LABEL, label)
        if let id { template.add(CKA_ID, bytes: id) }
        let found = try module.findObjects(session, matching: template)
        if found.isEmpty && requireLogin { try self.requireLogin(session, label: label) }
        return found
    }

    private func requireLogin(_ session: CK_SESSION_HANDLE, label: String) throws(PKCS11Error) {
        let state = try module.sessionState(session)
        guard state == CKS_RW_USER_FUNCTIONS || state == CKS_RO_USER_FUNCTIONS else {
            throw PKCS11Error(rv: CKR_USER_NOT_LOGGED_IN, operation: "find key '\(label)'",
                              detail: "the token's keys are private: log in first")
        }
    }

    /// The key with this session's handles, looked up again by label and ID if it is older.
    private func resolve(_ key: WrappingKey, in session: CK_SESSION_HANDLE) throws(PKCS11Error) -> WrappingKey {
        if key.epoch == epoch { return key }
        if let found = lookedUpAgain[key.identity] { return found }
        guard let found = try findWrappingKey(session, label: key.label, id: key.id), found.scheme == key.scheme else {
            throw PKCS11Error(rv: CKR_KEY_HANDLE_INVALID, operation: "find key '\(key.label)'",
                              detail: "the key is no longer on the token")
        }
        lookedUpAgain[key.identity] = found
        return found
    }

    // MARK: Tests (debug builds only)

    #if DEBUG
    /// A point in `createWrappingKey` where a test makes the next step fail, to see the earlier steps undone.
    enum FaultPoint: Sendable { case afterKeyGeneration, afterProbeSeal }

    private func injectFault(_ point: FaultPoint) throws(PKCS11Error) {
        if faultPoint == point {
            faultPoint = nil
            throw PKCS11Error(rv: CKR_DEVICE_ERROR, operation: "a step after \(point) (injected by a test)")
        }
    }
    #endif
}

extension WrappingKey {
    struct Identity: Hashable {
        let label: String
        let id: [UInt8]
    }

    var identity: Identity { Identity(label: label, id: id) }
}
