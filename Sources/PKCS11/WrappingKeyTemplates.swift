internal import CP11Kit
import SecureMemory

// The templates a wrapping key is made with, and making it with them on a token that refuses some.
extension PKCS11Token {
    // MARK: Templates

    /// Makes a key (one template) or a pair (public, then private) with `make`, which returns the objects
    /// it made. A token that refuses the templates (CKR_GENERAL_ERROR, as tpm2-pkcs11 says `User specified
    /// and TPM specified attr mismatch: 0x10a` of an RSA key, CKR_TEMPLATE_INCONSISTENT,
    /// CKR_ATTRIBUTE_TYPE_INVALID, CKR_ATTRIBUTE_VALUE_INVALID) is asked again without the attributes that
    /// only narrow the key, one more each time in `KeyTemplate.narrowingOrder`; what keeps the secret in
    /// (sensitive, never extractable, private, on the token) and what the key needs are never left out.
    /// - Throws: `CKR_TEMPLATE_INCONSISTENT` naming the attribute the token refuses (`refusal`).
    func generate(_ session: CK_SESSION_HANDLE, _ what: String, _ templates: [KeyTemplate],
                  _ make: ([AttributeTemplate]) throws(PKCS11Error) -> [CK_OBJECT_HANDLE]) throws(PKCS11Error) -> [CK_OBJECT_HANDLE] {
        let steps = KeyTemplate.narrowingOrder.filter { type in templates.contains { $0.narrows(type) } }
        var leftOut: Set<CK_ATTRIBUTE_TYPE> = []
        while true {
            do {
                return try make(templates.map { $0.attributes { leftOut.contains($0.type) && $0.role == .narrowing } })
            } catch where Self.refusesTemplate(error.returnValue) {
                guard leftOut.count < steps.count else {
                    throw refusal(session, what, templates, leftOut: leftOut, error, make)
                }
                leftOut.insert(steps[leftOut.count])
            }
        }
    }

    private static func refusesTemplate(_ rv: PKCS11ReturnValue) -> Bool {
        [.generalError, .templateInconsistent, .attributeValueInvalid, .attributeTypeInvalid].contains(rv)
    }

    /// Names what the token refuses in `templates` (already without every narrowing): the first attribute
    /// whose absence it accepts, tried on throwaway session objects (CKA_TOKEN left out as well, so nothing
    /// reaches the token) destroyed at once and never used.
    private func refusal(_ session: CK_SESSION_HANDLE, _ what: String, _ templates: [KeyTemplate], leftOut: Set<CK_ATTRIBUTE_TYPE>,
                         _ error: PKCS11Error, _ make: ([AttributeTemplate]) throws(PKCS11Error) -> [CK_OBJECT_HANDLE]) -> PKCS11Error {
        let token = CK_ATTRIBUTE_TYPE(CKA_TOKEN)
        let kept = templates.flatMap { template in template.entries.filter { $0.role != .narrowing || !leftOut.contains($0.type) } }
        var candidates: [KeyTemplate.Entry] = []
        for entry in kept.sorted(by: { $0.type == token && $1.type != token }) where !candidates.contains(where: { $0.type == entry.type }) {
            candidates.append(entry)
        }
        for candidate in candidates {
            let probe = templates.map { template in
                template.attributes { $0.type == token || $0.type == candidate.type || ($0.role == .narrowing && leftOut.contains($0.type)) }
            }
            guard let made = try? make(probe) else { continue }
            for object in made { try? module.destroyObject(session, object) }
            let why = candidate.role == .keepsSecretIn ? "which keeps the key's secret on the token" : "which the key needs"
            return PKCS11Error(rv: CKR_TEMPLATE_INCONSISTENT, operation: "make the \(what)",
                               detail: "the token refuses \(candidate.name) in its template (\(error.name)), \(why)")
        }
        let without = leftOut.isEmpty ? ""
            : ", also without " + templates.flatMap { $0.entries.filter { $0.role == .narrowing }.map(\.name) }.joined(separator: ", ")
        return PKCS11Error(rv: CKR_TEMPLATE_INCONSISTENT, operation: "make the \(what)",
                           detail: "the token refuses its template (\(error.name))" + without)
    }

