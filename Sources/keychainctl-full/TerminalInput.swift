import Glibc
import Keychain
import KeychainBasics
import SecureMemory

/// Secrets typed at a terminal: when stdin is one, each is asked for with a prompt and read with
/// echo off (the Enter still shows, as `sudo` and `ssh` do); from a pipe or a file they are read
/// as before, byte for byte.
///
/// - Important: echo comes back on every way out: a normal return, an error, and SIGINT, SIGTERM,
///   SIGHUP or SIGQUIT while a prompt waits (the handler restores the terminal, then the signal
///   ends the process as it would have).
enum TerminalInput {
    /// Whether stdin is a terminal, so that secrets are asked for there.
    static var isTerminal: Bool { isatty(0) == 1 }

    /// One line per prompt, read with echo off (the newline not kept); nil for a prompt answered by
    /// end of input (Ctrl-D at an empty line).
    static func lines(_ prompts: [String]) throws(KeychainError) -> [SecureBytes] {
        try withEchoOff { () throws(KeychainError) in
            var lines: [SecureBytes] = []
            for prompt in prompts {
                show(prompt + ": ")
                guard let line = try readLine() else { break }
                lines.append(line)
            }
            return lines
        }
    }

    /// A value typed at the terminal, read with echo off to end of input (Ctrl-D); exactly one
    /// trailing newline (the Enter before Ctrl-D) is not part of it.
    static func value(_ prompt: String, limit: Int) throws(KeychainError) -> SecureBytes {
        try withEchoOff { () throws(KeychainError) in
            show(prompt + " (not shown; Enter then Ctrl-D to end): ")
            // One byte more than the value may hold: the Enter that is not part of it.
            guard let all = try? readStdin(limit: limit + 1) else {
                throw KeychainError.invalidArgument("The value typed is longer than the \(limit) bytes allowed here")
            }
            return all.withUnsafeBytes { raw in
                var end = raw.count
                if end > 0, raw[end - 1] == UInt8(ascii: "\n") { end -= 1 }
                return SecureBytes(copying: raw.prefix(end))
            }
        }.checked(limit: limit)
    }

    /// Writes `text` to the terminal (the controlling one; stderr when there is none).
    private static func show(_ text: String) {
        let tty = open("/dev/tty", O_WRONLY | O_NOCTTY | O_CLOEXEC)
        let fd = tty >= 0 ? tty : 2
        defer { if tty >= 0 { close(tty) } }
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let result = valueOrErrno { bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) } }
            guard case .success(let n) = result, n > 0 else { return }
            offset += n
        }
    }

    /// One line of stdin, a byte at a time so nothing after it is taken; nil at end of input before any byte.
    private static func readLine() throws(KeychainError) -> SecureBytes? {
        let buffer = SecureBytes(count: 1024)
        var length = 0
        while true {
            var byte: UInt8 = 0
            let n: Int
            switch valueOrErrno({ read(0, &byte, 1) }) {
            case .success(let count): n = count
            case .failure(let code): throw KeychainError(.invalidArgument, "Cannot read the terminal", underlying: .errno(code.rawValue))
            }
            if n == 0 && length == 0 { return nil }
            if n == 0 || byte == UInt8(ascii: "\n") { break }
            guard length < buffer.count else {
                throw KeychainError.invalidArgument("The line typed is longer than the \(buffer.count) bytes allowed here")
            }
            buffer.withUnsafeMutableBytes { $0[length] = byte }
            length += 1
        }
        if length > 0, buffer.withUnsafeBytes({ $0[length - 1] }) == UInt8(ascii: "\r") { length -= 1 }
        return buffer.withUnsafeBytes { SecureBytes(copying: $0.prefix(length)) }
    }

    /// Runs `body` with stdin's terminal not echoing (newlines still shown), then puts it back, also
    /// when a signal ends the process meanwhile.
    private static func withEchoOff<T>(_ body: () throws(KeychainError) -> T) throws(KeychainError) -> T {
        guard tcgetattr(0, &savedTerminal) == 0 else { return try body() }
        let signals = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
        let previous = signals.map { signal($0, restoreTerminalAndDie) }
        var silent = savedTerminal
        silent.c_lflag &= ~tcflag_t(ECHO)
        silent.c_lflag |= tcflag_t(ECHONL)
        tcsetattr(0, TCSANOW, &silent)
        defer {
            tcsetattr(0, TCSANOW, &savedTerminal)
            for (sig, handler) in zip(signals, previous) { signal(sig, handler) }
        }
        return try body()
    }
}

/// The terminal's settings before echo went off, for the signal handler (set before it is installed).
nonisolated(unsafe) private var savedTerminal = termios()

/// A signal while echo is off: the terminal as it was, then the signal's default action (the
/// process ends as it would have). Only async-signal-safe calls.
private func restoreTerminalAndDie(_ sig: Int32) {
    tcsetattr(0, TCSANOW, &savedTerminal)
    _ = write(2, "\n", 1)
    signal(sig, SIG_DFL)
    raise(sig)
}

private extension SecureBytes {
    /// Itself when at most `limit` bytes, else `INVALID_ARGUMENT`.
    func checked(limit: Int) throws(KeychainError) -> SecureBytes {
        guard count <= limit else { throw KeychainError.invalidArgument("The value typed is longer than the \(limit) bytes allowed here") }
        return self
    }
}
