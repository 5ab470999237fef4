/// What keychaind says after a request, and how a client answers its prompts (docs/daemon.md):
/// the daemon's replies read in one place, so the library's client, the small client and
/// keychainctl's front cannot read a kind or an answer number differently.

/// keychaind's reply to a request, as a client reads it: the messages before it are prompts.
public enum WireReply: Sendable {
    /// The call's result.
    case ok(WireMessage)
    /// The error the call threw.
    case error(WireErrorReply)
    /// A kind this client does not know (`WireFailure(unknownKind:)` words it).
    case unknown(kind: UInt8)

    /// nil for a prompt: keychaind asks the client's authenticator (`WirePromptQuestion`) and waits
    /// for a `WirePromptAnswer`. An error reply that does not decode is `malformed`.
    public init?(_ message: WireMessage) throws(WireError) {
        switch message.kind {
        case WireKind.ok: self = .ok(message)
        case WireKind.error: self = .error(try WireErrorReply(decoding: message))
        case WireKind.prompt: return nil
        default: self = .unknown(kind: message.kind)
        }
    }

    /// keychaind's messages from `first` until its reply: each prompt is handed to `answering`, which
    /// sends the answer and returns keychaind's next message, then wiped; a message that does not
    /// decode ends the wait with `unreadable`'s error. (keychainctl's front and the small client.)
    public static func awaiting<E: Error>(_ first: WireMessage, unreadable: (WireError) -> E,
                                          answering: (WireMessage) throws(E) -> WireMessage) throws(E) -> WireReply {
        var message = first
        while true {
            if let reply = try read(message, unreadable) { return reply }
            message = replacing(&message, with: try answering(message))
        }
    }

    /// `awaiting` with an async `answering`: the library's client, whose authenticator is async.
    public static func awaiting<E: Error>(_ first: WireMessage, unreadable: (WireError) -> E,
                                          answering: (WireMessage) async throws(E) -> WireMessage) async throws(E) -> WireReply {
        var message = first
        while true {
            if let reply = try read(message, unreadable) { return reply }
            message = replacing(&message, with: try await answering(message))
        }
    }

    /// The reply `message` is, nil for a prompt.
    private static func read<E: Error>(_ message: WireMessage, _ unreadable: (WireError) -> E) throws(E) -> WireReply? {
        do { return try WireReply(message) } catch { throw unreadable(error) }
    }

    /// The prompt answered: wiped (it named the item), `next` in its place.
    private static func replacing(_ prompt: inout WireMessage, with next: WireMessage) -> WireMessage {
        prompt.wipe()
        return next
    }

    /// The call's result, or the error keychaind threw (`thrown`) or a kind this client does not know
    /// (`unknown`, which `WireFailure(unknownKind:)` words), as the client's own error.
    public func result<E: Error>(thrown: (WireErrorReply) -> E, unknown: (WireFailure) -> E) throws(E) -> WireMessage {
        switch self {
        case .ok(let message): return message
        case .error(let reply): throw thrown(reply)
        case .unknown(let kind): throw unknown(WireFailure(unknownKind: kind))
        }
    }
}

/// The user's answer to keychaind's prompt, as the client sends it (`WireKind.answer`): the
/// library's `AuthenticationAnswer`, its case numbered as on the wire.
public enum WirePromptAnswer: Sendable, Equatable {
    case finger(String)
    case passcode([UInt8])
    case cancel
    case fallback
    case interrupted
    case unavailable(String)

    /// The number `WireTag.answerKind` carries.
    public enum Kind: UInt64, Sendable {
        case finger = 0, passcode, cancel, fallback, interrupted, unavailable
    }

    public var kind: Kind {
        switch self {
        case .finger: .finger
        case .passcode: .passcode
        case .cancel: .cancel
        case .fallback: .fallback
        case .interrupted: .interrupted
        case .unavailable: .unavailable
        }
    }

    /// The answer message (wipe it once sent: a passcode travels in it).
    public var message: WireMessage {
        var message = WireMessage(kind: WireKind.answer)
        message.add(WireTag.answerKind, kind.rawValue)
        switch self {
        case .finger(let name): message.add(WireTag.answerFinger, name)
        case .passcode(let bytes): message.add(WireTag.answerPasscode, bytes)
        case .unavailable(let reason): message.add(WireTag.answerReason, reason)
        case .cancel, .fallback, .interrupted: break
        }
        return message
    }

    /// The answer an `answer` message carries; one that does not say (an unknown number, a finger or
    /// passcode missing) is `interrupted`, which changes nothing.
    public init(decoding message: WireMessage) {
        let kind = (try? message.uint(WireTag.answerKind)).flatMap { $0 }.flatMap(Kind.init(rawValue:))
        switch kind {
        case .finger: self = (try? message.string(WireTag.answerFinger)).flatMap { $0 }.map { .finger($0) } ?? .interrupted
        case .passcode: self = message.bytes(WireTag.answerPasscode).map { .passcode($0) } ?? .interrupted
        case .cancel: self = .cancel
        case .fallback: self = .fallback
        case .unavailable:
            self = .unavailable((try? message.string(WireTag.answerReason)).flatMap { $0 } ?? "the client's prompt reaches no one")
        case .interrupted, nil: self = .interrupted
        }
    }
}

/// keychaind's prompt (`WireKind.prompt`): what the client's authenticator is asked.
public struct WirePromptQuestion: Sendable, Equatable {
    public var texts: WirePrompt
    /// The ways the user may answer, as the library's JSON list of `AuthenticationMethod` words.
    public var methods: [UInt8]?
    public var service: String
    public var key: String
    public var attempt: Int
    public var previousFailure: String?

    public init(texts: WirePrompt, methods: [UInt8]?, service: String, key: String, attempt: Int, previousFailure: String?) {
        (self.texts, self.methods, self.service, self.key) = (texts, methods, service, key)
        (self.attempt, self.previousFailure) = (attempt, previousFailure)
    }

    public var message: WireMessage {
        var message = WireMessage(kind: WireKind.prompt)
        message.add(WireTag.promptTexts, texts.encoded())
        message.add(WireTag.methods, methods)
        message.add(WireTag.service, service)
        message.add(WireTag.promptKey, key)
        message.add(WireTag.attempt, UInt64(attempt))
        message.add(WireTag.previousFailure, previousFailure)
        return message
    }

    /// Absent texts are the system's, an absent attempt the first.
    public init(decoding message: WireMessage) throws(WireError) {
        texts = try message.bytes(WireTag.promptTexts).map { bytes throws(WireError) in try WirePrompt(decoding: bytes) } ?? WirePrompt()
        methods = message.bytes(WireTag.methods)
        service = try message.string(WireTag.service) ?? ""
        key = try message.string(WireTag.promptKey) ?? ""
        attempt = Int(try message.uint(WireTag.attempt) ?? 1)
        previousFailure = try message.string(WireTag.previousFailure)
    }
}

extension WireFailure {
    /// keychaind sent a message of a kind this client does not know.
    public init(unknownKind kind: UInt8) {
        (code, message, cause) = ("INTERNAL", "The keychain service sent a reply of unknown kind \(kind)", nil)
    }
}
