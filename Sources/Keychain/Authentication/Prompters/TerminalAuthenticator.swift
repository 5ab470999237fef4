import KeychainCore
import KeychainEngine
import Glibc
import KeychainBasics
import KeychainCLIText
import SecureMemory

/// The prompt on the process's controlling terminal (`/dev/tty`, as `sudo` and `ssh` ask), not on
/// stdin or stdout, which may be pipes. The passcode is read with echo off, into locked memory.
///
/// It reaches a person only when the process is in the terminal's foreground process group: a
/// background job, a daemon or a test bundle that `swift test` runs in a group of its own would stop
/// (SIGTTIN) or wait for a line nobody types. Each question waits up to `timeout`
/// (`SYSTEM_CANCELED` after it) and ends at once when the reading task is canceled.
public struct TerminalAuthenticator: Authenticator, LinePrompter {
    /// The terminal: `/dev/tty`, the controlling one.
    public let path: String
    public let timeout: Duration

    public init(path: String = "/dev/tty", timeout: Duration = PromptTimeout.default) {
        self.path = path
        self.timeout = timeout
    }

    public func reachability() async -> PromptReach {
        switch open() {
        case .success(let fd): close(fd); return .reachable
        case .failure(let why): return .unreachable(why.text)
        }
    }

    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer { await answer(request) }

    struct Refusal: Error { let text: String }

    /// The terminal, when this process is in its foreground.
    private func open() -> Result<Int32, Refusal> {
        let fd = Glibc.open(path, O_RDWR | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else {
            return .failure(Refusal(text: "terminal: no controlling terminal (\(path): \(String(cString: strerror(errno))))"))
        }
        guard isatty(fd) == 1 else {
            close(fd)
            return .failure(Refusal(text: "terminal: \(path) is not a terminal"))
        }
        guard tcgetpgrp(fd) == getpgrp() else {
            close(fd)
            return .failure(Refusal(text: "terminal: this process is not in the foreground of \(path)"))
        }
        return .success(fd)
    }

    func ask(_ question: PromptQuestion) async -> PromptLine {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        let opened = open()
        guard case .success(let fd) = opened else {
            if case .failure(let why) = opened { return .unavailable(why.text) }
            return .interrupted
        }
        var text = "\n" + ([question.title] + question.details).map(escaped).joined(separator: "\n")
        text += "\n\(question.label) (enter alone: \(escaped(question.emptyMeans))): "
        let shown = text
        return await PromptWait.run { cancel in
            defer { close(fd) }
            // Echo off before the prompt shows: what is typed once it is seen is never echoed.
            var saved = termios()
            let restore = !question.echo && tcgetattr(fd, &saved) == 0
            if restore {
                var silent = saved
                silent.c_lflag &= ~tcflag_t(ECHO)
                silent.c_lflag |= tcflag_t(ECHONL)
                tcsetattr(fd, TCSANOW, &silent)
            }
            defer { if restore { tcsetattr(fd, TCSANOW, &saved) } }
            Self.write(fd, shown)
            let line = Self.readLine(fd, cancel, deadline)
            if case .interrupted = line { Self.write(fd, "\n") }
            return line
        }
    }

    private static func write(_ fd: Int32, _ text: String) {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let result = valueOrErrno { bytes.withUnsafeMutableBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) } }
            guard case .success(let written) = result, written > 0 else { return }
            offset += written
        }
    }

    /// One line (the newline not kept) into locked memory; end of file (^D) is cancel.
    private static func readLine(_ fd: Int32, _ cancel: PromptWait.Cancel, _ deadline: ContinuousClock.Instant) -> PromptLine {
        let buffer = SecureBytes(count: 1024)
        var length = 0
        while length < buffer.count {
            switch PromptWait.readable(fd, cancel, until: deadline) {
            case .readable: break
            case .canceled, .timedOut, .failed: return .interrupted
            }
            var byte: UInt8 = 0
            let got = Glibc.read(fd, &byte, 1)
            if got < 0 && (errno == EINTR || errno == EAGAIN) { continue }
            if got < 0 { return .interrupted }
            if got == 0 { return length == 0 ? .cancel : .text(buffer.withUnsafeBytes { SecureBytes(copying: $0.prefix(length)) }) }
            if byte == UInt8(ascii: "\n") || byte == UInt8(ascii: "\r") { break }
            buffer.withUnsafeMutableBytes { $0[length] = byte }
            length += 1
        }
        return .text(buffer.withUnsafeBytes { SecureBytes(copying: $0.prefix(length)) })
    }
}
