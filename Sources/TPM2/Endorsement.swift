internal import CTSS2

/// What a device's identity document needs from its TPM: the endorsement keys' public areas (TCG EK
/// Credential Profile: the low-range templates L-1 and L-2, and the high-range H-3 of version 2.3),
/// NV contents such as the EK certificates,
/// public areas of persistent objects, and the vendor properties.
extension TPMContext {
    public enum EndorsementKeyType: String, Sendable, CaseIterable {
        /// Template L-1: RSA 2048, AES-128-CFB, certificate at NV 0x01C00002.
        case rsa2048
        /// Template L-2: ECC NIST P-256, AES-128-CFB, certificate at NV 0x01C0000A.
        case eccP256
        /// Template H-3 (high range, EK Credential Profile 2.3, 2.2.1.5.1): ECC NIST P-384, SHA-384
        /// names, AES-256-CFB, PolicyB, userWithAuth, an empty unique; certificate at NV 0x01C00016.
        /// swtpm (0.7) certifies its ECC EK here, not at L-2's index.
        case eccP384

        /// userWithAuth: its USER role takes its empty authValue (H-3); L-1 and L-2 take their policy only.
        public var userWithAuth: Bool { self == .eccP384 }

        /// The key and its template in words, for messages.
        public var description: String {
            switch self {
            case .rsa2048: "RSA EK (template L-1)"
            case .eccP256: "ECC P-256 EK (template L-2)"
            case .eccP384: "ECC P-384 EK (template H-3)"
            }
        }

        public var certificateIndex: UInt32 {
            switch self {
            case .rsa2048: 0x01C0_0002
            case .eccP256: 0x01C0_000A
            case .eccP384: 0x01C0_0016
            }
        }
    }

    /// PolicySecret(TPM_RH_ENDORSEMENT): the default EK templates' authPolicy (EK profile, B.3.3).
    public static let endorsementKeyPolicy: [UInt8] = [
        0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xB3, 0xF8, 0x1A, 0x90, 0xCC, 0x8D, 0x46, 0xA5, 0xD7, 0x24,
        0xFD, 0x52, 0xD7, 0x6E, 0x06, 0x52, 0x0B, 0x64, 0xF2, 0xA1, 0xDA, 0x1B, 0x33, 0x14, 0x69, 0xAA,
    ]

    /// PolicyB with SHA-384: the high-range SHA-384 templates' authPolicy (EK profile 2.3, B.6);
    /// tpm2_createek -G ecc384 and swtpm's EK at 0x81010016 carry it.
    public static let endorsementKeyPolicyBSHA384: [UInt8] = [
        0xB2, 0x6E, 0x7D, 0x28, 0xD1, 0x1A, 0x50, 0xBC, 0x53, 0xD8, 0x82, 0xBC, 0xF5, 0xFD, 0x3A, 0x1A,
        0x07, 0x41, 0x48, 0xBB, 0x35, 0xD3, 0xB4, 0xE4, 0xCB, 0x1C, 0x0A, 0xD9, 0xBD, 0xE4, 0x19, 0xCA,
        0xCB, 0x47, 0xBA, 0x09, 0x69, 0x96, 0x46, 0x15, 0x0F, 0x9F, 0xC0, 0x00, 0xF3, 0xF8, 0x0E, 0x12,
    ]

    /// The EK's public area (marshalled TPM2B_PUBLIC): CreatePrimary in the endorsement hierarchy with
    /// the default template (the same key every time, since primary keys derive from the seed), then flushed.
    /// - Throws: the TPM's error, e.g. `AUTH_FAIL` when the endorsement hierarchy has an authorization.
    public func endorsementKeyPublic(_ type: EndorsementKeyType) throws(TPMError) -> [UInt8] {
        try withTransient { () throws(TPMError) -> [UInt8] in try createEndorsementKey(type).publicArea }
    }

    /// Whether `publicArea` (marshalled TPM2B_PUBLIC) is the EK of `type`'s template: the same
    /// type, name algorithm, attributes, authPolicy, curve or key size and symmetric definition.
    public static func isEndorsementKey(_ type: EndorsementKeyType, publicArea: [UInt8]) -> Bool {
        guard let area = try? Marshal.public(publicArea).publicArea else { return false }
        let template = endorsementKeyTemplate(type).publicArea
        guard area.type == template.type, area.nameAlg == template.nameAlg, area.objectAttributes == template.objectAttributes,
              TPM2B.bytes(area.authPolicy.buffer, size: area.authPolicy.size)
                == TPM2B.bytes(template.authPolicy.buffer, size: template.authPolicy.size) else { return false }
        if area.type == UInt16(TPM2_ALG_RSA) {
            let (a, t) = (area.parameters.rsaDetail, template.parameters.rsaDetail)
            return a.keyBits == t.keyBits && a.symmetric.algorithm == t.symmetric.algorithm && a.symmetric.keyBits.aes == t.symmetric.keyBits.aes
                && a.symmetric.mode.aes == t.symmetric.mode.aes && a.scheme.scheme == t.scheme.scheme
        }
        let (a, t) = (area.parameters.eccDetail, template.parameters.eccDetail)
        return a.curveID == t.curveID && a.symmetric.algorithm == t.symmetric.algorithm && a.symmetric.keyBits.aes == t.symmetric.keyBits.aes
            && a.symmetric.mode.aes == t.symmetric.mode.aes && a.scheme.scheme == t.scheme.scheme && a.kdf.scheme == t.kdf.scheme
    }

