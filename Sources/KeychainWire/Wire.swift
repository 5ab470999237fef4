#if canImport(Glibc)
import Glibc
#endif
import KeychainBasics

/// The keychaind protocol, version 2: what travels on the daemon's Unix socket (version 1 carried a
/// storage's options and prompts as JSON; 2 carries them as nested fields, `WireStorageOptions`).
///
/// A frame is a 4-byte big-endian length, then that many bytes of message (at most `maxMessage`).
/// A message is `[version][kind]`, then fields `[tag][4-byte big-endian length][bytes]` with tags
/// strictly increasing, so one message has exactly one encoding and a decoder never guesses.
/// No Foundation here: a small client links this module alone.
public enum Wire {
    public static let version: UInt8 = 2
    /// The largest message: a 16 MiB value plus room for the options and key.
    public static let maxMessage = 16 * 1024 * 1024 + 64 * 1024
}

public struct WireError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// The peer closed before the first byte of a frame.
        case closed
        /// The peer closed or failed mid-frame.
        case truncated
        /// Nothing (or not all of a frame) arrived within the timeout.
        case timedOut
        /// A frame longer than `Wire.maxMessage`, or of length 0.
        case badLength
        /// A message that does not decode.
        case malformed
        /// Another protocol version.
        case version
        /// The socket's listener is a uid this process does not trust to serve the keychain
        /// (`WireSocket.connect`): nothing was sent.
        case untrustedPeer(UInt32)
        case io(Int32)
    }
    public let kind: Kind
    public let detail: String
    public init(_ kind: Kind, _ detail: String) { self.kind = kind; self.detail = detail }
    public var description: String { detail }
    /// Equal by kind: the detail is for people.
    public static func == (lhs: WireError, rhs: WireError) -> Bool { lhs.kind == rhs.kind }
}

/// One decoded message: its kind and its fields by tag.
public struct WireMessage: Sendable {
    public var kind: UInt8
    public private(set) var fields: [(tag: UInt8, bytes: [UInt8])] = []

    public init(kind: UInt8) { self.kind = kind }

    /// Appends a field; tags must be added in increasing order.
    public mutating func add(_ tag: UInt8, _ bytes: [UInt8]) {
        precondition(fields.last.map { $0.tag < tag } ?? true, "fields in increasing tag order")
        fields.append((tag, bytes))
    }
    public mutating func add(_ tag: UInt8, _ bytes: [UInt8]?) { if let bytes { add(tag, bytes) } }
    public mutating func add(_ tag: UInt8, _ text: String?) { if let text { add(tag, Array(text.utf8)) } }
    public mutating func add(_ tag: UInt8, _ value: UInt64?) {
        if let value { add(tag, (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * $0)) }) }
    }
    public mutating func add(_ tag: UInt8, _ value: Bool?) { if let value { add(tag, [value ? 1 : 0]) } }

    public func bytes(_ tag: UInt8) -> [UInt8]? { fields.first { $0.tag == tag }?.bytes }

    public func string(_ tag: UInt8) throws(WireError) -> String? {
        guard let bytes = bytes(tag) else { return nil }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw WireError(.malformed, "field \(tag) is not UTF-8")
        }
        return text
    }
    public func uint(_ tag: UInt8) throws(WireError) -> UInt64? {
        guard let bytes = bytes(tag) else { return nil }
        guard bytes.count == 8 else { throw WireError(.malformed, "field \(tag) is not an 8-byte integer") }
        return bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }
    public func bool(_ tag: UInt8) throws(WireError) -> Bool? {
        guard let bytes = bytes(tag) else { return nil }
        guard bytes.count == 1, bytes[0] <= 1 else { throw WireError(.malformed, "field \(tag) is not a boolean") }
        return bytes[0] == 1
    }

    /// The message's bytes (without the frame's length).
    public func encoded() -> [UInt8] { serialized(framed: false) }

    /// The frame: the message's length, then the message.
    func framed() -> [UInt8] { serialized(framed: true) }

    private func serialized(framed: Bool) -> [UInt8] {
        let length = 2 + fields.reduce(0) { $0 + 5 + $1.bytes.count }
        var out: [UInt8] = []
        out.reserveCapacity((framed ? 4 : 0) + length)
        if framed { appendLength(&out, length) }
        out.append(Wire.version)
        out.append(kind)
        for (tag, bytes) in fields {
            out.append(tag)
            appendLength(&out, bytes.count)
            out += bytes
        }
        return out
    }

    /// Decodes a message; anything else is `malformed` or `version`, never a crash.
    public static func decode(_ data: [UInt8]) throws(WireError) -> WireMessage {
        try data.withUnsafeBufferPointer { bytes throws(WireError) in try decode(bytes) }
    }

    /// Decodes a message in place (a frame in `WireReader`'s buffer), copying only its fields.
    static func decode(_ data: UnsafeBufferPointer<UInt8>) throws(WireError) -> WireMessage {
        guard data.count >= 2 else { throw WireError(.malformed, "message shorter than its header") }
        guard data[0] == Wire.version else {
            throw WireError(.version, "protocol version \(data[0]), this side speaks \(Wire.version)")
        }
        var message = WireMessage(kind: data[1])
        var at = 2
        while at < data.count {
            guard data.count - at >= 5 else { throw WireError(.malformed, "field header cut at byte \(at)") }
            let tag = data[at]
            let length = Int(data[at + 1]) << 24 | Int(data[at + 2]) << 16 | Int(data[at + 3]) << 8 | Int(data[at + 4])
            at += 5
            guard length <= data.count - at else { throw WireError(.malformed, "field \(tag) runs past the message") }
            if let last = message.fields.last, last.tag >= tag {
                throw WireError(.malformed, "field \(tag) out of order or repeated")
            }
            message.fields.append((tag, Array(data[at..<(at + length)])))
            at += length
        }
        return message
    }

    /// Overwrites every field's bytes (secrets travel in fields) before the message is released.
    public mutating func wipe() {
        for index in fields.indices { fields[index].bytes.wipe() }
    }
}