    /// A token that took a template, narrowed or not, must still have made the key with what keeps its
    /// secret in: read back from the key made, as a token may drop an attribute and say nothing.
    func checkSecretStays(_ session: CK_SESSION_HANDLE, _ key: CK_OBJECT_HANDLE, _ template: KeyTemplate,
                          what: String) throws(PKCS11Error) {
        for entry in template.entries where entry.role == .keepsSecretIn {
            let got = try module.attributeValues(session, key, [entry.type])[0]
            let wanted = entry.value.first.map { $0 != CK_FALSE } ?? false
            guard got.first.map({ ($0 != CK_FALSE) == wanted }) == true else {
                throw PKCS11Error(rv: CKR_TEMPLATE_INCONSISTENT, operation: "make the \(what)",
                                  detail: "the token made it without \(entry.name)")
            }
        }
    }

    /// The AES key: encrypt and decrypt, nothing else.
    func secretTemplate(label: String, id: [UInt8]) -> KeyTemplate {
        var template = KeyTemplate(part: nil)
        template.add(CKA_CLASS, CK_OBJECT_CLASS(CKO_SECRET_KEY))
        template.add(CKA_KEY_TYPE, CK_KEY_TYPE(CKK_AES))
        template.add(CKA_VALUE_LEN, CK_ULONG(WrappingScheme.aesKeyBytes))
        Self.addSecret(&template, label: label, id: id, decrypt: true, derive: false)
        template.add(CKA_ENCRYPT, true)
        template.add(CKA_VERIFY, false, .narrowing)
        template.add(CKA_WRAP, false, .narrowing)
        return template
    }

    func privateTemplate(label: String, id: [UInt8], scheme: WrappingScheme) -> KeyTemplate {
        var template = KeyTemplate(part: "private key")
        Self.addSecret(&template, label: label, id: id, decrypt: scheme == .rsaOAEP, derive: scheme == .ecdhP256)
        return template
    }

    func publicTemplate(label: String, id: [UInt8], scheme: WrappingScheme) -> KeyTemplate {
        var template = KeyTemplate(part: "public key")
        Self.addIdentity(&template, label: label, id: id)
        template.add(CKA_VERIFY, false, .narrowing)
        template.add(CKA_WRAP, false, .narrowing)
        if scheme == .rsaOAEP {
            template.add(CKA_MODULUS_BITS, CK_ULONG(WrappingScheme.rsaBits))
            template.add(CKA_PUBLIC_EXPONENT, bytes: [0x01, 0x00, 0x01])
            template.add(CKA_ENCRYPT, true)
        } else {
            template.add(CKA_EC_PARAMS, bytes: Self.p256Parameters)
            template.add(CKA_DERIVE, false, .narrowing)
        }
        return template
    }

    /// Every object of a service's key: its label and ID, on the token, private, not modifiable (so
    /// no usage can be widened later).
    private static func addIdentity(_ template: inout KeyTemplate, label: String, id: [UInt8]) {
        template.add(CKA_LABEL, bytes: Array(label.utf8))
        template.add(CKA_ID, bytes: id)
        template.add(CKA_TOKEN, true, .keepsSecretIn)
        template.add(CKA_PRIVATE, true, .keepsSecretIn)
        template.add(CKA_MODIFIABLE, false, .narrowing)
    }

    /// The half that holds the secret: sensitive, never extractable, one usage (decrypt or derive).
    private static func addSecret(_ template: inout KeyTemplate, label: String, id: [UInt8], decrypt: Bool, derive: Bool) {
        addIdentity(&template, label: label, id: id)
        template.add(CKA_SENSITIVE, true, .keepsSecretIn)
        template.add(CKA_EXTRACTABLE, false, .keepsSecretIn)
        template.add(CKA_DECRYPT, decrypt)
        template.add(CKA_DERIVE, derive, derive ? .needed : .narrowing)
        template.add(CKA_SIGN, false, .narrowing)
        template.add(CKA_UNWRAP, false, .narrowing)
    }
}
