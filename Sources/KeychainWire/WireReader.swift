#if canImport(Glibc)
import Glibc
#endif
import KeychainBasics

/// Frames from one connected stream socket, in order, in as few `recv` calls as the socket allows.
///
/// Batched (keychaind's connections, the library's kept connections): one `recv` takes what the
/// socket holds, up to `chunk` bytes or the rest of a longer frame, so a frame that arrived whole
/// costs one call, its length and body together; bytes past a frame are the start of the next one
/// and are kept here for the next `receive`, in order. The wait for a frame's first byte is that
/// `recv` itself, blocking under `SO_RCVTIMEO` (set here when the timeout changes), not a `poll`
/// before it: a batched reader needs a blocking socket. Not batched (`WireSocket.receive`): each
/// `recv` asks for at most the rest of the current frame, so nothing past it is taken from the
/// socket, and a `poll` bounds the first wait.
///
/// Either way the buffer grows with the bytes that arrive, never ahead of them (a header alone
/// announcing 16 MiB costs `chunk` bytes, not 16 MiB), `idle` bounds the wait for a frame's first
/// byte and `stall` every later wait, and every byte that held a frame is zeroed before it is
/// reused or freed (frames carry secrets).
///
/// - Important: one thread at a time: a connection's thread in keychaind, or the one exchange of a
///   library call that holds the connection.
public final class WireReader: @unchecked Sendable {
    public let fd: Int32
    private let batched: Bool
    /// Bytes received and not yet returned are `storage[start..<end]`.
    private var storage: UnsafeMutablePointer<UInt8>?
    private var capacity = 0
    private var start = 0
    private var end = 0
    /// The `SO_RCVTIMEO` this reader last set on `fd` (seconds, 0: none), nil before the first.
    private var receiveTimeout: Int?

    /// What one `recv` may take beyond the rest of the current frame, and the buffer a connection
    /// keeps between frames (a larger one, grown for a long frame, is freed after it): a warm read's
    /// request or reply is a few hundred bytes.
    static let chunk = 4096

    public init(fd: Int32, batched: Bool = true) {
        self.fd = fd
        self.batched = batched
    }

    deinit { release() }

    /// Whether bytes past the last frame returned were received: the start of another frame.
    public var hasPending: Bool { end > start }

    /// The next frame, decoded. `idle` bounds the wait for its first byte, `stall` every later wait
    /// (seconds; 0 for none), so a peer that starts a frame and stops is cut off.
    public func receive(idle: Int, stall: Int, max: Int = Wire.maxMessage) throws(WireError) -> WireMessage {
        while true {
            let held = end - start
            var need = 4 - held
            if held >= 4 {
                let at = storage! + start
                let length = Int(at[0]) << 24 | Int(at[1]) << 16 | Int(at[2]) << 8 | Int(at[3])
                guard length >= 2, length <= max else {
                    throw WireError(.badLength, "frame of \(length) bytes (2 to \(max) allowed)")
                }
                if held >= 4 + length { return try take(length) }
                need = 4 + length - held
            }
            try fill(need: need, idle: idle, stall: stall)
        }
    }

    /// Sends a request and reads the peer's next frame. When the peer closed the connection before
    /// reading the request (EPIPE, ECONNRESET), the frame it left before closing is the reply:
    /// keychaind says so when it cannot serve a connection (no thread for it).
    public func exchange(_ message: WireMessage, idle: Int, stall: Int) throws(WireError) -> WireMessage {
        do {
            try WireSocket.send(fd, message)
        } catch {
            guard case .io(let code) = error.kind, code == EPIPE || code == ECONNRESET,
                  let left = try? receive(idle: 1, stall: 1) else { throw error }
            return left
        }
        return try receive(idle: idle, stall: stall)
    }

    /// `exchange` on a connection kept idle since its last complete exchange; nil when the peer had
    /// closed it without reading the request, which then was not served and may be sent again on a
    /// new connection, whatever it asks.
    ///
    /// Nil when the send fails with EPIPE or ECONNRESET (the peer's end was closed: nothing reached a
    /// reader), or when the reply's first read fails with ECONNRESET: Linux resets a Unix stream
    /// whose closer left bytes unread in its socket (`unix_release_sock`), and keychaind serves a
    /// request only once it has read the whole frame, so unread bytes are a request not served. The
    /// end of the stream before a reply is not nil: the peer read the request and may have served it.
    /// This replaces a `poll` of every kept connection before its reuse, which also missed a daemon
    /// closing it between that check and the send.
    public func exchangeKept(_ message: WireMessage, idle: Int, stall: Int) throws(WireError) -> WireMessage? {
        try exchangeUnlessUnread(message, idle: idle, stall: stall, takingWordLeft: false)
    }

