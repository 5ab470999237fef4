import KeychainEngine
import KeychainBasics
import Glibc
import KeychainWire
import SecureMemory
import TPM2

/// keychaind's service: owns the store and the TPM connection (through this process's engine) and
/// serves the keychain API on a listening Unix socket, one thread per connection.
///
/// Each caller's items are its uid's (`ItemScope.user`); a storage with an access group uses the
/// group's (`ItemScope.group`) when the caller is a member. The uid is the kernel's (`SO_PEERCRED`),
/// never a field of the request. `DaemonRequestHandler` maps each request to the engine's API.
package final class DaemonServer: Sendable {
    /// A connection's thread may run the engine's jobs too (cold TPM, OpenSSL and SQLite paths): room for those.
    static let connectionStackSize = 1 << 20

    package struct Limits: Sendable {
        /// Open connections at once; more are closed at accept.
        package var maxConnections = 4096
        /// Open connections of one uid at once (a quarter of `maxConnections`): one user's idle
        /// connections cannot take every slot and keep the others out.
        package var maxConnectionsPerUser: Int { max(1, maxConnections / 4) }
        /// Seconds a connection may wait between requests.
        package var idleTimeout = 600
        /// Seconds a started frame may stall (reading) or a reply may wait for the client to read.
        package var stallTimeout = 10
        /// Seconds a prompt waits for the client's authenticator (a person answers it).
        package var promptTimeout = 300
        /// Each user's quota (Keychain/Quota.swift).
        package var user = UserLimits()
        package init() {}

        /// Descriptors keychaind keeps for itself beside one per connection: the store's database,
        /// log and locks, the TPM's connection, the listener, the reader's and group files (14 are
        /// open in an idle daemon on the embedded TPM).
        package static let reservedDescriptors = 64
        /// Fewer connections than this and each uid gets none beside its first (a quarter each).
        package static let leastConnections = 4

        /// Why a new connection of `uid` is not served, with `open` connections open in all and
        /// `openOfUser` of that uid; nil when it is served.
        func refusal(open: Int, openOfUser: Int, uid: UInt32) -> KeychainError? {
            let raise = "or ask the administrator to raise --max-connections"
            if openOfUser >= maxConnectionsPerUser {
                return KeychainError(.hardwareUnavailable, "keychaind serves at most \(Self.connections(maxConnectionsPerUser)) of one uid at "
                                     + "once (a quarter of --max-connections \(maxConnections)) and uid \(uid) has \(openOfUser) open: nothing "
                                     + "was done. Close connections that user's programs hold idle and retry, \(raise)")
            }
            if open >= maxConnections {
                return KeychainError(.hardwareUnavailable, "keychaind serves at most \(Self.connections(maxConnections)) at once "
                                     + "(--max-connections) and all are open: nothing was done. Retry once some have closed, \(raise)")
            }
            return nil
        }

        private static func connections(_ count: Int) -> String { count == 1 ? "1 connection" : "\(count) connections" }

        /// Fits `maxConnections` to the descriptors keychaind may open (RLIMIT_NOFILE), so that one
        /// uid's quarter can never take every descriptor and keep the others out at accept.
        ///
        /// - Parameter explicit: whether the administrator chose `maxConnections` (`--max-connections`):
        ///   then it is refused, not changed.
        /// - Returns: the log's line when the default was lowered, nil when it fits.
        /// - Throws: `INVALID_ARGUMENT` naming the numbers and the fix.
        package mutating func fit(descriptors: Int, explicit: Bool) throws(KeychainError) -> String? {
            let room = descriptors - Self.reservedDescriptors
            guard maxConnections > room else { return nil }
            let needs = "one per connection and \(Self.reservedDescriptors) for the store and the TPM"
            let raise = "raise the limit (LimitNOFILE= in keychaind.service, ulimit -n)"
            guard room >= Self.leastConnections else {
                throw KeychainError(.invalidArgument, "keychaind may open only \(descriptors) descriptors (RLIMIT_NOFILE) and needs at "
                                    + "least \(Self.reservedDescriptors + Self.leastConnections) (\(needs), for \(Self.leastConnections) "
                                    + "connections): \(raise)")
            }
            guard !explicit else {
                throw KeychainError(.invalidArgument, "--max-connections \(maxConnections) needs \(maxConnections + Self.reservedDescriptors) "
                                    + "descriptors (\(needs)), and keychaind may open \(descriptors) (RLIMIT_NOFILE): lower "
                                    + "--max-connections to at most \(room), or \(raise)")
            }
            defer { maxConnections = room }
            return "keychaind: --max-connections lowered from \(maxConnections) to \(room) (\(max(1, room / 4)) per uid) to fit "
                + "the descriptor limit (RLIMIT_NOFILE \(descriptors): \(needs)); \(raise) for more"
        }
    }

    let configuration: KeychainConfiguration
    /// Holds the store's engine (its thread, database and the keys it opened) for the daemon's life.
    private let service: LocalService
    /// Each request as a call of the engine, in the caller's scope.
    package let handler: DaemonRequestHandler
    let limits: Limits
    /// Every socket's accept loop, limits and slots (keychaind's credentials socket is one more door of it).
    package let connections: ConnectionServer
    /// One call of each uid in the engine at a time (FairShare.swift).
    private let fairShare = FairShare()

    /// - Parameter configuration: the daemon's store, TPM and reader; its authenticator is ignored
    ///   (each call brings the caller's).
    package init(configuration: KeychainConfiguration, groups: AccessGroups, limits: Limits = .init()) {
        var configuration = configuration
        configuration.authenticator = nil
        self.configuration = configuration
        service = LocalService(server: configuration, quota: limits.user)
        handler = DaemonRequestHandler(service: service, groups: groups)
        self.limits = limits
        connections = ConnectionServer(limits: limits)
    }

    /// What the first request after a TPM reset would begin with, made before keychaind says it is ready
    /// (`LocalService.unlockWithoutPasscodeAtStart`): a credential asked for at boot then finds it done. The
    /// line to log: what was done, or what failed (never fatal: the first request meets it again and
    /// answers with it); nil when there was nothing to do.
    package func prepareForFirstRequest() async -> String? {
        let service = service
        return await TPMContext.pausingCrashPoints { () async -> String? in
            do throws(KeychainError) {
                let unlocked = try await service.unlockWithoutPasscodeAtStart()
                    ? "keychaind: the device has no passcode and the TPM had it locked (a TPM reset): unlocked it" : nil
                let kept = try await service.prepareKeptSession()
                let lines = [unlocked, kept].compactMap { $0 }
                return lines.isEmpty ? nil : lines.joined(separator: "\n")
            } catch {
                return "keychaind: preparing for the first request failed (\(error.code.rawValue): \(error.message)); each request meets it again"
            }
        }
    }

    /// After "ready", on a chip (`prepareKeptSession`): the wrapping keys' contexts saved, one key per
    /// engine call so that requests are served between two, at most `limit` keys. - Returns: the line
    /// to log, nil when there was nothing to do.
    package func saveWrappingKeyContexts(limit: Int = 1024) async -> String? {
        await service.saveWrappingKeyContexts(limit: limit)
    }

    /// Accepts connections on `listener` forever: the keychain API's door of `connections`.
    package func serve(listener: Int32) -> Never {
        connections.serve(listener: listener, door: .init(name: "keychain socket", tellsApplications: true, serve: { [self] fd, peer in
            serve(connection: fd, peer: peer)
        }, refuse: { fd, reason in
            // Said on the connection: closed without a word, the client could only guess (a crash?). The
            // reply fits in the new socket's empty buffer (the server made it non-blocking all the same).
            try? WireSocket.send(fd, reason.wireMessage)
        }))
    }

    /// One client: requests in order until it closes, goes idle too long or breaks the protocol.
    func serve(connection fd: Int32, peer: Peer) {
        let connection = Connection()
        // A request's length and body in one recv, and the wait for it that recv (WireReader).
        let reader = WireReader(fd: fd)
        while true {
            var request: WireMessage
            do {
                request = try reader.receive(idle: limits.idleTimeout, stall: limits.stallTimeout)
            } catch {
                switch error.kind {
                case .malformed, .version, .badLength:
                    // Say why once, then drop the connection: its stream may be out of step.
                    try? WireSocket.send(fd, KeychainError(wire: error).wireMessage)
                default: break
                }
                return
            }
            #if DEBUG
            RequestLog.record(request.kind)
            RequestLog.recordTime(of: peer.pid)
            #endif
            let reply = respond(to: request, from: peer, connection: connection, on: reader)
            request.wipe()
            guard var reply else { return }
            defer { reply.wipe() }
            do { try WireSocket.send(fd, reply) } catch { return }
        }
    }

    /// Runs the call as a task and does its prompts' I/O on this connection's thread meanwhile; nil
    /// when the connection broke during a prompt.
    ///
    /// The task prefers the engine's executor, and this thread runs the engine's jobs itself while no
    /// other thread does (`drive`): a warm read then wakes no other thread in the daemon, where a
    /// task on the shared pool took three wake-ups (pool, engine, back to this thread).
    private func respond(to request: WireMessage, from peer: Peer, connection: Connection, on reader: WireReader) -> WireMessage? {
        // A warm read on this thread: it never waits behind another call's TPM command.
        if let reply = handler.respondAtOnce(to: request, from: peer, options: connection.options) { return reply }
        // The call's deadline counts from when it was made (docs/security.md): its wait for its uid's
        // turn, for the engine and for each TPM command is part of it, a person's answer to its prompt is not.
        let timeout = configuration.tpmTimeout
        let deadline = CallDeadline(.now + timeout)
        let mailbox = Mailbox()
        var holdingTurn = fairShare.enter(peer.uid, until: deadline.instant)
        defer { fairShare.leave(peer.uid, holdingTurn: holdingTurn) }
        guard holdingTurn else { return Self.overdue(timeout: timeout).wireMessage }
        /// Runs `start` and the engine's jobs on this thread until this call has its own work back.
        func drive(_ start: () -> Void) {
            service.executor.drive(start, madeAt: deadline.instant - timeout, until: mailbox.hasEvent)
        }
        drive {
            Task(executorPreference: service.executor) { [self] in
                // A call that waited its whole deadline for the engine (behind another call's TPM command
                // that the TPM has not answered) ends here, even one that would need no TPM command.
                guard mailbox.begin() else { return }  // its thread answered at its deadline
                guard !deadline.hasPassed else {
                    mailbox.post(.done(Self.overdue(timeout: timeout).wireMessage))
                    return
                }
                // A write is not made once its client has gone (`CallerPresence`).
                let reply = await CallDeadline.$current.withValue(deadline) {
                    await CallerPresence.$current.withValue(CallerPresence(socket: reader.fd)) {
                        await handle(request, peer: peer, connection: connection, mailbox: mailbox)
                    }
                }
                mailbox.post(.done(reply))
            }
        }
        var broken = false
        while true {
            // Until its task begins, the call may wait behind a TPM command of a call made after it (one that
            // entered the engine while this one waited for its uid's turn): at its deadline it ends (the task
            // then does nothing), and its thread is free, as it runs no other call's jobs before its own.
            guard let event = mailbox.next(until: deadline.instant) ?? (mailbox.giveUp() ? nil : mailbox.next()) else {
                return Self.overdue(timeout: timeout).wireMessage
            }
            switch event {
            case .prompt(var prompt, let handover):
                defer { prompt.wipe() }
                guard !broken, holdingTurn else { drive { handover.deliver(nil) }; continue }
                // A person answers: the uid's other calls go in meanwhile.
                let (asked, back) = fairShare.pause(peer.uid, until: { deadline.instant }) { () throws(WireError) in
                    let asked = ContinuousClock.now
                    defer { deadline.extend(by: .now - asked) }
                    try WireSocket.send(reader.fd, prompt)
                    return try reader.receive(idle: limits.promptTimeout, stall: limits.stallTimeout)
                }
                holdingTurn = back
                guard case .success(var answer) = asked, answer.kind == WireKind.answer else {
                    broken = true  // the connection broke, or it sent no answer: its stream may be out of step
                    drive { handover.deliver(nil) }
                    continue
                }
                guard back else {
                    // No turn back before the deadline: the call ends as interrupted, and its reply says why.
                    answer.wipe()
                    drive { handover.deliver(nil) }
                    continue
                }
                drive { handover.deliver(answer) }
            case .done(var reply):
                if broken { reply.wipe(); return nil }
                guard holdingTurn else {
                    reply.wipe()
                    return Self.overdue(timeout: timeout).wireMessage
                }
                return reply
            }
        }
    }

    /// A call that waited its whole deadline for earlier calls (its uid's turn, the engine): they wait for the TPM.
    static func overdue(timeout: Duration) -> KeychainError {
        KeychainError(.hardwareUnavailable, "Earlier calls held the keychain service for this call's whole deadline (\(timeout)), "
                      + "waiting for the TPM: check that it is running and not stopped")
    }

    func handle(_ request: WireMessage, peer: Peer, connection: Connection, mailbox: Mailbox) async -> WireMessage {
        await handler.respond(to: request, from: peer, options: connection.options,
                              authenticator: { RemoteAuthenticator(mailbox: mailbox, attemptsPerRead: $0) })
    }
}

