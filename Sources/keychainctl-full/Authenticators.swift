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
        guard let pin = try readLines(["Passcode"]).first else { return ScriptedAuthenticator([.cancel]) }
        return ScriptedAuthenticator([.passcode(pin)], attemptsPerRead: 1)
    }
    // On a terminal: the library's prompt on the controlling terminal (the passcode without echo).
    if isatty(0) == 1 && isatty(2) == 1 { return TerminalAuthenticator() }
    return nil
}
