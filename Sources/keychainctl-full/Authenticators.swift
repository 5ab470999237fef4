import Foundation
import Keychain
import KeychainCLIText
import SecureMemory

/// Answers from the command line: `--touch FINGER|cancel|fallback|interrupt` or `--passcode-stdin`.
/// One answer, one try: a wrong passcode costs one of the TPM's tries, not three.
func scriptedAuthenticator(_ inv: Invocation) throws(KeychainError) -> (any Authenticator)? {
    if let touch = inv.flags["--touch"] {
        let answer: AuthenticationAnswer = switch touch {
        case "cancel": .cancel
        case "fallback": .fallback
        case "interrupt": .interrupted
        default: .finger(touch)
        }
        return ScriptedAuthenticator([answer], attemptsPerRead: 1)
    }
    if inv.switches.contains("--passcode-stdin") {
        guard let pin = try readLines(1).first else { return ScriptedAuthenticator([.cancel]) }
        return ScriptedAuthenticator([.passcode(pin)], attemptsPerRead: 1)
    }
    if isatty(0) == 1 && isatty(2) == 1 { return TerminalAuthenticator() }
    return nil
}

/// Shows the prompt on the terminal: a finger name to touch the reader, `p` for the passcode
/// (read without echo), empty for cancel, `f` for the fallback.
struct TerminalAuthenticator: Authenticator {
    func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        let p = request.prompt
        var text = "\n\(escaped(p.title ?? "Authenticate to read '\(request.key)'"))\n"
        if let subtitle = p.subtitle { text += "\(escaped(subtitle))\n" }
        if let description = p.description { text += "\(escaped(description))\n" }
        if let failure = request.previousFailure { text += "(\(failure), try again)\n" }
        let fingers = request.methods.contains(.fingerprint)
        let passcode = request.methods.contains(.passcode)
        text += [fingers ? "type a finger to touch the reader" : nil, passcode ? "'p' for the passcode" : nil,
                 "'f' for the fallback", "enter for \(escaped(p.cancel ?? "Cancel"))"].compactMap { $0 }.joined(separator: ", ") + ": "
        FileHandle.standardError.write(Data(text.utf8))
        guard let line = readLine(strippingNewline: true) else { return .interrupted }
        switch line {
        case "": return .cancel
        case "f": return .fallback
        case "p" where passcode:
            FileHandle.standardError.write(Data("Passcode: ".utf8))
            return readSecretLine().map { .passcode($0) } ?? .interrupted
        default: return .finger(line)
        }
    }

    /// A line from the terminal with echo off, straight into locked memory.
    private func readSecretLine() -> SecureBytes? {
        var saved = termios()
        tcgetattr(0, &saved)
        var silent = saved
        silent.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(0, TCSANOW, &silent)
        defer { tcsetattr(0, TCSANOW, &saved); FileHandle.standardError.write(Data("\n".utf8)) }
        let buffer = SecureBytes(count: 128)
        var length = 0
        while length < buffer.count {
            var byte: UInt8 = 0
            guard read(0, &byte, 1) == 1 else { return nil }
            if byte == UInt8(ascii: "\n") { break }
            buffer.withUnsafeMutableBytes { $0[length] = byte }
            length += 1
        }
        return buffer.withUnsafeBytes { SecureBytes(copying: $0.prefix(length)) }
    }
}
