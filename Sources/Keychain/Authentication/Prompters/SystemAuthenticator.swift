import KeychainCore
import KeychainEngine
import KeychainBasics
import Glibc
import FoundationEssentials
import KeychainCLIText
import Synchronization
internal import CSpawn

/// The system's prompt (seed: "a read shows the prompt"): the first of Linux's prompters that can
/// reach a person, asked in this order at each read:
/// 1. the terminal the process runs in the foreground of (`TerminalAuthenticator`);
/// 2. the desktop's system prompter, gcr's `org.gnome.keyring.SystemPrompter` on the session bus
///    (`SystemPrompterAuthenticator`), when the session has a display;
/// 3. the password agents of systemd's ask-password protocol (`AskPasswordAuthenticator`): on a
///    device booted with systemd (its console and wall agents are started by `.path` units) as root,
///    or `$XDG_RUNTIME_DIR/systemd/ask-password` when it exists for another user.
///
/// When none can reach anyone, a read behind an access control ends at once with
/// `INTERACTION_NOT_ALLOWED` naming why each could not, and `canUseAccessControl` answers
/// `available: false, reason: .noPrompt`. This is `KeychainConfiguration.default`'s authenticator.
public struct SystemAuthenticator: Authenticator {
    /// The prompters, in the order they are tried.
    public let prompters: [any Authenticator]

    /// - Parameter timeout: how long one question waits for the person (then `SYSTEM_CANCELED`).
    public init(timeout: Duration = PromptTimeout.default) {
        var prompters: [any Authenticator] = [TerminalAuthenticator(timeout: timeout),
                                              SystemPrompterAuthenticator(timeout: timeout)]
        if let agents = AskPasswordAuthenticator.systemDirectory() {
            prompters.append(AskPasswordAuthenticator(directory: agents, timeout: timeout))
        }
        self.prompters = prompters
    }

    /// Tries `prompters` in order.
    public init(prompters: [any Authenticator]) { self.prompters = prompters }

    public func reachability() async -> PromptReach {
        var reasons: [String] = []
        for prompter in prompters {
            switch await prompter.reachability() {
            case .reachable: return .reachable
            case .unreachable(let why): reasons.append(why)
            }
        }
        return .unreachable(reasons.isEmpty ? "no prompter is configured" : reasons.joined(separator: "; "))
    }

    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        var reasons: [String] = []
        for prompter in prompters {
            switch await prompter.reachability() {
            case .reachable: return await prompter.authenticate(request)
            case .unreachable(let why): reasons.append(why)
            }
        }
        return .unavailable(reasons.isEmpty ? "no prompter is configured" : reasons.joined(separator: "; "))
    }
}

/// How long a system prompt waits for its person.
public enum PromptTimeout {
    /// 90 s, as `systemd-ask-password`'s own default.
    public static let `default`: Duration = .seconds(90)
}

// MARK: - The questions every line prompter asks

/// One question of a prompter that reads a line (the terminal, a password agent).
struct PromptQuestion: Sendable {
    /// The storage's title (or ours), for the dialog's title or the first line.
    var title: String
    /// The subtitle, description and previous failure, one per line.
    var details: [String]
    /// What to type ("Passcode", "Finger to touch the reader").
    var label: String
    /// Whether the answer may be shown (a finger's name) or must be hidden (the passcode).
    var echo: Bool
    /// The cancel button's text (the prompt's `cancel`), said where a prompter has no button.
    var cancel: String
    /// What an empty answer does, said next to the label.
    var emptyMeans: String
    /// A stable id for the ask-password file (`Id=`): service and key.
    var id: String

    /// The question on one line, for prompters without a dialog (`Message=`), terminal-safe.
    var oneLine: String {
        ([title] + details + ["\(label) (empty: \(emptyMeans))"]).map(escaped).joined(separator: " — ")
    }
}

/// One line typed by the person: in locked memory, never a `String` while it is a passcode.
enum PromptLine {
    case text(SecureBytes)
    case cancel
    case interrupted
    case unavailable(String)
}

/// A prompter that asks one question at a time and reads one line; the request's methods become
/// one or two questions here, so every prompter asks the same way:
/// - a finger only: the finger's name, shown as typed; empty is cancel;
/// - the passcode only: the passcode, hidden; empty is cancel;
/// - both: the finger first, empty to use the passcode instead; then the passcode.
protocol LinePrompter: Authenticator {
    func ask(_ question: PromptQuestion) async -> PromptLine
}

