internal import CTSS2

/// The TSS's marshalling (Tss2_MU_*) behind two calls, so that every return code of it is checked in
/// one place: a structure to its wire bytes, and wire bytes, all of them, back to a structure.
enum Marshal {
    typealias Marshaller<T> = (UnsafePointer<T>?, UnsafeMutablePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?) -> TSS2_RC
    typealias Unmarshaller<T> = (UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?, UnsafeMutablePointer<T>?) -> TSS2_RC

    /// `value` in the TPM's wire format (`Tss2_MU_<type>_Marshal`).
    static func encode<T>(_ type: String, _ value: T, _ marshal: Marshaller<T>) throws(TPMError) -> [UInt8] {
        var value = value
        var buffer = [UInt8](repeating: 0, count: MemoryLayout<T>.size + 8)
        var offset = 0
        try TPMContext.local("marshal \(type)") { marshal(&value, &buffer, buffer.count, &offset) }
        return Array(buffer.prefix(offset))
    }

    /// The structure `bytes` hold (`Tss2_MU_<type>_Unmarshal`), starting from `empty`; bytes left over
    /// after it are refused as a wrong size, since what we store is exactly one structure.
    static func decode<T>(_ type: String, _ bytes: [UInt8], as empty: T, _ unmarshal: Unmarshaller<T>) throws(TPMError) -> T {
        var out = empty
        var offset = 0
        try TPMContext.local("unmarshal \(type)") { unmarshal(bytes, bytes.count, &offset, &out) }
        guard offset == bytes.count else { throw TPMError(command: "unmarshal \(type)", code: .size) }
        return out
    }
}

extension TPMContext {
    /// Checks the return code of a TSS call that sends nothing to the TPM (marshalling, a session's
    /// attributes or nonce held by ESAPI): no command counted, no retry, no deadline, unlike `call`.
    static func local(_ what: String, _ body: () -> TSS2_RC) throws(TPMError) {
        let rc = body()
        guard rc == 0 else { throw TPMError(command: what, code: .init(rawValue: rc)) }
    }
}
