internal import CTSS2

/// What a device's identity document needs from its TPM: the endorsement key's public area (TCG EK
/// Credential Profile 2.0, default templates L-1 and L-2), NV contents such as the EK certificates,
/// public areas of persistent objects, and the vendor properties.
extension TPMContext {
    public enum EndorsementKeyType: String, Sendable, CaseIterable {
        /// Template L-1: RSA 2048, AES-128-CFB, certificate at NV 0x01C00002.
        case rsa2048
        /// Template L-2: ECC NIST P-256, AES-128-CFB, certificate at NV 0x01C0000A.
        case eccP256

        public var certificateIndex: UInt32 { self == .rsa2048 ? 0x01C0_0002 : 0x01C0_000A }
    }

    /// PolicySecret(TPM_RH_ENDORSEMENT): the default EK templates' authPolicy (EK profile, B.3.3).
    public static let endorsementKeyPolicy: [UInt8] = [
        0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xB3, 0xF8, 0x1A, 0x90, 0xCC, 0x8D, 0x46, 0xA5, 0xD7, 0x24,
        0xFD, 0x52, 0xD7, 0x6E, 0x06, 0x52, 0x0B, 0x64, 0xF2, 0xA1, 0xDA, 0x1B, 0x33, 0x14, 0x69, 0xAA,
    ]

    /// The EK's public area (marshalled TPM2B_PUBLIC): CreatePrimary in the endorsement hierarchy with
    /// the default template (the same key every time, since primary keys derive from the seed), then flushed.
    /// - Throws: the TPM's error, e.g. `AUTH_FAIL` when the endorsement hierarchy has an authorization.
    public func endorsementKeyPublic(_ type: EndorsementKeyType) throws(TPMError) -> [UInt8] {
        let ek = try createEndorsementKey(type)
        defer { flush(ek.handle) }
        return ek.publicArea
    }

    /// CreatePrimary of the EK: the transient handle (the caller flushes it) and its public area.
    func createEndorsementKey(_ type: EndorsementKeyType) throws(TPMError) -> (handle: TPMHandle, publicArea: [UInt8]) {
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
        }
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
        let handle = TPMHandle(tr: primary, mustFlush: true)
        do { return (handle, try Marshal.public(outPublic!.pointee)) } catch {
            flush(handle)
            throw error
        }
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
