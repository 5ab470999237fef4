import Foundation
import KeychainWire
import SecureMemory

/// A caller's side of keychaind: one connection per call, the request, the daemon's prompts answered
/// by this process's `Authenticator`, then the result or the library's error as the daemon threw it.
struct DaemonClient: Sendable {
    let socketPath: String

    /// How long a reply may take: the daemon's own TPM timeout bounds each of its commands, so this
    /// only ends the wait for a daemon that is stopped (SIGSTOP) or wedged.
    static let replyTimeout = 120
    /// How long a started frame may stall.
    static let stallTimeout = 10

    func call(_ op: DaemonOp, _ build: (inout WireMessage) -> Void = { _ in },
              authenticator: (any Authenticator)? = nil) async throws(KeychainError) -> WireMessage {
        var request = WireMessage(kind: op.rawValue)
        build(&request)
        defer { request.wipe() }
        let fd = try await connect()
        defer { close(fd) }
        let sent = request
        try await blocking { () throws(WireError) in try WireSocket.send(fd, sent) }
        while true {
            var reply = try await blocking { () throws(WireError) in
                try WireSocket.receive(fd, idle: Self.replyTimeout, stall: Self.stallTimeout)
            }
            switch reply.kind {
            case DaemonReply.ok:
                return reply
            case DaemonReply.error:
                let thrown: KeychainError
                do { thrown = try KeychainError(decoding: reply) } catch { throw failure(error) }
                throw thrown
            case DaemonReply.prompt:
                var answer = try await answer(reply, authenticator: authenticator)
                defer { answer.wipe() }
                reply.wipe()
                let given = answer
                try await blocking { () throws(WireError) in try WireSocket.send(fd, given) }
            default:
                throw KeychainError(.internal, "The keychain service sent a reply of unknown kind \(reply.kind)")
            }
        }
    }

    /// A call without fields and without prompts, for the API's few synchronous calls; nil on any failure.
    func callBlocking(_ op: DaemonOp) -> WireMessage? {
        guard case .success(let fd) = WireSocket.connect(path: socketPath) else { return nil }
        defer { close(fd) }
        guard (try? WireSocket.send(fd, WireMessage(kind: op.rawValue))) != nil,
              let reply = try? WireSocket.receive(fd, idle: Self.replyTimeout, stall: Self.stallTimeout),
              reply.kind == DaemonReply.ok else { return nil }
        return reply
    }

    /// The daemon asks; this process's authenticator answers (the daemon never prompts).
    private func answer(_ prompt: WireMessage, authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        let request: AuthenticationRequest
        do {
            request = AuthenticationRequest(
                prompt: try WireJSON.decode(Prompt.self, prompt.bytes(Tag.promptJSON)) ?? Prompt(),
                methods: try WireJSON.decode([AuthenticationMethod].self, prompt.bytes(Tag.methods)) ?? [],
                service: try prompt.string(Tag.service) ?? "", key: try prompt.string(Tag.promptKey) ?? "",
                attempt: Int(try prompt.uint(Tag.attempt) ?? 1), previousFailure: try prompt.string(Tag.previousFailure))
        } catch { throw failure(error) }
        let given = await authenticator?.authenticate(request) ?? .interrupted
        var message = WireMessage(kind: DaemonReply.answer)
        switch given {
        case .finger(let name): message.add(Tag.answerKind, UInt64(0)); message.add(Tag.answerFinger, name)
        case .passcode(let pin):
            message.add(Tag.answerKind, UInt64(1))
            message.add(Tag.answerPasscode, pin.withUnsafeBytes { Array($0) })
        case .cancel: message.add(Tag.answerKind, UInt64(2))
        case .fallback: message.add(Tag.answerKind, UInt64(3))
        case .interrupted: message.add(Tag.answerKind, UInt64(4))
        }
        return message
    }

    private func connect() async throws(KeychainError) -> Int32 {
        switch WireSocket.connect(path: socketPath) {
        case .success(let fd): return fd
        case .failure(let error):
            let code: Int32 = if case .io(let value) = error.kind { value } else { 0 }
            throw KeychainError(.hardwareUnavailable,
                                "The keychain service is not running: nothing answers on \(socketPath) (start keychaind or its "
                                + "socket unit; keychainctl --direct uses a store without the service)", underlying: .errno(code))
        }
    }

    private func failure(_ error: WireError) -> KeychainError {
        switch error.kind {
        case .closed, .truncated:
            KeychainError(.hardwareUnavailable, "The keychain service stopped during the call (\(socketPath)): the call may or may "
                          + "not have taken effect; check and retry", underlying: .other(error.detail))
        case .timedOut:
            KeychainError(.hardwareUnavailable, "The keychain service did not answer within \(Self.replyTimeout) s (\(socketPath))",
                          underlying: .other(error.detail))
        default:
            KeychainError(.internal, "The keychain service's reply does not decode: \(error.detail)")
        }
    }

    /// Runs blocking socket I/O off Swift's shared pool.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws(WireError) -> T) async throws(KeychainError) -> T {
        let result: Result<T, WireError> = await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(returning: Result { () throws(WireError) in try body() })
            }
        }
        switch result {
        case .success(let value): return value
        case .failure(let error): throw failure(error)
        }
    }
}

extension WireMessage {
    /// The `resultJSON` field decoded, or `INTERNAL` naming what was missing.
    func result<T: Decodable>(_ type: T.Type) throws(KeychainError) -> T {
        let value: T?
        do { value = try WireJSON.decode(type, bytes(Tag.resultJSON)) } catch {
            throw KeychainError(.internal, "The keychain service's reply does not decode: \(error.detail)")
        }
        guard let value else { throw KeychainError(.internal, "The keychain service's reply has no result") }
        return value
    }
    func resultBool() throws(KeychainError) -> Bool {
        guard let value = try? bool(Tag.resultBool) else {
            throw KeychainError(.internal, "The keychain service's reply has no boolean result")
        }
        return value
    }
}
