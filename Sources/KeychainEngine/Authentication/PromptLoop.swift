import KeychainCore
import SecureMemory

/// What one answer did: it opened (the value), or it failed, with the reason the next question shows.
package enum PromptOutcome<Value> {
    case opened(Value)
    case failed(String)
}

/// An answer that is one: a finger or a passcode.
package enum GivenAnswer {
    case finger(String)
    case passcode(SecureBytes)
}

extension Authenticator {
    /// The one prompt loop (item reads, the token PIN, `reauthenticateOwner`): asks up to
    /// `attemptsPerRead` times, ends a cancel, fallback or interruption with its code, and after the
    /// last failure throws `AUTHENTICATION_FAILED` with its reason (`unnamedFailure` when none was given).
    /// - Parameters:
    ///   - beforeAsking: runs before each question; throwing ends the loop without asking.
    ///   - attempt: tries one answer.
    package func ask<Value>(isolation: isolated (any Actor)? = #isolation,
                    prompt: Prompt, methods: [AuthenticationMethod], service: String, key: String, unnamedFailure: String,
                    beforeAsking: () throws(KeychainError) -> Void = {},
                    _ attempt: (GivenAnswer) async throws(KeychainError) -> PromptOutcome<Value>) async throws(KeychainError) -> Value {
        var failure: String?
        for number in 1...max(1, attemptsPerRead) {
            try beforeAsking()
            let answer = await authenticate(AuthenticationRequest(
                prompt: prompt, methods: methods, service: ItemScope.shown(service), key: key, attempt: number, previousFailure: failure))
            let outcome: PromptOutcome<Value>
            switch answer {
            case .cancel, .fallback, .interrupted, .unavailable: throw answer.endingError!
            case .finger(let finger): outcome = try await attempt(.finger(finger))
            case .passcode(let pin): outcome = try await attempt(.passcode(pin))
            }
            switch outcome {
            case .opened(let value): return value
            case .failed(let reason): failure = reason
            }
        }
        throw KeychainError(.authenticationFailed, "Not recognised (\(failure ?? unnamedFailure))")
    }
}
