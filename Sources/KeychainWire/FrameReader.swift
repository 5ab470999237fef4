#if canImport(Glibc)
import Glibc
#endif

/// One frame read from a stream socket as its bytes arrive. `read` reads it to the end, waiting
/// (`WireSocket.receive`); a caller that must not block its thread (an async client on Swift's
/// shared pool) takes what has arrived (`readAvailable`), waits for the socket elsewhere, and goes
/// on with the same reader.
///
/// The buffer grows with the bytes that arrive, never ahead of them: a header alone announcing
/// 16 MiB (4 bytes, then a stall) cost 16 MiB per connection, gigabytes for a few hundred.
public struct WireFrameReader {
    private var header = [UInt8](repeating: 0, count: 4)
    private var headerFilled = 0
    private var length = 0
    private var body: [UInt8] = []
    private var filled = 0
    private let max: Int

    public init(max: Int = Wire.maxMessage) { self.max = max }

    /// The frame's bytes read so far (its length's included).
    public var bytesRead: Int { headerFilled + filled }

    /// Reads the frame to its end. `idle` bounds the wait for its first byte, `stall` every later
    /// wait (seconds; 0 for none), so a peer that starts a frame and stops is cut off.
    public mutating func read(_ fd: Int32, idle: Int, stall: Int) throws(WireError) -> WireMessage {
        // A frame that is already there costs no wait; before its first byte, the wait comes first.
        var ready = bytesRead > 0
        while true {
            if !ready { try WireSocket.wait(fd, seconds: bytesRead == 0 ? idle : stall) }
            if let message = try readAvailable(fd) { return message }
            ready = false
        }
    }

    /// What the socket holds of the frame now, without waiting: the message once it is whole, nil
    /// while more is to come.
    public mutating func readAvailable(_ fd: Int32) throws(WireError) -> WireMessage? {
        while headerFilled < header.count {
            guard let n = try receive(fd, into: &header, at: headerFilled) else { return nil }
            headerFilled += n
        }
        if body.isEmpty {
            length = Int(header[0]) << 24 | Int(header[1]) << 16 | Int(header[2]) << 8 | Int(header[3])
            guard length >= 2, length <= max else {
                throw WireError(.badLength, "frame of \(length) bytes (2 to \(max) allowed)")
            }
            body = [UInt8](repeating: 0, count: Swift.min(length, 64 * 1024))
        }
        while true {
            while filled < body.count {
                guard let n = try receive(fd, into: &body, at: filled) else { return nil }
                filled += n
            }
            if filled == length { break }
            var bigger = [UInt8](repeating: 0, count: Swift.min(length, filled * 2))
            bigger.withUnsafeMutableBytes { dest in body.withUnsafeBytes { dest.copyMemory(from: $0) } }
            body.wipe()  // what arrived so far may be a secret: no stale copy
            body = bigger
        }
        return try WireMessage.decode(body)
    }

    /// Overwrites what was read (a reply carries secrets); call it when done with the reader.
    public mutating func wipe() { body.wipe() }

    /// One `recv` into `buffer` from `at`: the bytes read, nil when none are there now.
    private func receive(_ fd: Int32, into buffer: inout [UInt8], at: Int) throws(WireError) -> Int? {
        while true {
            let n = buffer.withUnsafeMutableBytes { raw in recv(fd, raw.baseAddress! + at, raw.count - at, Int32(MSG_DONTWAIT)) }
            if n > 0 { return n }
            if n == 0 {
                throw bytesRead == 0 ? WireError(.closed, "the peer closed the connection")
                    : WireError(.truncated, "the peer closed the connection mid-message")
            }
            let code = errno
            if code == EINTR { continue }
            if code == EAGAIN || code == EWOULDBLOCK { return nil }
            throw WireError(.io(code), "read failed: errno \(code)")
        }
    }
}