extension Array where Element == UInt8 {
    /// Zeroes the bytes in place (a best effort for buffers that held a secret).
    public mutating func wipe() {
        withUnsafeMutableBytes { raw in
            guard let base = raw.baseAddress else { return }
            _ = memset(base, 0, raw.count)
        }
    }
}

private func appendLength(_ out: inout [UInt8], _ length: Int) {
    for shift in stride(from: 24, through: 0, by: -8) { out.append(UInt8(truncatingIfNeeded: length >> shift)) }
}

/// Frames on a connected stream socket (blocking; `poll` bounds each wait).
public enum WireSocket {
    /// Writes one frame, length and message in one `send` (one wake-up of the reader, not two).
    public static func send(_ fd: Int32, _ message: WireMessage) throws(WireError) {
        var frame = message.framed()
        defer { frame.wipe() }
        try writeAll(fd, frame)
    }

    /// Sends a request and reads the peer's next frame, never reading past it (`WireReader.exchange`).
    public static func exchange(_ fd: Int32, _ message: WireMessage, idle: Int, stall: Int) throws(WireError) -> WireMessage {
        try WireReader(fd: fd, batched: false).exchange(message, idle: idle, stall: stall)
    }

    /// Reads one frame and decodes it, never reading past it (`WireReader.receive`).
    public static func receive(_ fd: Int32, idle: Int, stall: Int, max: Int = Wire.maxMessage) throws(WireError) -> WireMessage {
        try WireReader(fd: fd, batched: false).receive(idle: idle, stall: stall, max: max)
    }

    /// Until `fd` is readable (or closed); `timedOut` after `seconds` (0: no limit).
    static func wait(_ fd: Int32, seconds: Int) throws(WireError) {
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        switch valueOrErrno({ poll(&entry, 1, seconds > 0 ? Int32(clamping: seconds * 1000) : -1) }) {
        case .success(0): throw WireError(.timedOut, "no message within the timeout")
        case .success: return  // readable, hung up or failed: the recv says which
        case .failure(let code): throw WireError(.io(code.rawValue), "poll failed: errno \(code.rawValue)")
        }
    }

    static func writeAll(_ fd: Int32, _ bytes: [UInt8]) throws(WireError) {
        var at = 0
        while at < bytes.count {
            // MSG_NOSIGNAL: a peer gone mid-write is EPIPE here, not a SIGPIPE that ends the process.
            let sent = valueOrErrno { bytes.withUnsafeBytes { raw in Glibc.send(fd, raw.baseAddress! + at, bytes.count - at, Int32(MSG_NOSIGNAL)) } }
            let code: Errno
            switch sent {
            case .success(let n) where n > 0: at += n; continue
            case .success: code = .current
            case .failure(let failed):
                if failed == .resourceTemporarilyUnavailable || failed == .wouldBlock { throw WireError(.timedOut, "the peer stopped reading") }
                code = failed
            }
            throw WireError(.io(code.rawValue), "write failed: errno \(code.rawValue)")
        }
    }

