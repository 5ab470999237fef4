import KeychainCore
import Glibc
internal import CSpawn
import TPM2

/// The one swtpm launcher, for the embedded TPM and the test support's.
///
/// swtpm listens on two Unix sockets in `directory`, which must be the caller's own 0700 directory: the
/// command socket `tpm` and the control socket `tpm.ctrl` (where tpm2-tss's swtpm TCTI looks for it).
/// No TCP port: another local user can neither connect to it nor reach its control channel
/// (state save, reboot, `TPM2_Clear`) nor hold its one connection.
package struct Swtpm: Sendable {
    package let directory: String
    package var socket: String { directory + "/tpm" }
    package var device: TPMDevice { .swtpmSocket(path: socket) }

    /// - Throws: `INVALID_ARGUMENT` when the socket path cannot be one (too long for `sockaddr_un`, or
    ///   with a comma, which swtpm's and the TCTI's option syntax cannot hold).
    package init(directory: String) throws(KeychainError) {
        self.directory = directory
        let longest = socket + ".ctrl"
        guard longest.utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path), !longest.contains(",") else {
            throw KeychainError.invalidArgument(
                "The software TPM's socket \(socket) cannot be used (at most 102 bytes, no comma): choose a shorter store directory")
        }
    }

    /// Whether a swtpm accepts connections on both sockets (a connection it has not taken yet counts).
    package var isListening: Bool { Self.accepts(socket) && Self.accepts(socket + ".ctrl") }

    /// Starts swtpm on `state` and returns once it listens.
    /// - Parameter pidFile: for the embedded TPM, which outlives this process: swtpm detaches and writes
    ///   its pid there. Without it, swtpm stays this process's child and dies with it (`Child`).
    package func start(state: String, pidFile: String? = nil) throws(KeychainError) -> Child? {
        guard let swtpm = Processes.findExecutable("swtpm") else {
            throw KeychainError(.hardwareUnavailable, "swtpm is not installed (apt-get install swtpm)")
        }
        for path in [socket, socket + ".ctrl"] { unlink(path) }  // a crashed swtpm's; the directory is ours
        var argv = ["swtpm", "socket", "--tpm2",
                    "--server", "type=unixio,path=\(socket),mode=0600",
                    "--ctrl", "type=unixio,path=\(socket).ctrl,mode=0600",
                    "--tpmstate", "dir=\(state),mode=0600",
                    "--flags", "not-need-init,startup-clear",
                    "--log", "file=\(directory)/swtpm.log"]
        if let pidFile { argv += ["--pid", "file=\(pidFile)", "--daemon"] }
        guard let pid = Processes.spawn(swtpm, argv) else {
            throw KeychainError(.hardwareUnavailable, "Cannot start swtpm at \(swtpm)", underlying: .errno(errno))
        }
        let child = pidFile == nil ? try Child(pid: pid) : nil
        if pidFile != nil && Processes.wait(pid) != 0 {
            throw KeychainError(.hardwareUnavailable, "swtpm did not start: see \(directory)/swtpm.log")
        }
        for _ in 0..<1000 {
            if isListening { return child }
            var info = siginfo_t()
            if child != nil && waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info._sifields._sigchld.si_pid == pid { break }
            usleep(5_000)
        }
        child?.stop()
        throw KeychainError(.hardwareUnavailable, "swtpm did not start: see \(directory)/swtpm.log")
    }

    /// A swtpm (or a test's tpm2-abrmd or dbus-daemon) that is this process's child, killed when this
    /// process ends, however it ends: a watchdog (`sh`) holds the read end of a pipe whose only write end
    /// is ours; when the kernel closes it, at our exit or `kill -9`, the watchdog kills the child.
    /// (PR_SET_PDEATHSIG would follow the spawning thread, and pool threads come and go.)
    package final class Child: @unchecked Sendable {
        package let pid: Int32
        private let watchdog: Int32
        private var lifeline: Int32

        /// Takes `pid`, a child just spawned; killed and reaped at once if the watchdog cannot start.
        package init(pid: Int32) throws(KeychainError) {
            self.pid = pid
            var ends: [Int32] = [0, 0]
            guard pipe2(&ends, O_CLOEXEC) == 0 else {
                kill(pid, SIGKILL)
                _ = Processes.wait(pid)
                throw KeychainError(.hardwareUnavailable, "Cannot make a watchdog pipe for process \(pid)", underlying: .errno(errno))
            }
            defer { close(ends[0]) }
            guard let watchdog = Processes.spawn("/bin/sh", ["sh", "-c", "while read _; do :; done; kill -KILL \"$1\"",
                                                             "swtpm-watchdog", "\(pid)"], stdin: ends[0]) else {
                close(ends[1])
                kill(pid, SIGKILL)
                _ = Processes.wait(pid)
                throw KeychainError(.hardwareUnavailable, "Cannot start the watchdog of process \(pid)", underlying: .errno(errno))
            }
            self.watchdog = watchdog
            lifeline = ends[1]
        }

        deinit { stop() }

        /// Kills the child and reaps it and its watchdog. The watchdog kills first, so no pid is killed
        /// after it was reaped (and perhaps reused).
        package func stop() {
            guard lifeline >= 0 else { return }
            close(lifeline)
            lifeline = -1
            _ = Processes.wait(watchdog)
            kill(pid, SIGKILL)  // the watchdog's, unless it was gone already; still our unreaped child
            _ = Processes.wait(pid)
        }
    }

    /// A non-blocking connection attempt: accepted, or queued until swtpm takes it.
    private static func accepts(_ path: String) -> Bool {
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(path.utf8.prefix(raw.count - 1))
            raw.copyBytes(from: bytes)
        }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        return rc == 0 || errno == EAGAIN || errno == EINPROGRESS
    }
}