/// What one connection's requests share: they run one at a time (`serve(connection:)` waits for each
/// reply), so a request's task is the only one that touches it.
final class Connection: @unchecked Sendable {
    /// The options of the last storage call and their decoding: a client sends the same bytes with
    /// every call of a storage. Only the decoding is kept; every check (validation, namespace, access
    /// group, lock state) runs for each request.
    private var lastOptions: (bytes: [UInt8], options: RequestOptions)?

    func options(_ bytes: [UInt8]?) throws(KeychainError) -> RequestOptions? {
        guard let bytes else { return nil }
        if let lastOptions, lastOptions.bytes == bytes { return lastOptions.options }
        let options: RequestOptions
        do {
            let fields = try WireStorageOptions(decoding: bytes)
            options = RequestOptions(options: try KeychainOptions(wire: fields), serviceIsDefault: fields.serviceIsDefault == true)
        } catch {
            throw KeychainError(wire: error)
        }
        lastOptions = (bytes, options)
        return options
    }
}

/// The caller's authenticator, across the socket: the daemon never prompts, it asks the client.
final class RemoteAuthenticator: Authenticator {
    let mailbox: Mailbox
    let attemptsPerRead: Int
    init(mailbox: Mailbox, attemptsPerRead: Int) {
        self.mailbox = mailbox
        self.attemptsPerRead = attemptsPerRead
    }

