#if canImport(Glibc)
import Glibc
#endif

/// An errno value, typed (swift-system's `Errno`, kept to what the keychain names).
public struct Errno: RawRepresentable, Error, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// This thread's `errno` now.
    public static var current: Errno { Errno(rawValue: errno) }

    public static let interrupted = Errno(rawValue: EINTR)
    public static let wouldBlock = Errno(rawValue: EWOULDBLOCK)
    public static let resourceTemporarilyUnavailable = Errno(rawValue: EAGAIN)

    /// strerror's text ("Permission denied").
    public var description: String { String(cString: strerror(rawValue)) }
}

/// The one errno path for system calls: runs `call` again while it fails with EINTR, then returns its
/// value, or the errno it failed with (a result of -1; swift-system's `valueOrErrno`).
@inline(__always)
public func valueOrErrno<I: FixedWidthInteger>(_ call: () -> I) -> Result<I, Errno> {
    while true {
        let value = call()
        if value != -1 { return .success(value) }
        let code = errno
        if code != EINTR { return .failure(Errno(rawValue: code)) }
    }
}

/// sd-bus's and libsystemd's convention: a status of `-errno` on failure, 0 or more on success.
@inline(__always)
public func valueOrNegatedErrno(_ status: Int32) -> Result<Int32, Errno> {
    status >= 0 ? .success(status) : .failure(Errno(rawValue: -status))
}
