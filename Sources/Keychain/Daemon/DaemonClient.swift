import Foundation
import KeychainWire
import SecureMemory
import Synchronization

/// A caller's side of keychaind: a connection per call at a time (kept for later calls of this
/// process once the call is complete), the request, the daemon's prompts answered by this process's
/// `Authenticator`, then the result or the library's error as the daemon threw it.
struct DaemonClient: Sendable {
    /// Connections whose last call completed, per socket: a later call reuses one instead of making
    /// the daemon start a connection (a thread) per read.
    /// The daemon knows a connection by the credentials it had at connect: one is reused only by the
    /// same effective uid and gid (a process that changed identity since gets a new connection).
    private static let idle = Mutex<[String: [(fd: Int32, uid: uid_t, gid: gid_t)]]>([:])
    static let maxIdle = 16

    let socketPath: String

    /// How long a reply may take: the daemon's own TPM timeout bounds each of its commands, so this
    /// only ends the wait for a daemon that is stopped (SIGSTOP) or wedged.
    static let replyTimeout = 120
    /// How long a started frame may stall.
    static let stallTimeout = 10

    func call(_ op: WireOp, _ build: (inout WireMessage) -> Void = { _ in },
              authenticator: (any Authenticator)? = nil) async throws(KeychainError) -> WireMessage {
        var request = WireMessage(kind: op.rawValue)
        build(&request)
        defer { request.wipe() }
        let fd = try await checkOut()
        // Back to the pool only after a complete exchange; on any failure the stream may be out of step.
        var complete = false
        defer { if complete { checkIn(fd) } else { close(fd) } }
        var reply = try await exchange(fd, request)
        while true {
            switch reply.kind {
            case WireKind.ok:
                complete = true
                return reply
            case WireKind.error:
                let thrown: KeychainError
                do { thrown = try KeychainError(decoding: reply) } catch { throw failure(error) }
                complete = true
                throw thrown
            case WireKind.prompt:
                var answer = try await answer(reply, authenticator: authenticator)
                defer { answer.wipe() }
                reply.wipe()
                reply = try await exchange(fd, answer)
            default:
                throw KeychainError(.internal, "The keychain service sent a reply of unknown kind \(reply.kind)")
            }
        }
    }

    /// A call without fields and without prompts, for the API's few synchronous calls; nil on any failure.
    func callBlocking(_ op: WireOp) -> WireMessage? {
        guard case .success(let fd) = WireSocket.connect(path: socketPath) else { return nil }
        defer { close(fd) }
        guard (try? WireSocket.send(fd, WireMessage(kind: op.rawValue))) != nil,
              let reply = try? WireSocket.receive(fd, idle: Self.replyTimeout, stall: Self.stallTimeout),
              reply.kind == WireKind.ok else { return nil }
        return reply
    }

    /// The daemon asks; this process's authenticator answers (the daemon never prompts).
    private func answer(_ prompt: WireMessage, authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        let request: AuthenticationRequest
        do {
            request = AuthenticationRequest(
                prompt: try WireJSON.decode(Prompt.self, prompt.bytes(WireTag.promptJSON)) ?? Prompt(),
                methods: try WireJSON.decode([AuthenticationMethod].self, prompt.bytes(WireTag.methods)) ?? [],
                service: try prompt.string(WireTag.service) ?? "", key: try prompt.string(WireTag.promptKey) ?? "",
                attempt: Int(try prompt.uint(WireTag.attempt) ?? 1), previousFailure: try prompt.string(WireTag.previousFailure))
        } catch { throw failure(error) }
        let given = await authenticator?.authenticate(request) ?? .interrupted
        var message = WireMessage(kind: WireKind.answer)
        switch given {
        case .finger(let name): message.add(WireTag.answerKind, UInt64(0)); message.add(WireTag.answerFinger, name)
        case .passcode(let pin):
            message.add(WireTag.answerKind, UInt64(1))
            message.add(WireTag.answerPasscode, pin.withUnsafeBytes { Array($0) })
        case .cancel: message.add(WireTag.answerKind, UInt64(2))
        case .fallback: message.add(WireTag.answerKind, UInt64(3))
        case .interrupted: message.add(WireTag.answerKind, UInt64(4))
        }
        return message
    }

    /// An idle connection the daemon has not closed (no EOF or data waiting), or a new one.
    private func checkOut() async throws(KeychainError) -> Int32 {
        let (uid, gid) = (geteuid(), getegid())
        while let (fd, owner, group) = Self.idle.withLock({ $0[socketPath]?.popLast() }) {
            guard owner == uid, group == gid else { close(fd); continue }
            // POLLIN | POLLRDHUP (0x2000, hidden by Glibc without _GNU_SOURCE).
            var poll = pollfd(fd: fd, events: Int16(POLLIN) | 0x2000, revents: 0)
            if Glibc.poll(&poll, 1, 0) == 0 { return fd }
            close(fd)  // closed by the daemon (idle timeout, restart) while it waited here
        }
        return try await connect()
    }

    private func checkIn(_ fd: Int32) {
        let kept = Self.idle.withLock { idle in
            guard idle[socketPath, default: []].count < Self.maxIdle else { return false }
            idle[socketPath, default: []].append((fd, geteuid(), getegid()))
            return true
        }
        if !kept { close(fd) }
    }

    private func connect() async throws(KeychainError) -> Int32 {
        switch WireSocket.connect(path: socketPath) {
        case .success(let fd): return fd
        case .failure(let error): throw KeychainError(WireFailure(connecting: error, socket: socketPath))
        }
    }

    private func failure(_ error: WireError) -> KeychainError {
        KeychainError(WireFailure(exchanging: error, socket: socketPath, replyTimeout: Self.replyTimeout))
    }

    /// Sends `message` and waits for the daemon's next message, off Swift's shared pool: one hop to a
    /// blocking thread and back per exchange.
    private func exchange(_ fd: Int32, _ message: WireMessage) async throws(KeychainError) -> WireMessage {
        let result: Result<WireMessage, WireError> = await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(returning: Result { () throws(WireError) in
                    try WireSocket.send(fd, message)
                    return try WireSocket.receive(fd, idle: Self.replyTimeout, stall: Self.stallTimeout)
                })
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
        do { value = try WireJSON.decode(type, bytes(WireTag.resultJSON)) } catch {
            throw KeychainError(.internal, "The keychain service's reply does not decode: \(error.detail)")
        }
        guard let value else { throw KeychainError(.internal, "The keychain service's reply has no result") }
        return value
    }
    func resultBool() throws(KeychainError) -> Bool {
        guard let value = try? bool(WireTag.resultBool) else {
            throw KeychainError(.internal, "The keychain service's reply has no boolean result")
        }
        return value
    }
}

extension KeychainError {
    /// A failure of the socket to keychaind, in the words keychainctl's front uses too.
    init(_ failure: WireFailure) {
        let underlying: Cause? = switch failure.cause {
        case .errno(let code)?: .errno(code)
        case .detail(let text)?: .other(text)
        case nil: nil
        }
        self.init(Code(rawValue: failure.code), failure.message, underlying: underlying)
    }
}
