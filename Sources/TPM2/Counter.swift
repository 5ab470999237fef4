internal import CTSS2
import SecureMemory

/// NV counters authorized by their own authValue (Part 3, 31.8 NV_Increment, 31.13 NV_Read) and the
/// TPM's clock counts (Part 3, 29.1 ReadClock): what binds a store to a monotonic counter.
extension TPMContext {
    /// TPM_PT_ORDERLY_COUNT: an orderly counter is saved to NV when its low bits reach this, so after
    /// a shutdown without TPM2_Shutdown it comes back ahead of its last value by at most this + 1.
    public static let propertyOrderlyCount: UInt32 = 0x100 + 29

    /// The TPM's resetCount and restartCount (TPMS_CLOCK_INFO): either changes at every TPM Reset or
    /// Restart, the events after which an orderly counter may have jumped ahead.
    public struct ClockCounts: Sendable, Hashable {
        public var resetCount: UInt32
        public var restartCount: UInt32
        public init(resetCount: UInt32, restartCount: UInt32) {
            self.resetCount = resetCount
            self.restartCount = restartCount
        }
    }

    /// ReadClock: needs no authorization.
    public func clockCounts() throws(TPMError) -> ClockCounts {
        var info: UnsafeMutablePointer<TPMS_TIME_INFO>?
        try call("ReadClock") { Esys_ReadClock(esys, Self.none, Self.none, Self.none, &info) }
        defer { Esys_Free(info) }
        guard let info else { throw TPMError(command: "ReadClock", code: .value) }
        return ClockCounts(resetCount: info.pointee.clockInfo.resetCount, restartCount: info.pointee.clockInfo.restartCount)
    }

    /// The value of a counter index whose authValue is set on `index` (`setAuth`), proven in an
    /// unsalted HMAC session the command closes: the authValue never crosses the bus. Two commands.
    public func readCounter(_ index: TPMHandle) throws(TPMError) -> UInt64 {
        var out: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        try withTransient { () throws(TPMError) in
            let session = try startSession(.hmac, saltKey: nil)
            try call("NV_Read(counter)", sessions: [session.tr]) {
                Esys_NV_Read(esys, index.tr, index.tr, session.tr, Self.none, Self.none, 8, 0, &out)
            }
        }
        defer { Esys_Free(out) }
        let bytes = TPM2B.bytes(out!.pointee.buffer, size: out!.pointee.size)
        guard bytes.count == 8 else { throw TPMError(command: "NV_Read(counter)", code: .size) }
        return bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// NV_Increment of a counter index whose authValue is set on `index`, in an unsalted HMAC session
    /// the command closes. Two commands.
    public func incrementCounter(_ index: TPMHandle) throws(TPMError) {
        try withTransient { () throws(TPMError) in
            let session = try startSession(.hmac, saltKey: nil)
            try call("NV_Increment(counter)", sessions: [session.tr]) {
                Esys_NV_Increment(esys, index.tr, index.tr, session.tr, Self.none, Self.none)
            }
        }
    }
}

extension NVAttributes {
    public static let orderly: UInt32 = 0x0400_0000
}
