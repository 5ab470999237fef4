import KeychainCore
import KeychainBasics
import Glibc
internal import CSpawn

extension CallerIdentity {
    /// The application of a connected Unix socket's peer (`uid` and `pid` from `SO_PEERCRED`), taken
    /// race-free: the peer as a pidfd (`SO_PEERPIDFD`, Linux 6.5; else `pidfd_open(pid)`), its pid
    /// from the pidfd, `/proc/PID/cgroup` and `/proc/PID/root/.flatpak-info` read, and then the pidfd
    /// checked to still name a living process of that pid: what was read was that process's.
    ///
    /// - Throws: `ACCESS_DENIED` when the peer exited (or its pid was reused) before the check, or
    ///   when what tells its application cannot be read: never the uid's unconfined caller instead,
    ///   or a sandboxed app that connects and exits, leaving the socket to a child, would escape.
    package static func ofPeer(socket fd: Int32, uid: UInt32, pid: Int32) throws(KeychainError) -> CallerIdentity {
        let pidfd = try peerPidfd(socket: fd, pid: pid)
        defer { close(pidfd) }
        return try of(pidfd: pidfd, uid: uid, pid: pid)
    }

    /// The application of a process the bus vouches for (a D-Bus sender: `GetConnectionCredentials`'
    /// uid, pid and, where the bus gives one, pidfd), read as `ofPeer` reads a socket's peer. Without a
    /// pidfd, `pidfd_open(pid)`: a pid reused before that names the new process (docs/security.md).
    /// - Throws: `ACCESS_DENIED` as `ofPeer`: the process is gone, or its application cannot be read.
    package static func ofProcess(uid: UInt32, pid: Int32, pidfd given: Int32?) throws(KeychainError) -> CallerIdentity {
        try readingProcess(pid: pid, pidfd: given) { pid throws(KeychainError) in try application(uid: uid, pid: pid) }
    }

    /// What `read` reads of the process a D-Bus sender's credentials name (`/proc/PID/…`, given the
    /// pid), race-free where the bus gives a pidfd: `read` runs on the pid the pidfd names, and what
    /// it read counts only when the pidfd still names that pid after it. Without one, `pidfd_open(pid)`.
    /// - Throws: `ACCESS_DENIED` when the process is gone (or its pid reused) before the check after.
    package static func readingProcess<T>(pid: Int32, pidfd given: Int32?,
                                          _ read: (_ pid: Int32) throws(KeychainError) -> T) throws(KeychainError) -> T {
        if let given { return try reading(pidfd: given, pid: pid, read) }
        let opened = pidfd_open(pid, 0)
        guard opened >= 0 else {
            let code = errno
            if code == ESRCH { throw gone(pid) }
            throw KeychainError(.internal, "Cannot open pid \(pid)'s pidfd (pidfd_open: errno \(code))", underlying: .errno(code))
        }
        defer { close(opened) }
        return try reading(pidfd: opened, pid: pid, read)
    }

    /// `read` of the process `pidfd` names: its pid from the pidfd, `read` given it, then the pidfd
    /// checked to still name a living process of that pid (what was read was its own).
    private static func reading<T>(pidfd: Int32, pid: Int32, _ read: (_ pid: Int32) throws(KeychainError) -> T) throws(KeychainError) -> T {
        guard let peerPid = pidOf(pidfd: pidfd), peerPid > 0 else { throw gone(pid) }
        let value = try read(peerPid)
        // After the reads: a pid that still names the pidfd's process was that process's all along.
        guard pidOf(pidfd: pidfd) == peerPid else { throw gone(peerPid) }
        return value
    }

    /// The application of the process `pidfd` names (`reading`).
    private static func of(pidfd: Int32, uid: UInt32, pid: Int32) throws(KeychainError) -> CallerIdentity {
        try reading(pidfd: pidfd, pid: pid) { pid throws(KeychainError) in try application(uid: uid, pid: pid) }
    }

    /// The application of `pid` from its `/proc` files (the caller checks afterwards that they were its own).
    private static func application(uid: UInt32, pid: Int32) throws(KeychainError) -> CallerIdentity {
        let cgroup = try procText("/proc/\(pid)/cgroup", pid: pid)
        if let flatpak = try flatpakApplication(pid: pid, cgroup: cgroup) { return CallerIdentity(uid: uid, application: .flatpak(flatpak)) }
        return CallerIdentity(uid: uid, application: systemUnit(cgroup: cgroup).map(ConfinedApplication.unit))
    }

    /// `SO_PEERPIDFD`, or where the kernel lacks it (before 6.5) `pidfd_open` of the credentials' pid:
    /// that pid may name another process already (docs/security.md says what that leaves).
    private static func peerPidfd(socket fd: Int32, pid: Int32) throws(KeychainError) -> Int32 {
        var pidfd: Int32 = -1
        var length = socklen_t(MemoryLayout<Int32>.size)
        let soPeerPidfd: Int32 = 77
        if getsockopt(fd, SOL_SOCKET, soPeerPidfd, &pidfd, &length) == 0, pidfd >= 0 { return pidfd }
        let code = errno
        guard code == ENOPROTOOPT || code == EINVAL else {
            throw KeychainError(code == ESRCH ? .accessDenied : .internal,
                                code == ESRCH ? gone(pid).message : "keychaind cannot take its peer's pidfd (SO_PEERPIDFD: errno \(code))",
                                underlying: .errno(code))
        }
        let opened = pidfd_open(pid, 0)
        guard opened >= 0 else {
            let code = errno
            if code == ESRCH { throw gone(pid) }
            throw KeychainError(.internal, "keychaind cannot open its peer's pidfd (pidfd_open: errno \(code))", underlying: .errno(code))
        }
        return opened
    }