    /// The default template of `type` (EK Credential Profile: L-1, L-2, H-3), with an empty unique.
    static func endorsementKeyTemplate(_ type: EndorsementKeyType) -> TPM2B_PUBLIC {
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
        inPublic.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT | TPMA_OBJECT_SENSITIVEDATAORIGIN
            | TPMA_OBJECT_ADMINWITHPOLICY | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT
        inPublic.publicArea.authPolicy.size = TPM2B.set(&inPublic.publicArea.authPolicy.buffer, Self.endorsementKeyPolicy)
        switch type {
        case .rsa2048:
            inPublic.publicArea.type = UInt16(TPM2_ALG_RSA)
            inPublic.publicArea.parameters.rsaDetail.symmetric.algorithm = UInt16(TPM2_ALG_AES)
            inPublic.publicArea.parameters.rsaDetail.symmetric.keyBits.aes = 128
            inPublic.publicArea.parameters.rsaDetail.symmetric.mode.aes = UInt16(TPM2_ALG_CFB)
            inPublic.publicArea.parameters.rsaDetail.scheme.scheme = UInt16(TPM2_ALG_NULL)
            inPublic.publicArea.parameters.rsaDetail.keyBits = 2048
            inPublic.publicArea.parameters.rsaDetail.exponent = 0
            inPublic.publicArea.unique.rsa.size = 256
        case .eccP256:
            Self.setP256StorageParameters(&inPublic.publicArea)
        case .eccP384:
            inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA384)
            inPublic.publicArea.objectAttributes |= TPMA_OBJECT_USERWITHAUTH
            inPublic.publicArea.authPolicy.size = TPM2B.set(&inPublic.publicArea.authPolicy.buffer, Self.endorsementKeyPolicyBSHA384)
            inPublic.publicArea.type = UInt16(TPM2_ALG_ECC)
            inPublic.publicArea.parameters.eccDetail.symmetric.algorithm = UInt16(TPM2_ALG_AES)
            inPublic.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 256
            inPublic.publicArea.parameters.eccDetail.symmetric.mode.aes = UInt16(TPM2_ALG_CFB)
            inPublic.publicArea.parameters.eccDetail.scheme.scheme = UInt16(TPM2_ALG_NULL)
            inPublic.publicArea.parameters.eccDetail.curveID = UInt16(TPM2_ECC_NIST_P384)
            inPublic.publicArea.parameters.eccDetail.kdf.scheme = UInt16(TPM2_ALG_NULL)
        }
        return inPublic
    }

    /// CreatePrimary of the EK: the transient handle (the caller flushes it) and its public area.
    func createEndorsementKey(_ type: EndorsementKeyType) throws(TPMError) -> (handle: TPMHandle, publicArea: [UInt8]) {
        var inPublic = Self.endorsementKeyTemplate(type)
        var inSensitive = TPM2B_SENSITIVE_CREATE()
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var primary: ESYS_TR = 0
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        try call("CreatePrimary(EK \(type.rawValue))") {
            Esys_CreatePrimary(esys, KC_ESYS_TR_RH_ENDORSEMENT, Self.password, Self.none, Self.none,
                               &inSensitive, &inPublic, &outsideInfo, &creationPCR, &primary, &outPublic, nil, nil, nil)
        }
        defer { Esys_Free(outPublic) }
        return (adopt(primary), try Marshal.public(outPublic!.pointee))
    }

    /// The public area (marshalled TPM2B_PUBLIC) of a loaded or persistent object.
    public func publicArea(of handle: TPMHandle) throws(TPMError) -> [UInt8] {
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        try call("ReadPublic") { Esys_ReadPublic(esys, handle.tr, Self.none, Self.none, Self.none, &outPublic, nil, nil) }
        defer { Esys_Free(outPublic) }
        return try Marshal.public(outPublic!.pointee)
    }

    /// The whole contents of an NV index readable with its own empty authorization (AUTHREAD), such
    /// as an EK certificate; nil when the index is not defined.
    public func readWholeNV(_ index: UInt32) throws(TPMError) -> [UInt8]? {
        let handle: TPMHandle
        do { handle = try resource(forPersistent: index) } catch where error.code.isHandleOrValueError { return nil }
        var nvPublic: UnsafeMutablePointer<TPM2B_NV_PUBLIC>?
        try call("NV_ReadPublic") { Esys_NV_ReadPublic(esys, handle.tr, Self.none, Self.none, Self.none, &nvPublic, nil) }
        let size = Int(nvPublic!.pointee.nvPublic.dataSize)
        Esys_Free(nvPublic)
        // NV_Read moves at most TPM_PT_NV_BUFFER_MAX bytes; 512 is below every TPM's.
        var out: [UInt8] = []
        while out.count < size {
            let chunk = UInt16(min(512, size - out.count))
            out += try readNV(handle, size: chunk, offset: UInt16(out.count))
        }
        return out
    }

    /// TPM_PT_MANUFACTURER, the four TPM_PT_VENDOR_STRING words and TPM_PT_FIRMWARE_VERSION_1 and _2.
    public func vendorProperties() throws(TPMError) -> (manufacturer: UInt32, vendor: [UInt32], firmware: (UInt32, UInt32)) {
        (try property(0x105), try (0x106...0x109).map { (p: UInt32) throws(TPMError) in try property(p) },
         (try property(0x10B), try property(0x10C)))
    }
}

extension TPMReturnCode {
    /// TPM_RC_HANDLE or TPM_RC_VALUE in any position: the handle names nothing on this TPM.
    var isHandleOrValueError: Bool {
        let format1 = rawValue & 0x80 != 0
        let number = format1 ? rawValue & 0x3F : rawValue & 0x7F
        return format1 && (number == 0x0B || number == 0x04)
    }
}
