import KeychainCore
import KeychainEngine
import Glibc
import FoundationEssentials
import SecureMemory
import KeychainBasics

/// The prompt through systemd's password agents (the ask-password protocol,
/// https://systemd.io/PASSWORD_AGENTS/): an `ask.*` file in the agents' directory names the question
/// and a datagram socket; an agent (the console, `wall`, plymouth, `systemd-tty-ask-password-agent`)
/// asks a person and sends `+PASSWORD` (or `-` for cancel) to the socket. It works with or without
/// systemd as PID 1: only the directory and an agent watching it are needed.
///
/// The answer is received straight into locked memory and only from root or this process's user
/// (`SCM_CREDENTIALS`); the file says `NotAfter=` so agents stop asking after `timeout`, and the file
/// and socket are removed when the question ends (answered, timed out or canceled).
public struct AskPasswordAuthenticator: Authenticator, LinePrompter {
    /// The agents' directory: `/run/systemd/ask-password` for root, else
    /// `$XDG_RUNTIME_DIR/systemd/ask-password`.
    public let directory: String
    public let timeout: Duration

    public init(directory: String, timeout: Duration = PromptTimeout.default) {
        self.directory = directory
        self.timeout = timeout
    }

    /// The directory `SystemAuthenticator` uses, when agents can be expected there: root's
    /// `/run/systemd/ask-password` on a system booted with systemd (`/run/systemd/system`: its
    /// `.path` units start the console and wall agents), else `$XDG_RUNTIME_DIR/systemd/ask-password`
    /// when it exists. Nil when there is neither.
    public static func systemDirectory(environment: [String: String] = ProcessInfo.processInfo.environment,
                                       isRoot: Bool = geteuid() == 0) -> String? {
        var isDirectory = false
        func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) && isDirectory }
        if isRoot, exists("/run/systemd/system"), exists("/run/systemd/ask-password") { return "/run/systemd/ask-password" }
        if let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/"), exists(runtime + "/systemd/ask-password") {
            return runtime + "/systemd/ask-password"
        }
        return nil
    }

    public func reachability() async -> PromptReach {
        access(directory, W_OK | X_OK) == 0
            ? .reachable
            : .unreachable("password agents: cannot write to \(directory) (\(String(cString: strerror(errno))))")
    }

    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer { await answer(request) }

    func ask(_ question: PromptQuestion) async -> PromptLine {
        let directory = directory
        let timeout = timeout
        return await PromptWait.run { cancel in Self.ask(question, directory: directory, timeout: timeout, cancel: cancel) }
    }

    private static func ask(_ question: PromptQuestion, directory: String, timeout: Duration, cancel: PromptWait.Cancel) -> PromptLine {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let name = (0..<8).map { _ in Hex.encode(UInt8.random(in: 0...255), digits: 1) }.joined()
        let socketPath = directory + "/sck." + name
        let askPath = directory + "/ask." + name
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .unavailable("password agents: no socket (\(String(cString: strerror(errno))))") }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(socketPath.utf8)
        guard pathBytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            return .unavailable("password agents: the socket path \(socketPath) is too long")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in raw.copyBytes(from: pathBytes) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { return .unavailable("password agents: cannot bind \(socketPath) (\(String(cString: strerror(errno))))") }
        defer { unlink(socketPath) }
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size))

        // NotAfter= is CLOCK_MONOTONIC in microseconds, as the agents compare it.
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let notAfter = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
            + UInt64(timeout.components.seconds) * 1_000_000 + UInt64(timeout.components.attoseconds / 1_000_000_000_000)
        let file = """
            [Ask]
            PID=\(getpid())
            Socket=\(socketPath)
            AcceptCached=0
            Echo=\(question.echo ? 1 : 0)
            NotAfter=\(notAfter)
            Id=\(oneLine(question.id))
            Message=\(question.oneLine)

            """
        // Written beside, then renamed: agents watch IN_MOVED_TO and never read half a file.
        let temporary = directory + "/.tmp." + name
        guard FileManager.default.createFile(atPath: temporary, contents: Data(file.utf8), attributes: [.posixPermissions: 0o644]) else {
            return .unavailable("password agents: cannot write to \(directory)")
        }
        guard rename(temporary, askPath) == 0 else {
            unlink(temporary)
            return .unavailable("password agents: cannot write \(askPath) (\(String(cString: strerror(errno))))")
        }
        defer { unlink(askPath) }

        let allowed: Set<uid_t> = [0, geteuid()]
        while true {
            switch PromptWait.readable(fd, cancel, until: deadline) {
            case .readable: break
            case .canceled, .timedOut, .failed: return .interrupted
            }
            switch receive(fd, from: allowed) {
            case .some(let line): return line
            case .none: continue  // a datagram from someone else, or none: keep waiting
            }
        }
    }

    /// One answer: `+` and the password, or `-`; nil for a datagram from a sender not allowed.
    private static func receive(_ fd: Int32, from allowed: Set<uid_t>) -> PromptLine? {
        let buffer = SecureBytes(count: 4097)
        var control = [UInt8](repeating: 0, count: 64)
        let received: Int = buffer.withUnsafeMutableBytes { bytes in
            control.withUnsafeMutableBytes { controlBytes in
                var vector = iovec(iov_base: bytes.baseAddress, iov_len: bytes.count)
                return withUnsafeMutablePointer(to: &vector) { vectorPointer in
                    var header = msghdr()
                    header.msg_iov = vectorPointer
                    header.msg_iovlen = 1
                    header.msg_control = controlBytes.baseAddress
                    header.msg_controllen = controlBytes.count
                    let got = recvmsg(fd, &header, Int32(MSG_DONTWAIT))
                    guard got >= 0 else { return -1 }
                    // The sender's credentials, added by the kernel (SO_PASSCRED): a cmsghdr (len, level,
                    // type: 16 bytes on 64-bit Linux) of SCM_CREDENTIALS (2) and a ucred (pid, uid, gid),
                    // which Glibc hides without _GNU_SOURCE.
                    guard header.msg_controllen >= 16 + 12 else { return -2 }
                    let level = controlBytes.load(fromByteOffset: 8, as: Int32.self)
                    let type = controlBytes.load(fromByteOffset: 12, as: Int32.self)
                    guard level == SOL_SOCKET, type == 2 else { return -2 }
                    let uid = controlBytes.loadUnaligned(fromByteOffset: 20, as: UInt32.self)
                    return allowed.contains(uid_t(uid)) ? got : -2
                }
            }
        }
        guard received > 0 else { return nil }
        return buffer.withUnsafeBytes { bytes -> PromptLine? in
            switch bytes[0] {
            case UInt8(ascii: "+"):
                // Several passwords may follow, NUL-separated: the first is the answer.
                let rest = bytes[1..<received]
                let end = rest.firstIndex(of: 0) ?? received
                return .text(SecureBytes(copying: bytes[1..<end]))
            case UInt8(ascii: "-"): return .cancel
            default: return nil
            }
        }
    }

    private static func oneLine(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? " " : $0 }))
    }
}
