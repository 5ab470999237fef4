internal import CP11Kit
import SecureMemory

/// A secret key on the token, named by its label and ID; the object handle is this session's.
public struct KeyHandle: Sendable, Hashable {
    public let label: String
    public let id: [UInt8]
    let object: CK_OBJECT_HANDLE
    /// The token session the handle is valid in; in any other it is looked up again.
    let epoch: UInt64

    struct Identity: Hashable {
        let label: String
        let id: [UInt8]
    }

    var identity: Identity { Identity(label: label, id: id) }
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
}

extension PKCS11Token {
    /// AES-GCM as PKCS#11 2.40 §2.12.3 describes it: a 96-bit IV and a 128-bit tag.
    static let gcmIVLength = 12
    static let gcmTagLength = 16

    /// The AES-256 key with this label and ID; generated on the token when missing and `create` is true.
    ///
    /// The key never leaves the token: sensitive, not extractable, private, and usable only to
    /// encrypt and decrypt (no sign, verify, wrap, unwrap or derive); not modifiable, so those
    /// usages can't be widened later.
    ///
    /// - Important: generating is not atomic across processes. Hold the store's lock around a call
    ///   with `create: true`; if two keys with one label and ID exist anyway, the lowest handle wins.
    public func wrappingKey(label: String, id: [UInt8], create: Bool) throws(PKCS11Error) -> KeyHandle? {
        try withSession { session throws(PKCS11Error) in
            if let object = try findSecretKeys(session, label: label, id: id).min() {
                return KeyHandle(label: label, id: id, object: object, epoch: epoch)
            }
            guard create else { return nil }
            let template = AttributeTemplate()
            template.add(CKA_CLASS, CK_OBJECT_CLASS(CKO_SECRET_KEY))
            template.add(CKA_KEY_TYPE, CK_KEY_TYPE(CKK_AES))
            template.add(CKA_VALUE_LEN, CK_ULONG(32))
            template.add(CKA_LABEL, label)
            template.add(CKA_ID, bytes: id)
            template.add(CKA_TOKEN, true)
            template.add(CKA_PRIVATE, true)
            template.add(CKA_SENSITIVE, true)
            template.add(CKA_EXTRACTABLE, false)
            template.add(CKA_MODIFIABLE, false)
            template.add(CKA_ENCRYPT, true)
            template.add(CKA_DECRYPT, true)
            template.add(CKA_SIGN, false)
            template.add(CKA_VERIFY, false)
            template.add(CKA_WRAP, false)
            template.add(CKA_UNWRAP, false)
            template.add(CKA_DERIVE, false)
            let object = try module.generateKey(session, mechanism: CK_MECHANISM_TYPE(CKM_AES_KEY_GEN), template: template)
            return KeyHandle(label: label, id: id, object: object, epoch: epoch)
        }
    }

    /// Destroys every secret key with this label, whatever its ID; returns how many there were.
    @discardableResult
    public func destroyKeys(label: String) throws(PKCS11Error) -> Int {
        try withSession { session throws(PKCS11Error) in
            let objects = try findSecretKeys(session, label: label, id: nil)
            for object in objects { try module.destroyObject(session, object) }
            lookedUpAgain = lookedUpAgain.filter { $0.key.label != label }
            return objects.count
        }
    }

    public func attributes(of key: KeyHandle) throws(PKCS11Error) -> KeyAttributes {
        let types = [CKA_TOKEN, CKA_SENSITIVE, CKA_EXTRACTABLE, CKA_ALWAYS_SENSITIVE, CKA_NEVER_EXTRACTABLE,
                     CKA_ENCRYPT, CKA_DECRYPT, CKA_SIGN, CKA_VERIFY, CKA_WRAP, CKA_UNWRAP].map { CK_ATTRIBUTE_TYPE($0) }
        let values = try withSession { session throws(PKCS11Error) in
            try module.attributeValues(session, resolve(key, in: session), types)
        }
        let flag = { (index: Int) in values[index].first.map { $0 != CK_FALSE } ?? false }
        return KeyAttributes(token: flag(0), sensitive: flag(1), extractable: flag(2), alwaysSensitive: flag(3),
                             neverExtractable: flag(4), encrypt: flag(5), decrypt: flag(6), sign: flag(7),
                             verify: flag(8), wrap: flag(9), unwrap: flag(10))
    }

