import SecureMemory
import Synchronization

/// How the user may answer a prompt.
public enum AuthenticationMethod: String, Sendable, Hashable, Codable { case fingerprint, passcode }

/// What the storage asks the user: the merged prompt and the ways they may answer.
public struct AuthenticationRequest: Sendable {
    /// The storage's prompt fields, then the call's, merged field by field (seed: createKeychain).
    public let prompt: Prompt
    public let methods: [AuthenticationMethod]
    public let service: String
    public let key: String
    /// 1 for the first question of a read; more after a failed match or a wrong passcode.
    public let attempt: Int
    /// Why the previous attempt failed ("no match", "wrong passcode"), for the prompt to show.
    public let previousFailure: String?

    package init(prompt: Prompt, methods: [AuthenticationMethod], service: String, key: String, attempt: Int, previousFailure: String?) {
        (self.prompt, self.methods, self.service, self.key) = (prompt, methods, service, key)
        (self.attempt, self.previousFailure) = (attempt, previousFailure)
    }
}

/// The user's answer.
public enum AuthenticationAnswer: Sendable {
    /// The reader reads this finger: a match if it is enrolled, no match if not.
    case finger(String)
    case passcode(SecureBytes)
    /// The prompt's cancel button: `USER_CANCELED`.
    case cancel
    /// The prompt's fallback button: `USER_FALLBACK`.
    case fallback
    /// The prompt was interrupted (a signal, a timeout, the device locking): `SYSTEM_CANCELED`.
    case interrupted
    /// No prompt could reach anyone (no terminal or password agent), for this reason:
    /// `INTERACTION_NOT_ALLOWED`, at once.
    case unavailable(String)
}

/// Whether an authenticator can reach a person now.
public enum PromptReach: Sendable, Equatable {
    case reachable
    /// Why not ("no controlling terminal", "no session bus"), for the error and for logs.
    case unreachable(String)
}

extension AuthenticationAnswer {
    /// The seed's code for a prompt that ended without an answer; nil for a finger or a passcode.
    package var endingError: KeychainError? {
        switch self {
        case .cancel: KeychainError(.userCanceled, "The user canceled the prompt")
        case .fallback: KeychainError(.userFallback, "The user chose the fallback")
        case .interrupted: KeychainError(.systemCanceled, "The prompt was interrupted")
        case .unavailable(let why):
            KeychainError(.interactionNotAllowed, "No prompt can reach the user (\(why)): run on a terminal, "
                          + "or answer systemd's password agents")
        case .finger, .passcode: nil
        }
    }
}

/// Shows the prompt. The storage calls it only for reads of items behind an access control;
/// writes, `hasItem`, `getAllKeys`, `getItemInfo`, `removeItem` and `clear` never do.
public protocol Authenticator: Sendable {
    func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer
    /// How many times one read may ask (after a failed match or a wrong passcode); 3 by default.
    var attemptsPerRead: Int { get }
    /// Whether a prompt would reach a person now (a terminal, a password agent); asks
    /// no one. `canUseAccessControl` answers `available: false, reason: .noPrompt` when it does not.
    /// `.reachable` by default.
    func reachability() async -> PromptReach
}

extension Authenticator {
    public var attemptsPerRead: Int { 3 }
    public func reachability() async -> PromptReach { .reachable }
}

/// Answers from a script, in order, for tests and appliances; records what it was asked.
public final class ScriptedAuthenticator: Authenticator, @unchecked Sendable {
    private let lock = Mutex(())
    private var answers: [AuthenticationAnswer]
    private var asked: [AuthenticationRequest] = []
    public let attemptsPerRead: Int

    /// - Parameter attemptsPerRead: how many questions one read may ask.
    public init(_ answers: [AuthenticationAnswer] = [], attemptsPerRead: Int = 3) {
        self.answers = answers
        self.attemptsPerRead = attemptsPerRead
    }

    /// Queues more answers.
    public func push(_ more: AuthenticationAnswer...) { lock.withLock { _ in answers += more } }

    /// The requests made so far.
    public var requests: [AuthenticationRequest] { lock.withLock { _ in asked } }

    /// With no answer left, the prompt is interrupted (`SYSTEM_CANCELED`): a script never hangs.
    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        lock.withLock { _ in
            asked.append(request)
            return answers.isEmpty ? .interrupted : answers.removeFirst()
        }
    }
}

/// An authenticator that fails the test or the appliance if it is ever asked.
public struct FailingAuthenticator: Authenticator {
    public let onPrompt: @Sendable (AuthenticationRequest) -> Void
    public init(onPrompt: @escaping @Sendable (AuthenticationRequest) -> Void) { self.onPrompt = onPrompt }
    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        onPrompt(request)
        return .cancel
    }
}
