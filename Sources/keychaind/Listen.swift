import Glibc

struct ListenError: Error, CustomStringConvertible { let description: String }

/// A listening Unix socket at `path`, readable and writable by everyone: who may do what is decided
/// per call from the peer's credentials, not by the socket's mode. A stale socket file is replaced;
/// any other file at `path` is refused.
func listenUnix(path: String) throws -> Int32 {
    var info = stat()
    if lstat(path, &info) == 0 {
        guard info.st_mode & S_IFMT == S_IFSOCK else { throw ListenError(description: "\(path) exists and is not a socket") }
        unlink(path)
    }
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw ListenError(description: "socket: errno \(errno)") }
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { throw ListenError(description: "socket path too long: \(path)") }
    withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in bytes.enumerated() { raw[i] = b } }
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
    guard bound == 0 else { throw ListenError(description: "bind \(path): errno \(errno)") }
    chmod(path, 0o666)
    guard listen(fd, 1024) == 0 else { throw ListenError(description: "listen \(path): errno \(errno)") }
    return fd
}

/// The path a listening Unix socket is bound to (getsockname), nil for another kind of socket.
func boundPath(of fd: Int32) -> String? {
    var address = sockaddr_un()
    var length = socklen_t(MemoryLayout<sockaddr_un>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard named == 0, address.sun_family == sa_family_t(AF_UNIX) else { return nil }
    return withUnsafeBytes(of: &address.sun_path) { raw in
        let bytes = raw.prefix(max(0, Int(length) - MemoryLayout<sa_family_t>.size))
        return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
    }
}