    func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        guard var answer = await mailbox.ask(request.wire.message) else { return .interrupted }
        defer { answer.wipe() }
        // One statement: the decoded answer's copy of a passcode is gone before the message is wiped.
        return AuthenticationAnswer(wire: WirePromptAnswer(decoding: answer))
    }
}

/// Between a call's task and its connection's thread: prompts to send, then the reply.
final class Mailbox: @unchecked Sendable {
    enum Event {
        case prompt(WireMessage, Handover<WireMessage?>)
        case done(WireMessage)
    }
    private let condition = Condition()
    private var events: [Event] = []
    /// Whether the call's task began its work (true) or its thread gave the call up before (false).
    private var begun: Bool?

    func post(_ event: Event) {
        condition.withLock {
            events.append(event)
            condition.signal()
        }
    }

    /// Whether `next()` would return at once: the call's thread has its own work back.
    func hasEvent() -> Bool {
        condition.withLock { !events.isEmpty }
    }

    /// The next event; nil when `deadline` passed first.
    func next(until deadline: ContinuousClock.Instant? = nil) -> Event? {
        condition.lock()
        defer { condition.unlock() }
        while events.isEmpty {
            guard let deadline else { condition.wait(); continue }
            if !condition.wait(until: deadline) && events.isEmpty { return nil }
        }
        return events.removeFirst()
    }