    /// `exchange` on a connection made for this request; nil when the peer closed it without reading
    /// the request and without a word, so that it was not served and may be sent again on another new
    /// connection, whatever it asks.
    ///
    /// As `exchangeKept`, but a frame the peer left before closing is the reply, as in `exchange`:
    /// keychaind says so when it cannot serve a connection (its connection limit). A new connection
    /// closes unread when the request comes after keychaind's idle timeout (the caller waited that long
    /// for a thread to wait on) or when keychaind stopped between the connect and the request.
    public func exchangeNew(_ message: WireMessage, idle: Int, stall: Int) throws(WireError) -> WireMessage? {
        try exchangeUnlessUnread(message, idle: idle, stall: stall, takingWordLeft: true)
    }

    /// `exchangeKept` and `exchangeNew`: after a send the peer refused, the frame it left is the reply
    /// only when `takingWordLeft`.
    private func exchangeUnlessUnread(_ message: WireMessage, idle: Int, stall: Int, takingWordLeft: Bool) throws(WireError) -> WireMessage? {
        do {
            try WireSocket.send(fd, message)
        } catch {
            guard case .io(let code) = error.kind, code == EPIPE || code == ECONNRESET else { throw error }
            return takingWordLeft ? try? receive(idle: 1, stall: 1) : nil
        }
        do {
            return try receive(idle: idle, stall: stall)
        } catch {
            if case .io(ECONNRESET) = error.kind, !hasPending { return nil }
            throw error
        }
    }

    /// Decodes the whole frame at `start` (its message `length` bytes), then zeroes and drops it.
    private func take(_ length: Int) throws(WireError) -> WireMessage {
        let at = storage! + start
        defer {
            _ = memset(at, 0, 4 + length)
            start += 4 + length
            if start == end {
                (start, end) = (0, 0)
                if capacity > Self.chunk { release() }
            }
        }
        return try WireMessage.decode(UnsafeBufferPointer(start: at + 4, count: length))
    }

    /// Receives at least one more byte of the current frame (`need` more complete it).
    private func fill(need: Int, idle: Int, stall: Int) throws(WireError) {
        let held = end - start
        // Up to the rest of the frame (batched: or `chunk`, to take a short next frame too), and
        // never more than is already held beyond the first `chunk`: no memory ahead of the bytes.
        let space = Swift.min(batched ? Swift.max(need, Self.chunk) : need, Swift.max(Self.chunk, held))
        reserve(space)
        let first = held == 0
        // Batched, the wait for a frame's first byte is this recv itself (under SO_RCVTIMEO).
        let blocking = first && batched
        if blocking { try setReceiveTimeout(idle) } else if first { try WireSocket.wait(fd, seconds: idle) }
        while true {
            let code: Errno
            switch valueOrErrno({ recv(fd, storage! + end, space, blocking ? 0 : Int32(MSG_DONTWAIT)) }) {
            case .success(0):
                throw first ? WireError(.closed, "the peer closed the connection")
                    : WireError(.truncated, "the peer closed the connection mid-message")
            case .success(let n): end += n; return
            case .failure(let failed): code = failed
            }
            guard code == .resourceTemporarilyUnavailable || code == .wouldBlock else {
                throw WireError(.io(code.rawValue), "read failed: errno \(code.rawValue)")
            }
            if blocking { throw WireError(.timedOut, "no message within the timeout") }
            try WireSocket.wait(fd, seconds: first ? idle : stall)
        }
    }

    /// Room for `space` more bytes after `end`: what is held moves to the front, or to a larger buffer.
    private func reserve(_ space: Int) {
        let held = end - start
        if let storage, start > 0, capacity - end < space {
            _ = memmove(storage, storage + start, held)
            _ = memset(storage + held, 0, end - held)  // what moved leaves no copy behind
            (start, end) = (0, held)
        }
        guard capacity - end < space else { return }
        let grown = UnsafeMutablePointer<UInt8>.allocate(capacity: held + space)
        if let storage { _ = memcpy(grown, storage + start, held) }
        release()
        (storage, capacity, start, end) = (grown, held + space, 0, held)
    }

    /// Zeroes and frees the buffer.
    private func release() {
        guard let storage else { return }
        _ = memset(storage, 0, capacity)
        storage.deallocate()
        (self.storage, capacity, start, end) = (nil, 0, 0, 0)
    }

    private func setReceiveTimeout(_ seconds: Int) throws(WireError) {
        guard receiveTimeout != seconds else { return }
        var value = timeval(tv_sec: seconds, tv_usec: 0)
        guard setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size)) == 0 else {
            throw WireError(.io(errno), "setsockopt SO_RCVTIMEO failed: errno \(errno)")
        }
        receiveTimeout = seconds
    }
}
