internal import CTSS2
import KeychainBasics

/// What a process killed mid-operation leaves in a TPM that no resource manager cleans up.
extension TPMContext {
    /// Flushes transient objects and sessions left by other processes. Call it only while no other
    /// process can be using this TPM (the caller holds the TPM lock): it flushes whatever it finds.
    ///
    /// One GetCapability when nothing is left (the usual case): loaded and saved sessions
    /// (TPM_PT_HR_ACTIVE) and free object slots (TPM_PT_HR_TRANSIENT_AVAIL). Objects are flushed when
    /// fewer than 3 slots are free, the PC Client minimum (TPM_PT_HR_TRANSIENT_MIN) and what one of
    /// our operations needs. - Returns: the number of handles flushed.
    @discardableResult
    public func flushLeftovers() throws(TPMError) -> Int {
        let counts = try properties(from: KC_PT_HR_LOADED, count: 5)
        var leftovers: [UInt32] = []
        let active = counts[KC_PT_HR_ACTIVE] ?? 0, loaded = counts[KC_PT_HR_LOADED] ?? 0
        if loaded > 0 { leftovers += try handles(from: Self.loadedSessionFirst) }
        if active > loaded { leftovers += try handles(from: Self.savedSessionFirst) }
        if (counts[KC_PT_HR_TRANSIENT_AVAIL] ?? 0) < 3 { leftovers += try handles(from: Self.transientFirst) }
        for handle in leftovers { try flush(tpmHandle: handle) }
        return leftovers.count
    }

    static let transientFirst: UInt32 = 0x8000_0000
    static let loadedSessionFirst: UInt32 = 0x0200_0000
    static let savedSessionFirst: UInt32 = 0x0300_0000

    /// TPM properties (TPM_CAP_TPM_PROPERTIES) from `first` on, by property.
    func properties(from first: UInt32, count: UInt32) throws(TPMError) -> [UInt32: UInt32] {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try call("GetCapability(properties)") {
            Esys_GetCapability(esys, Self.none, Self.none, Self.none, TPM2_CAP_TPM_PROPERTIES, first, count, &more, &data)
        }
        defer { Esys_Free(data) }
        guard let data else { return [:] }
        let list = data.pointee.data.tpmProperties
        return withUnsafeBytes(of: list.tpmProperty) { raw in
            let items = raw.bindMemory(to: TPMS_TAGGED_PROPERTY.self).prefix(Int(list.count))
            return Dictionary(items.map { ($0.property, $0.value) }, uniquingKeysWith: { a, _ in a })
        }
    }

    /// The handles the TPM holds now, from `first` on: transient objects (0x80…), loaded sessions
    /// (0x02…; HMAC sessions are 0x02…, policy sessions 0x03…), saved sessions (0x03…).
    public func handles(from first: UInt32) throws(TPMError) -> [UInt32] {
        let isTransient = first >> 24 == 0x80
        var result: [UInt32] = []
        var next = first
        while true {
            var more: TPMI_YES_NO = 0
            var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
            try call("GetCapability(handles)") {
                Esys_GetCapability(esys, Self.none, Self.none, Self.none, TPM2_CAP_HANDLES, next, 64, &more, &data)
            }
            defer { Esys_Free(data) }
            guard let data else { return result }
            let list = data.pointee.data.handles
            let page = withUnsafeBytes(of: list.handle) { Array($0.bindMemory(to: UInt32.self).prefix(Int(list.count))) }
            result += isTransient ? page.filter { $0 >> 24 == 0x80 } : page
            // Sessions fit in one answer (a TPM holds a few); objects may take more.
            guard isTransient, more != 0, let last = page.last, last >> 24 == 0x80 else { return result }
            next = last + 1
        }
    }

    /// FlushContext of a TPM handle ESAPI has no resource for, as a raw command on the TCTI
    /// (Part 3, 28.4: tag NO_SESSIONS, size 14, TPM_CC_FlushContext, the handle). A handle that is
    /// already gone (TPM_RC_HANDLE) is not an error.
    func flush(tpmHandle: UInt32) throws(TPMError) {
        let command = UInt16(0x8001).bigEndianBytes + UInt32(14).bigEndianBytes + UInt32(0x165).bigEndianBytes
            + tpmHandle.bigEndianBytes
        do {
            try call("FlushContext(0x\(Hex.encode(tpmHandle, digits: 1)))") {
                var rc = kc_tcti_transmit(tcti, command.count, command)
                guard rc == 0 else { return rc }
                var response = [UInt8](repeating: 0, count: 64)
                var size = response.count
                rc = kc_tcti_receive(tcti, &size, &response)
                guard rc == 0 else { return rc }
                guard size >= 10 else { return TPMReturnCode.size.rawValue }
                return UInt32(bigEndianBytes: Array(response[6..<10])) ?? TPMReturnCode.failure.rawValue
            }
        } catch where error.code.is(.handle) || error.code.is(.value) {
            return
        }
    }
}
