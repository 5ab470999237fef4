import Foundation
import Keychain
import KeychainTestThreads
import Synchronization

/// keychaind for tests: serving a store on a `SoftwareTPM`, its socket in a folder of its own that
/// every uid can reach (`/tmp/keychaind-<id>/keychaind.sock`, `groups.d/` beside it), killed and
/// removed when released.
///
/// It is started as systemd starts it: the listening socket is made here and passed as fd 3
/// (`LISTEN_FDS=1`), so after `kill()` a `start()` serves the same socket, and a caller that
/// connected in between is served by the new process.
///
/// ```swift
/// let tpm = try SoftwareTPM()
/// let daemon = try KeychainDaemon(tpm: tpm)
/// let keychain = try createKeychain(.init(service: "tests"), configuration: daemon.configuration())
/// ```
public final class KeychainDaemon: @unchecked Sendable {
    public let directory: String
    public var socket: String { directory + "/keychaind.sock" }
    /// Access groups: `NAME.conf` (see `setGroup`).
    public var groupsDirectory: String { directory + "/groups.d" }
    public let store: String
    /// The daemon's fingerprint reader, nil for none.
    public let reader: String?
    private let tcti: String
    private let arguments: [String]
    private let executable: String
    private let listener: Int32
    /// The uid keychaind runs as; nil for this process's.
    public let user: uid_t?
    /// The `XDG_RUNTIME_DIR` of a daemon run as another `user` (its TPM turn's lock goes there), in the
    /// daemon's folder and removed with it: without one, the daemon made `/tmp/keychain-<uid>` and left it.
    public var runtimeDirectory: String { directory + "/run" }
    /// The systemd credentials socket (`--credentials-socket`) of a daemon made with `credentialsSocket`, in a
    /// folder of the daemon's user that every uid can reach.
    public var credentialsSocket: String { directory + "/credentials/credentials.sock" }
    /// prlimit(1) options keychaind starts under (`--nproc=64`).
    private let processLimits: [String]
    /// keychaind's pid while it runs (0 when none); held across a start, a kill or a wait.
    private let pid = Mutex<pid_t>(0)

    /// - Parameters:
    ///   - store: the daemon's store (default `tpm.directory/store`).
    ///   - reader: its fingerprint reader's directory; nil for none.
    ///   - arguments: more keychaind arguments (`--stall-timeout 1`, say).
    ///   - environment: for the first start.
    ///   - user: a uid to run keychaind as (through `setpriv`, from a root test): its store directory is
    ///     made that user's and the TPM's sockets are given to it. Clients still see the socket as root's,
    ///     since this process made it (as systemd does).
    ///   - processLimits: prlimit(1) options to start keychaind under (`--nproc=64`, `--nofile=100`).
    ///   - credentialsSocket: whether keychaind also serves systemd credentials, at `credentialsSocket`.
    ///   - tcti: how keychaind reaches the TPM, if not `tpm.tcti` directly (a `ResourceManager`'s `tcti`,
    ///     with its `environment` given too).
    public init(tpm: SoftwareTPM, store: String? = nil, reader: String? = nil, arguments: [String] = [],
                environment: [String: String] = [:], user: uid_t? = nil, processLimits: [String] = [],
                credentialsSocket: Bool = false, tcti: String? = nil) throws {
        guard let executable = Self.findKeychaind() else {
            throw SoftwareTPMError("keychaind not found beside the test bundle or on PATH: build the package first")
        }
        self.executable = executable
        self.store = store ?? tpm.directory + "/store"
        self.tcti = tcti ?? tpm.tcti
        self.reader = reader
        self.user = user
        self.processLimits = processLimits
        directory = "/tmp/keychaind-" + String(UUID().uuidString.prefix(13))
        for dir in [directory, directory + "/groups.d", directory + "/credentials"] {
            guard mkdir(dir, 0o755) == 0, chmod(dir, 0o755) == 0 else { throw SoftwareTPMError("cannot create \(dir): errno \(errno)") }
        }
        self.arguments = ["--store", self.store, "--tcti", self.tcti, "--groups", directory + "/groups.d",
                          "--reader", reader ?? "none"] + arguments
            // On swtpm as it is, the connection per operation that the command-count tests pin; on a
            // chip's profile keychaind's own choice (`auto`: the kept session).
            + (tpm.profile.map { $0.saltedSession > .zero } == true || arguments.contains("--tpm-session")
               ? [] : ["--tpm-session", "per-operation"])
            + (credentialsSocket ? ["--credentials-socket", directory + "/credentials/credentials.sock"] : [])
        listener = try Self.listen(directory + "/keychaind.sock")
        if let user {
            for dir in [self.store, runtimeDirectory] where mkdir(dir, 0o700) != 0 && errno != EEXIST {
                throw SoftwareTPMError("cannot create \(dir): errno \(errno)")
            }
            for path in [self.store, runtimeDirectory, directory + "/credentials", tpm.directory, tpm.directory + "/tpm", tpm.directory + "/tpm.ctrl"]
            where chown(path, user, user) != 0 {
                throw SoftwareTPMError("cannot give \(path) to uid \(user): errno \(errno)")
            }
        }
        try start(environment: environment)
    }

