#if canImport(Glibc)
import Glibc
#endif

/// `value` with one decimal, exactly as printf's `%.1f` writes it ("12.5"): the engine's sizes in its
/// messages and keychainctl's timings alike.
public func oneDecimal(_ value: Double) -> String {
    // A double's %.1f is at most 309 digits, the point and one more.
    withUnsafeTemporaryAllocation(of: CChar.self, capacity: 320) { buffer in
        _ = withVaList([value]) { vsnprintf(buffer.baseAddress, buffer.count, "%.1f", $0) }
        return String(cString: buffer.baseAddress!)
    }
}