    /// The pid `pidfd` names now: -1 once it exited.
    private static func pidOf(pidfd: Int32) -> Int32? {
        guard let text = try? procText("/proc/self/fdinfo/\(pidfd)", pid: getpid()) else { return nil }
        return pid(fdinfo: text)
    }

    private static func gone(_ pid: Int32) -> KeychainError {
        KeychainError(.accessDenied, "The process that connected (pid \(pid)) exited before keychaind could tell which application "
                      + "it is; a socket handed on by a process that exits is not served: connect from the process that calls")
    }

    /// A small file of `/proc` as text (at most 64 KiB).
    private static func procText(_ path: String, pid: Int32) throws(KeychainError) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { throw unreadable(path, pid: pid, errno) }
        defer { close(fd) }
        return try readAll(fd, path: path, pid: pid)
    }

    /// The peer's Flatpak app id; nil when it is no Flatpak sandbox.
    ///
    /// Where keychaind may open the peer's own root (`/proc/PID/root`: as root, or the peer is its own
    /// uid), the `/.flatpak-info` there, as xdg-desktop-portal reads it. keychaind's own user may not
    /// (the kernel lets only a ptracer into another user's root, and the shipped unit has no
    /// capability): then what every user may read tells it. Flatpak binds the file at `/.flatpak-info`,
    /// so a sandbox shows that mount in `/proc/PID/mountinfo`, and `flatpak run` puts the app in a scope
    /// named after it (`app-flatpak-ID-N.scope`) that the sandbox cannot leave. A peer with the mount
    /// and no such scope is refused: never its uid's unconfined caller.
    private static func flatpakApplication(pid: Int32, cgroup: String) throws(KeychainError) -> String? {
        let rootPath = "/proc/\(pid)/root"
        let root = open(rootPath, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
        guard root >= 0 else {
            let code = errno
            guard code == EACCES || code == EPERM else { throw unreadable(rootPath, pid: pid, code) }
            guard try mountsFlatpakInfo(path: "/proc/\(pid)/mountinfo", pid: pid) else { return nil }
            guard let id = flatpakScope(cgroup: cgroup) else {
                throw KeychainError(.accessDenied, "pid \(pid) runs in a Flatpak sandbox (a /.flatpak-info is mounted in its root) "
                                    + "whose app keychaind cannot tell: its root is closed to keychaind's user and its cgroup names "
                                    + "no app-flatpak-ID-N.scope (flatpak run makes one); keychaind serves a sandbox only as its app")
            }
            return id
        }
        defer { close(root) }
        guard let info = try flatpakInfo(root: root, pid: pid) else { return nil }
        guard let id = flatpakApplication(info: info) else {
            throw KeychainError(.accessDenied, "The /.flatpak-info of pid \(pid) names no valid Flatpak app id "
                                + "([Application] name=): keychaind serves a sandbox only as its app")
        }
        return id
    }

    /// The `/.flatpak-info` in the peer's root `root`: nil when there is none; one that is not a
    /// regular file (a symlink included) or cannot be read refuses the peer.
    private static func flatpakInfo(root: Int32, pid: Int32) throws(KeychainError) -> String? {
        let rootPath = "/proc/\(pid)/root"
        let fd = openat(root, ".flatpak-info", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw unreadable(rootPath + "/.flatpak-info", pid: pid, errno)
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw KeychainError(.accessDenied, "The /.flatpak-info of pid \(pid) is not a regular file: keychaind does not serve it")
        }
        return try readAll(fd, path: rootPath + "/.flatpak-info", pid: pid)
    }

    /// Whether the mount table at `path` mounts `/.flatpak-info`, read line by line (never whole: a
    /// sandbox may have thousands of mounts).
    package static func mountsFlatpakInfo(path: String, pid: Int32) throws(KeychainError) -> Bool {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY)
        guard fd >= 0 else { throw unreadable(path, pid: pid, errno) }
        defer { close(fd) }
        var table = MountTable()
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count: Int
            switch valueOrErrno({ chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }) {
            case .success(let read): count = read
            case .failure(let error): throw unreadable(path, pid: pid, error.rawValue)
            }
            do throws(MountTable.Refusal) {
                if count == 0 { return try table.finish() }
                if try table.scan(chunk[..<count]) { return true }
            } catch {
                throw KeychainError(.accessDenied, "\(path) \(error.reason): keychaind cannot tell whether pid \(pid) is sandboxed, "
                                    + "and does not serve it")
            }
        }
    }

    private static func readAll(_ fd: Int32, path: String, pid: Int32) throws(KeychainError) -> String {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count <= 65536 {
            let count: Int
            switch valueOrErrno({ chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }) {
            case .success(let read): count = read
            case .failure(let error): throw unreadable(path, pid: pid, error.rawValue)
            }
            if count == 0 { return String(decoding: bytes, as: UTF8.self) }
            bytes += chunk.prefix(count)
        }
        throw KeychainError(.accessDenied, "\(path) is larger than 64 KiB: keychaind does not serve pid \(pid)")
    }

    private static func unreadable(_ path: String, pid: Int32, _ code: Int32) -> KeychainError {
        if code == ENOENT || code == ESRCH { return gone(pid) }
        return KeychainError(.accessDenied, "keychaind cannot read \(path) (errno \(code)), which tells which application pid \(pid) "
                             + "is; it refuses rather than serve it as its uid's unconfined caller. keychaind must see its clients' "
                             + "processes (ProtectProc=default) and may need CAP_SYS_PTRACE (docs/daemon.md)", underlying: .errno(code))
    }
}