    /// Encrypts a data key on the token with AES-256-GCM: a fresh 12-byte IV from libsodium, a 16-byte
    /// tag, `associatedData` authenticated. Returns IV ‖ ciphertext ‖ tag.
    public func seal(_ dataKey: SecureBytes, with key: KeyHandle, associatedData: [UInt8]) throws(PKCS11Error) -> [UInt8] {
        let iv = Sodium.randomBytes(Self.gcmIVLength)
        let ciphertext = try withSession { session throws(PKCS11Error) in
            let object = try resolve(key, in: session)
            return try withGCM(iv: iv[...], associatedData: associatedData) { mechanism throws(PKCS11Error) in
                try module.encrypt(session, mechanism, key: object, dataKey, overhead: Self.gcmTagLength)
            }
        }
        return iv + ciphertext
    }

    /// Decrypts what `seal` made, into locked memory. Altered bytes (IV, ciphertext, tag or associated
    /// data) throw a `PKCS11Error` whose `isDataRejected` is true.
    public func open(_ sealed: [UInt8], with key: KeyHandle, associatedData: [UInt8]) throws(PKCS11Error) -> SecureBytes {
        guard sealed.count >= Self.gcmIVLength + Self.gcmTagLength else {
            throw PKCS11Error(rv: CKR_ENCRYPTED_DATA_LEN_RANGE, operation: "open a sealed key",
                              detail: "\(sealed.count) bytes can't hold a \(Self.gcmIVLength)-byte IV and a \(Self.gcmTagLength)-byte tag")
        }
        return try withSession { session throws(PKCS11Error) in
            let object = try resolve(key, in: session)
            return try withGCM(iv: sealed[..<Self.gcmIVLength], associatedData: associatedData) { mechanism throws(PKCS11Error) in
                do throws(PKCS11Error) {
                    return try module.decrypt(session, mechanism, key: object, sealed[Self.gcmIVLength...])
                } catch where error.returnValue == .generalError && error.operation == "C_Decrypt" {
                    // SoftHSM2 before 2.7 reports a failed tag as CKR_GENERAL_ERROR. If the session and
                    // the key are fine, the data is what was wrong.
                    guard (try? module.sessionState(session)) != nil,
                          (try? module.attributeValues(session, object, [CK_ATTRIBUTE_TYPE(CKA_CLASS)])) != nil else {
                        throw error
                    }
                    throw PKCS11Error(rv: error.rv, operation: error.operation,
                                      detail: "AES-GCM authentication failed (reported as CKR_GENERAL_ERROR)",
                                      isDataRejected: true)
                }
            }
        }
    }

    // MARK: Internals

    /// Secret keys with this label (and ID, when given).
    ///
    /// Without a login a token hides private objects rather than failing, so an empty answer is
    /// trusted only from a logged-in session; otherwise it is `CKR_USER_NOT_LOGGED_IN`, which
    /// `withSession` answers by logging in again when it can.
    private func findSecretKeys(_ session: CK_SESSION_HANDLE, label: String, id: [UInt8]?) throws(PKCS11Error) -> [CK_OBJECT_HANDLE] {
        let template = AttributeTemplate()
        template.add(CKA_CLASS, CK_OBJECT_CLASS(CKO_SECRET_KEY))
        template.add(CKA_LABEL, label)
        if let id { template.add(CKA_ID, bytes: id) }
        let found = try module.findObjects(session, matching: template)
        if found.isEmpty {
            let state = try module.sessionState(session)
            guard state == CKS_RW_USER_FUNCTIONS || state == CKS_RO_USER_FUNCTIONS else {
                throw PKCS11Error(rv: CKR_USER_NOT_LOGGED_IN, operation: "find key '\(label)'",
                                  detail: "the token's keys are private: log in first")
            }
        }
        return found
    }

    /// The key's object handle in this session, looked up again by label and ID if it is older.
    private func resolve(_ key: KeyHandle, in session: CK_SESSION_HANDLE) throws(PKCS11Error) -> CK_OBJECT_HANDLE {
        if key.epoch == epoch { return key.object }
        if let object = lookedUpAgain[key.identity] { return object }
        guard let object = try findSecretKeys(session, label: key.label, id: key.id).min() else {
            throw PKCS11Error(rv: CKR_KEY_HANDLE_INVALID, operation: "find key '\(key.label)'",
                              detail: "the key is no longer on the token")
        }
        lookedUpAgain[key.identity] = object
        return object
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
                return try withUnsafeMutablePointer(to: &parameters) { (pointer) throws(PKCS11Error) -> R in
                    var mechanism = CK_MECHANISM(mechanism: CK_MECHANISM_TYPE(CKM_AES_GCM), pParameter: pointer,
                                                 ulParameterLen: CK_ULONG(MemoryLayout<CK_GCM_PARAMS>.size))
                    return try withUnsafeMutablePointer(to: &mechanism) { (mechanismPointer) throws(PKCS11Error) -> R in
                        try body(mechanismPointer)
                    }
                }
            }
        }
    }
}