extension LinePrompter {
    /// The request's questions, through `ask`.
    func answer(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        let prompt = request.prompt
        let title = prompt.title ?? (request.key.isEmpty ? "Authenticate" : "Authenticate to read '\(request.key)'")
        var details = [prompt.subtitle, prompt.description].compactMap { $0 }
        if let failure = request.previousFailure { details.append("\(failure), try again") }
        let cancel = prompt.cancel ?? "Cancel"
        let id = request.service.isEmpty ? "keychain" : "keychain:\(request.service)/\(request.key)"
        let fingers = request.methods.contains(.fingerprint)
        let passcode = request.methods.contains(.passcode)
        if fingers {
            let line = await ask(PromptQuestion(title: title, details: details, label: "Finger to touch the reader",
                                                echo: true, cancel: cancel, emptyMeans: passcode ? "use the passcode" : cancel, id: id))
            switch line {
            case .text(let bytes) where bytes.count > 0:
                return bytes.withUnsafeBytes { .finger(String(decoding: $0, as: UTF8.self)) }
            case .text: if !passcode { return .cancel }
            case .cancel: return .cancel
            case .interrupted: return .interrupted
            case .unavailable(let why): return .unavailable(why)
            }
        }
        guard passcode else { return .cancel }
        switch await ask(PromptQuestion(title: title, details: details, label: "Passcode", echo: false, cancel: cancel,
                                        emptyMeans: cancel, id: id)) {
        case .text(let bytes): return bytes.count > 0 ? .passcode(bytes) : .cancel
        case .cancel: return .cancel
        case .interrupted: return .interrupted
        case .unavailable(let why): return .unavailable(why)
        }
    }
}

// MARK: - Waiting on a thread of its own

/// A prompt's blocking wait, on a thread of its own (never Swift's shared pool), ended early by the
/// calling task's cancellation: `body` polls `cancel` (a pipe's read end) beside its own descriptor.
enum PromptWait {
    final class Cancel: Sendable {
        let fd: Int32
        private let writeEnd: Int32
        init() {
            var ends: [Int32] = [-1, -1]
            _ = pipe2(&ends, O_CLOEXEC | O_NONBLOCK)
            (fd, writeEnd) = (ends[0], ends[1])
        }
        private let handler = Mutex<(@Sendable () -> Void)?>(nil)
        /// Runs `body` when the task is canceled (at once if it already was).
        func onCancel(_ body: @escaping @Sendable () -> Void) {
            handler.withLock { $0 = body }
            var poll = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            if Glibc.poll(&poll, 1, 0) > 0 { body() }
        }
        func fire() {
            var one: UInt8 = 1
            _ = write(writeEnd, &one, 1)
            handler.withLock { $0 }?()
        }
        deinit { close(fd); close(writeEnd) }
    }

    static func run<T: Sendable>(_ body: @escaping @Sendable (_ cancel: Cancel) -> T) async -> T {
        let cancel = Cancel()
        return await withTaskCancellationHandler {
            await handedOver { handover in
                let failed = DetachedThread.start(name: "keychain prompt") { handover.deliver(body(cancel)) }
                precondition(failed == nil, "cannot start the prompt's thread: pthread_create: errno \(failed ?? 0)")
            }
        } onCancel: {
            cancel.fire()
        }
    }

    enum Ready { case readable, canceled, timedOut, failed }

    /// Waits until `fd` is readable, the task is canceled or `deadline` (CLOCK_MONOTONIC) passes.
    static func readable(_ fd: Int32, _ cancel: Cancel, until deadline: ContinuousClock.Instant) -> Ready {
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return .timedOut }
            let milliseconds = Int32(min(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000 + 1, 60_000))
            var fds = [pollfd(fd: fd, events: Int16(POLLIN), revents: 0), pollfd(fd: cancel.fd, events: Int16(POLLIN), revents: 0)]
            let status = poll(&fds, 2, milliseconds)
            if status < 0 {
                if errno == EINTR { continue }
                return .failed
            }
            if fds[1].revents != 0 { return .canceled }
            if fds[0].revents & Int16(POLLIN) != 0 { return .readable }
            if fds[0].revents != 0 { return .failed }  // POLLHUP, POLLERR: the other end is gone
        }
    }
}