    deinit {
        _ = kill()
        close(listener)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A configuration that reaches this daemon; prompts go to `authenticator`. Its `storeDirectory`
    /// and `readerDirectory` name the daemon's, for tests that look at the files (calls do not use them).
    public func configuration(authenticator: (any Authenticator)? = nil) -> KeychainConfiguration {
        var configuration = KeychainConfiguration.daemon(socket: socket, authenticator: authenticator)
        configuration.storeDirectory = store
        configuration.readerDirectory = reader
        configuration.applicationIdentifier = configuration.applicationIdentifier ?? SoftwareTPM.testApplicationIdentifier
        return configuration
    }

    /// What points a child process's default configuration (and `keychainctl`) at this daemon.
    public var environment: [String: String] { ["KEYCHAIN_SOCKET": socket] }

    /// The name a service of the uid `uid` has in the daemon's store.
    public static func storeService(_ service: String, uid: uid_t = getuid()) -> String { "uid:\(uid)/\(service)" }

    public var processIdentifier: pid_t { pid.withLock { $0 } }

    /// Starts keychaind on the socket (after `kill()`, or a crash) and waits until it says it is ready.
    public func start(environment: [String: String] = [:]) throws {
        try pid.withLock { pid in
            precondition(pid == 0, "keychaind is running")
            let out = Pipe()
            let log = open(directory + "/keychaind.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            defer { if log >= 0 { close(log) } }
            var env = ProcessInfo.processInfo.environment
            env.removeValue(forKey: "KEYCHAIN_SOCKET")
            if user != nil { env["XDG_RUNTIME_DIR"] = runtimeDirectory }  // not the test's: the daemon's user's
            env.merge(environment) { $1 }
            // LISTEN_PID is the daemon's own pid: the shell sets it to its pid, then becomes keychaind.
            let script = "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\""
            var argv = ["/bin/sh", "-c", script, executable] + arguments
            // As keychaind.service runs it: its own user, no capability.
            if let user { argv = ["/usr/bin/setpriv", "--reuid=\(user)", "--regid=\(user)", "--clear-groups"] + argv }
            if !processLimits.isEmpty { argv = ["/usr/bin/prlimit"] + processLimits + ["--"] + argv }
            let path = argv[0]
            guard let child = Processes.spawn(path, argv, environment: env,
                                              stdout: out.fileHandleForWriting.fileDescriptor, stderr: log >= 0 ? log : nil,
                                              passing: listener) else {
                throw SoftwareTPMError("cannot start keychaind: errno \(errno)")
            }
            try out.fileHandleForWriting.close()
            pid = child
            let ready = { (said: Data) in String(decoding: said, as: UTF8.self).contains("ready") }
            var said = Data(), failure = "keychaind ended before it was ready"
            do {
                said = try read(out.fileHandleForReading, until: "keychaind to say it is ready", enough: ready)
            } catch {
                failure = "\(error)"
                Glibc.kill(child, SIGKILL)
            }
            if !ready(said) {
                let log = (try? String(contentsOfFile: directory + "/keychaind.log", encoding: .utf8)) ?? ""
                _ = Processes.wait(child)
                pid = 0
                throw SoftwareTPMError("\(failure): \(log)")
            }
        }
    }

    /// Kills keychaind (SIGKILL) and reaps it; its exit status (128 + 9), or nil when none was running.
    /// How many lines of keychaind's log (its stderr, over all its starts) contain `text`.
    public func logLines(containing text: String) -> Int {
        let log = (try? String(contentsOfFile: directory + "/keychaind.log", encoding: .utf8)) ?? ""
        return log.split(separator: "\n").filter { $0.contains(text) }.count
    }

    /// Waits until keychaind's log holds more than `count` lines containing `text` (something it does
    /// after "ready"), for at most `timeout`. - Returns: whether it did.
    public func waitForLog(_ text: String, moreThan count: Int = 0, timeout: Duration = .seconds(120)) -> Bool {
        let end = ContinuousClock.now + timeout
        while logLines(containing: text) <= count {
            guard ContinuousClock.now < end else { return false }
            usleep(20_000)
        }
        return true
    }

    @discardableResult
    public func kill() -> Int32? {
        pid.withLock { pid in
            guard pid != 0 else { return nil }
            Glibc.kill(pid, SIGKILL)
            defer { pid = 0 }
            return Processes.wait(pid)
        }
    }

    /// Waits for keychaind to end by itself (a test hook's abort); its exit status.
    public func waitForExit() -> Int32? {
        pid.withLock { pid in
            guard pid != 0 else { return nil }
            defer { pid = 0 }
            return Processes.wait(pid)
        }
    }

    /// Writes the access group `name` (`uid N`, `gid N`, `user NAME`, `group NAME` lines) with `mode`.
    public func setGroup(_ name: String, _ lines: [String], mode: mode_t = 0o644) throws {
        let path = "\(groupsDirectory)/\(name).conf"
        try (lines.joined(separator: "\n") + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        guard chmod(path, mode) == 0 else { throw SoftwareTPMError("chmod \(path): errno \(errno)") }
    }

    private static func findKeychaind() -> String? {
        var url = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        while url.pathComponents.count > 1 {
            url.deleteLastPathComponent()
            let candidate = url.appendingPathComponent("keychaind").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return Processes.findExecutable("keychaind")
    }

    private static func listen(_ path: String) throws -> Int32 {
        let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SoftwareTPMError("socket: errno \(errno)") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in path.utf8.enumerated() { raw[i] = b } }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o666) == 0, Glibc.listen(fd, 1024) == 0 else {
            close(fd)
            throw SoftwareTPMError("cannot listen on \(path): errno \(errno)")
        }
        return fd
    }
}
