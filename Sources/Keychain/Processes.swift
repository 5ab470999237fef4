import Foundation

/// Loopback ports and child processes, for the embedded software TPM and the test-support one.
package enum Processes {
    /// Starts `path` with stdin, stdout and stderr on /dev/null; returns its pid.
    /// posix_spawn, not Foundation's `Process`, which needs a run loop that an actor's thread lacks.
    package static func spawn(_ path: String, _ argv: [String]) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd in 0...2 { posix_spawn_file_actions_addopen(&actions, Int32(fd), "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0) }
        var cArgs = argv.map { strdup($0) } + [nil]
        defer { cArgs.forEach { free($0) } }
        var pid: pid_t = 0
        return posix_spawn(&pid, path, &actions, nil, &cArgs, environ) == 0 ? pid : nil
    }

    /// Waits for a child; its exit status, or -1 when a signal ended it.
    package static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : -1
    }

    /// An even port P such that P and P+1 (swtpm's command and control ports) were free a moment ago.
    package static func freePortPair() -> Int {
        for _ in 0..<50 {
            let port = Int.random(in: 20_000..<60_000) & ~1
            if isFree(port) && isFree(port + 1) { return port }
        }
        return Int.random(in: 20_000..<60_000) & ~1
    }

    /// Whether nothing listens on 127.0.0.1:`port` (we could bind it a moment ago).
    package static func isFree(_ port: Int) -> Bool {
        withLoopbackSocket(port) { fd, addr in bind(fd, addr, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }

    /// Whether something accepts connections on 127.0.0.1:`port`.
    package static func canConnect(_ port: Int) -> Bool {
        withLoopbackSocket(port) { fd, addr in connect(fd, addr, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }

    private static func withLoopbackSocket(_ port: Int, _ body: (Int32, UnsafePointer<sockaddr>) -> Bool) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        addr.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body(fd, $0) } }
    }
}