    /// The task's first step: whether it may do the call's work (its thread has not given it up).
    func begin() -> Bool {
        condition.withLock {
            if begun == nil { begun = true }
            return begun == true
        }
    }

    /// The thread's, at the call's deadline: whether the call is given up, its task not begun (it then
    /// does nothing). Once begun, the call's work may have changed something: its reply says what.
    func giveUp() -> Bool {
        condition.withLock {
            if begun == nil { begun = false }
            return begun == false
        }
    }

    func ask(_ prompt: WireMessage) async -> WireMessage? {
        await handedOver { post(.prompt(prompt, $0)) }
    }
}

#if DEBUG
/// Test hook (debug builds): with `KEYCHAIN_TEST_REQUEST_LOG=FILE` keychaind appends each request's
/// kind (its `WireOp` name, nothing of its content) to FILE, a line a request, so a test counts the
/// exchanges a call took (a batch read: one `getItems`).
private enum RequestLog {
    static let fd: Int32 = getenv("KEYCHAIN_TEST_REQUEST_LOG").map { open($0, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600) } ?? -1

    static func record(_ kind: UInt8) {
        guard fd >= 0 else { return }
        let line = Array(((WireOp(rawValue: kind).map { "\($0)" } ?? "\(kind)") + "\n").utf8)
        _ = line.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }  // One write: lines of concurrent connections never mix.
    }

    /// With `KEYCHAIN_TEST_REQUEST_TIMES=FILE`: when each request was read, as `<peer pid> <CLOCK_MONOTONIC seconds>`,
    /// a line a request, so the soak (scripts/soak.py) counts a call's deadline from when keychaind could first read it.
    static let timesFD: Int32 = getenv("KEYCHAIN_TEST_REQUEST_TIMES").map { open($0, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600) } ?? -1

    static func recordTime(of pid: Int32) {
        guard timesFD >= 0 else { return }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let line = Array("\(pid) \(now.tv_sec).\(String(now.tv_nsec / 1_000_000 + 1000).dropFirst())\n".utf8)
        _ = line.withUnsafeBytes { write(timesFD, $0.baseAddress, $0.count) }
    }
}
#endif
