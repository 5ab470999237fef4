internal import CP11Kit
import KeychainBasics

/// A key template as data: each attribute with what it is for, so that a template a token refuses can
/// be asked again without what only narrows the key, what the token refuses can be named, and what
/// keeps the secret in can be checked on the key made.
struct KeyTemplate {
    enum Role {
        /// The key is not the key asked for without it (its class, type, size, label, one operation).
        case needed
        /// The secret stays on the token only with it (sensitive, never extractable, private, on the token).
        case keepsSecretIn
        /// It narrows what the key may do; a token may decide that itself (tpm2-pkcs11 does for RSA).
        case narrowing
    }

    struct Entry {
        let type: CK_ATTRIBUTE_TYPE
        let value: [UInt8]
        let role: Role
        /// "CKA_SENSITIVE=true (private key)", as messages name it.
        let name: String
    }

    /// Which key of a pair the template is for ("public key"), nil for a secret key.
    let part: String?
    private(set) var entries: [Entry] = []

    /// The order narrowings are left out in, one more each time: the usages, then CKA_MODIFIABLE.
    static let narrowingOrder = [CKA_VERIFY, CKA_WRAP, CKA_SIGN, CKA_UNWRAP, CKA_DERIVE, CKA_MODIFIABLE].map { CK_ATTRIBUTE_TYPE($0) }

    init(part: String?) { self.part = part }

    mutating func add(_ type: CK_ATTRIBUTE_TYPE, _ value: Bool, _ role: Role = .needed) {
        add(type, bytes: [value ? UInt8(CK_TRUE) : UInt8(CK_FALSE)], role, shown: "=\(value)")
    }

    mutating func add(_ type: CK_ATTRIBUTE_TYPE, _ value: CK_ULONG, _ role: Role = .needed) {
        add(type, bytes: withUnsafeBytes(of: value) { Array($0) }, role, shown: "=\(value)")
    }

    mutating func add(_ type: CK_ATTRIBUTE_TYPE, bytes: [UInt8], _ role: Role = .needed, shown: String = "") {
        let name = (Self.names[type] ?? "CKA_0x" + Hex.encode(type, digits: 1)) + shown + (part.map { " (\($0))" } ?? "")
        entries.append(Entry(type: type, value: bytes, role: role, name: name))
    }

    func narrows(_ type: CK_ATTRIBUTE_TYPE) -> Bool {
        entries.contains { $0.type == type && $0.role == .narrowing }
    }

    /// The C template, without the entries `leftOut` picks.
    func attributes(without leftOut: (Entry) -> Bool) -> AttributeTemplate {
        let template = AttributeTemplate()
        for entry in entries where !leftOut(entry) { template.add(entry.type, bytes: entry.value) }
        return template
    }

    private static let names: [CK_ATTRIBUTE_TYPE: String] = [
        CKA_CLASS: "CKA_CLASS", CKA_TOKEN: "CKA_TOKEN", CKA_PRIVATE: "CKA_PRIVATE", CKA_LABEL: "CKA_LABEL",
        CKA_KEY_TYPE: "CKA_KEY_TYPE", CKA_ID: "CKA_ID", CKA_SENSITIVE: "CKA_SENSITIVE", CKA_ENCRYPT: "CKA_ENCRYPT",
        CKA_DECRYPT: "CKA_DECRYPT", CKA_WRAP: "CKA_WRAP", CKA_UNWRAP: "CKA_UNWRAP", CKA_SIGN: "CKA_SIGN",
        CKA_VERIFY: "CKA_VERIFY", CKA_DERIVE: "CKA_DERIVE", CKA_MODULUS_BITS: "CKA_MODULUS_BITS",
        CKA_PUBLIC_EXPONENT: "CKA_PUBLIC_EXPONENT", CKA_VALUE_LEN: "CKA_VALUE_LEN", CKA_EXTRACTABLE: "CKA_EXTRACTABLE",
        CKA_MODIFIABLE: "CKA_MODIFIABLE", CKA_EC_PARAMS: "CKA_EC_PARAMS",
    ]
}