    /// The system user that dist/systemd runs keychaind as.
    public static let serviceUser = "keychaind"
    /// `serviceUser`'s uid, nil when there is no such user (looked up once: getpwnam_r, thread-safe).
    public static let serviceUID: UInt32? = {
        var entry = passwd()
        var found: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16384)
        guard getpwnam_r(serviceUser, &entry, &buffer, buffer.count, &found) == 0, found != nil else { return nil }
        return entry.pw_uid
    }()

    /// Who may serve the keychain to this process: root, this process's effective uid (its own
    /// items are its own anyway) and `serviceUser`. Anyone else listening at the path would receive
    /// the values written and the passcodes answered.
    public static func isTrusted(uid: UInt32) -> Bool {
        uid == 0 || uid == geteuid() || uid == serviceUID
    }

    /// The pid, uid and gid of a connected Unix socket's peer (SO_PEERCRED: the kernel's record, taken
    /// when the peer connected or listened, which it cannot choose), or nil when the kernel gives none.
    public static func peerCredentials(_ fd: Int32) -> (pid: Int32, uid: UInt32, gid: UInt32)? {
        // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (Glibc shows it only with _GNU_SOURCE).
        var credentials = (pid: Int32(0), uid: UInt32(0), gid: UInt32(0))
        var length = socklen_t(12)
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0, length == 12 else { return nil }
        return credentials
    }

    /// A connected Unix stream socket to `path`, close-on-exec, or the errno of the failure; a
    /// listener whose uid `isTrusted` does not accept is refused (`untrustedPeer`) before anything is
    /// sent, so a socket planted where KEYCHAIN_SOCKET points gets no secret.
    public static func connect(path: String) -> Result<Int32, WireError> {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(WireError(.io(errno), "socket: errno \(errno)")) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(fd)
            return .failure(WireError(.io(ENAMETOOLONG), "socket path longer than 107 bytes"))
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, b) in bytes.enumerated() { raw[i] = b }
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard result == 0 else {
            let code = errno
            close(fd)
            return .failure(WireError(.io(code), "connect: errno \(code)"))
        }
        let peer = peerCredentials(fd)?.uid
        guard let peer, isTrusted(uid: peer) else {
            close(fd)
            let service = serviceUID.map { "the user \(serviceUser) (uid \($0))" } ?? "the user \(serviceUser)"
            return .failure(WireError(.untrustedPeer(peer ?? UInt32.max),
                                      "The keychain service at \(path) is not trusted: its socket belongs to "
                                      + (peer.map { "uid \($0)" } ?? "an unknown uid") + ", and only root, this user (uid \(geteuid())) or "
                                      + "\(service) may serve the keychain; nothing was sent (point KEYCHAIN_SOCKET at keychaind's socket)"))
        }
        return .success(fd)
    }
}

/// What a client of keychaind tells its caller when the socket fails it: a KeychainError code's raw
/// value, the message and the cause. The library's client and keychainctl's front both say these,
/// so their words cannot drift apart.
public struct WireFailure: Sendable {
    public enum Cause: Sendable { case errno(Int32), detail(String) }
    public let code: String
    public let message: String
    public let cause: Cause?

    /// `WireSocket.connect(path:)` failed: nothing listens there, or a listener that is not trusted.
    public init(connecting error: WireError, socket: String) {
        code = "HARDWARE_UNAVAILABLE"
        switch error.kind {
        case .untrustedPeer:
            (message, cause) = (error.detail, nil)
        default:
            message = "The keychain service is not running: nothing answers on \(socket) (start keychaind or its "
                + "socket unit; keychainctl --direct uses a store without the service)"
            let code: Int32 = if case .io(let value) = error.kind { value } else { 0 }
            cause = .errno(code)
        }
    }

    /// An exchange on a connected socket failed; `replyTimeout` is the client's wait for a reply.
    public init(exchanging error: WireError, socket: String, replyTimeout: Int) {
        switch error.kind {
        case .closed, .truncated:
            (code, message) = ("HARDWARE_UNAVAILABLE", "The keychain service stopped during the call (\(socket)): the call may or "
                               + "may not have taken effect; check and retry")
        case .timedOut:
            (code, message) = ("HARDWARE_UNAVAILABLE", "The keychain service did not answer within \(replyTimeout) s (\(socket))")
        case .io:
            // EPIPE or ECONNRESET: the daemon closed the connection (at its limits, or stopping).
            (code, message) = ("HARDWARE_UNAVAILABLE", "The keychain service closed the connection (\(socket)): it may be at its "
                               + "connection limit or stopping; the call may or may not have taken effect; check and retry")
        default:
            (code, message, cause) = ("INTERNAL", "The keychain service's reply does not decode: \(error.detail)", nil)
            return
        }
        cause = .detail(error.detail)
    }
}
