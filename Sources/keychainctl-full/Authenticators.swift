import Glibc
import Keychain
import KeychainCLIText
import SecureMemory

/// Answers from the command line: `--touch FINGER|cancel|fallback|interrupt` or `--passcode-stdin`.
/// One answer, one try: a wrong passcode costs one of the TPM's tries, not three. Nil without one.
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
    // Otherwise the configuration's own: the system's prompts (the terminal, the desktop's prompter,
    // the password agents), the same that can-use counts, so the two never disagree.
    return nil
}
