import Foundation
import KeychainWire
import SecureMemory
import Synchronization

/// keychaind's service: owns the store and the TPM connection (through this process's engine) and
/// serves the keychain API on a listening Unix socket, one thread per connection.
///
/// Each caller's items are its uid's (`uid:N/` before every service name in the store); a storage
/// with an access group uses the group's (`group:NAME/`) when the caller is a member. The uid is the
/// kernel's (`SO_PEERCRED`), never a field of the request.
package final class DaemonServer: Sendable {
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
        /// Each user's quota (UserLimits.swift).
        package var user = UserLimits()
        package init() {}
    }

    let configuration: KeychainConfiguration
    /// Holds the store's engine (its thread, database and the keys it opened) for the daemon's life:
    /// storages are made per request, and an engine ends with its last storage or device.
    private let engine: Engine
    let groups: AccessGroups
    let limits: Limits
    /// Open connections, in all and per uid.
    private let open = Mutex<(total: Int, byUser: [UInt32: Int])>((0, [:]))
    /// One call of each uid in the engine at a time (UserLimits.swift).
    private let fairShare = FairShare()

    /// - Parameter configuration: the daemon's store, TPM and reader; its authenticator is ignored
    ///   (each call brings the caller's).
    package init(configuration: KeychainConfiguration, groups: AccessGroups, limits: Limits = .init()) {
        var configuration = configuration
        configuration.authenticator = nil
        configuration.userLimits = limits.user
        self.configuration = configuration
        self.engine = Engine.shared(for: configuration).engine
        self.groups = groups
        self.limits = limits
    }

    /// Accepts connections on `listener` forever.
    package func serve(listener: Int32) -> Never {
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                let code = errno
                if code == EMFILE || code == ENFILE || code == ENOMEM {
                    // Out of descriptors: let connections end rather than spin.
                    AccessGroups.log("keychaind: accept: errno \(code); waiting")
                    usleep(50_000)
                }
                continue
            }
            // Keychaind starts no programs, but the embedded TPM's swtpm must not inherit a client.
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            guard let peer = Peer(socket: fd) else { close(fd); continue }
            let uid = peer.uid
            let admitted = open.withLock { count in
                guard count.total < limits.maxConnections, count.byUser[uid, default: 0] < limits.maxConnectionsPerUser else { return false }
                count.total += 1
                count.byUser[uid, default: 0] += 1
                return true
            }
            guard admitted else { close(fd); continue }
            let thread = Thread { [self] in
                serve(connection: fd, peer: peer)
                close(fd)
                open.withLock { count in
                    count.total -= 1
                    count.byUser[uid, default: 1] -= 1
                    if count.byUser[uid] == 0 { count.byUser[uid] = nil }
                }
            }
            // It may run the engine's jobs too (cold TPM, OpenSSL and SQLite paths): room for those.
            thread.stackSize = 1 << 20
            thread.start()
        }
    }

    /// One client: requests in order until it closes, goes idle too long or breaks the protocol.
    func serve(connection fd: Int32, peer: Peer) {
        let connection = Connection()
        var sendTimeout = timeval(tv_sec: limits.stallTimeout, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, socklen_t(MemoryLayout<timeval>.size))
        while true {
            var request: WireMessage
            do {
                request = try WireSocket.receive(fd, idle: limits.idleTimeout, stall: limits.stallTimeout)
            } catch {
                switch error.kind {
                case .malformed, .version, .badLength:
                    // Say why once, then drop the connection: its stream may be out of step.
                    try? WireSocket.send(fd, KeychainError(wire: error).wireMessage)
                default: break
                }
                return
            }
            let reply = respond(to: request, from: peer, connection: connection, on: fd)
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
    private func respond(to request: WireMessage, from peer: Peer, connection: Connection, on fd: Int32) -> WireMessage? {
        let mailbox = Mailbox()
        fairShare.enter(peer.uid)
        defer { fairShare.leave(peer.uid) }
        /// Runs `start` and the engine's jobs on this thread until this call has its own work back.
        func drive(_ start: () -> Void) { engine.executor.drive(start, until: mailbox.hasEvent) }
        drive {
            Task(executorPreference: engine.executor) { [self] in
                mailbox.post(.done(await handle(request, peer: peer, connection: connection, mailbox: mailbox)))
            }
        }
        var broken = false
        while true {
            switch mailbox.next() {
            case .prompt(var prompt, let continuation):
                defer { prompt.wipe() }
                guard !broken else { drive { continuation.resume(returning: nil) }; continue }
                do {
                    // A person answers: the uid's other calls go in meanwhile.
                    let answer = try fairShare.pause(peer.uid) { () throws(WireError) in
                        try WireSocket.send(fd, prompt)
                        return try WireSocket.receive(fd, idle: limits.promptTimeout, stall: limits.stallTimeout)
                    }
                    guard answer.kind == WireKind.answer else { throw WireError(.malformed, "expected an answer") }
                    drive { continuation.resume(returning: answer) }
                } catch {
                    broken = true
                    drive { continuation.resume(returning: nil) }
                }
            case .done(let reply):
                return broken ? nil : reply
            }
        }
    }

    func handle(_ request: WireMessage, peer: Peer, connection: Connection, mailbox: Mailbox) async -> WireMessage {
        do throws(KeychainError) {
            guard let op = WireOp(rawValue: request.kind) else {
                throw KeychainError(.invalidArgument, "The keychain service does not know request \(request.kind): update the client or the service")
            }
            if op.needsAdmin && !groups.isAdmin(peer) {
                let what = switch op {
                case .lock: "lock the device (it locks it for every user; unlocking needs only the passcode)"
                case .enrolledFingers: "list the enrolled fingers' names (biometryTypes and canUseAccessControl answer everyone)"
                case .takeTPMCommandCount: "read and reset the TPM command count (it counts every user's calls)"
                default: "change the device (passcode, fingers, initialize)"
                }
                throw KeychainError(.accessDenied, "Only root or a member of the access group '\(AccessGroups.adminGroup)' may \(what); "
                                    + "uid \(peer.uid) is neither")
            }
            var configuration = configuration
            configuration.caller = DaemonCaller(uid: peer.uid, isAdmin: { [groups] in groups.isAdmin(peer) })
            if let attempts = try wire({ () throws(WireError) in try request.uint(WireTag.attempts) }) {
                configuration.authenticator = RemoteAuthenticator(mailbox: mailbox, attemptsPerRead: Int(min(attempts, 10)))
            }
            var reply = WireMessage(kind: WireKind.ok)
            if op.isStorageCall {
                try await storageCall(op, request, peer: peer, connection: connection, configuration: configuration, reply: &reply)
            } else {
                try await deviceCall(op, request, configuration: configuration, reply: &reply)
            }
            return reply
        } catch {
            return error.wireMessage
        }
    }

    private func storageCall(_ op: WireOp, _ request: WireMessage, peer: Peer, connection: Connection,
                             configuration: KeychainConfiguration, reply: inout WireMessage) async throws(KeychainError) {
        guard let options = try connection.options(request.bytes(WireTag.options)), options.service != nil else {
            throw KeychainError(.invalidArgument, "The keychain service got a storage call without its options")
        }
        let namespace: String
        if let group = options.accessGroup {
            guard try groups.isMember(peer, of: group) else {
                throw KeychainError(.accessDenied, "uid \(peer.uid) is not a member of the access group '\(group)' (or there is no such "
                                    + "group): ask the administrator to add it to groups.d/\(group).conf")
            }
            namespace = Keychain.groupNamespacePrefix + group + "/"
        } else {
            namespace = "uid:\(peer.uid)/"
        }
        do throws(KeychainError) {
            try await storageCall(op, request, options: options, namespace: namespace, configuration: configuration, reply: &reply)
        } catch {
            // Messages name the caller's service, as in-process: never the daemon's namespace before it.
            throw KeychainError(error.code, error.message.replacingOccurrences(of: namespace, with: ""), underlying: error.underlying)
        }
    }

    private func storageCall(_ op: WireOp, _ request: WireMessage, options: KeychainOptions, namespace: String,
                             configuration: KeychainConfiguration, reply: inout WireMessage) async throws(KeychainError) {
        let storage = try Keychain(options: options, configuration: configuration, namespace: namespace, engine: engine)
        let key = try wire { () throws(WireError) in try request.string(WireTag.key) } ?? ""
        switch op {
        case .setItem:
            var bytes = request.bytes(WireTag.value) ?? []
            defer { bytes.wipe() }
            let call = try wire { () throws(WireError) in try SetItemOptions(wire: request) }
            try await storage.setItem(key, SecureBytes(copying: bytes), options: call)
        case .getItem:
            let prompt = try wire { () throws(WireError) in try WireJSON.decode(Prompt.self, request.bytes(WireTag.prompt)) }
            if let value = try await storage.getSecureBytes(key, options: prompt.map { GetItemOptions(prompt: $0) }) {
                reply.add(WireTag.resultBytes, value.withUnsafeBytes { Array($0) })
            }
        case .hasItem: reply.add(WireTag.resultBool, try await storage.hasItem(key))
        case .removeItem: try await storage.removeItem(key)
        case .clear: try await storage.clear()
        case .allKeys: reply.add(WireTag.resultJSON, WireJSON.encode(try await storage.getAllKeys()))
        case .itemInfo:
            if var info = try await storage.getItemInfo(key) {
                if info.service.hasPrefix(namespace) { info.service.removeFirst(namespace.count) }
                reply.add(WireTag.resultJSON, WireJSON.encode(info))
            }
        case .storageCanUse:
            reply.add(WireTag.resultJSON, WireJSON.encode(try await storage.canUseAccessControl(try accessControl(request))))
        default: throw KeychainError(.internal, "not a storage call: \(op)")
        }
    }

    private func deviceCall(_ op: WireOp, _ request: WireMessage, configuration: KeychainConfiguration,
                            reply: inout WireMessage) async throws(KeychainError) {
        let device = KeychainDevice(configuration: configuration)
        let passcode = request.bytes(WireTag.passcode).map { bytes in
            var bytes = bytes
            defer { bytes.wipe() }
            return SecureBytes(copying: bytes)
        }
        let newPasscode = request.bytes(WireTag.newPasscode).map { bytes in
            var bytes = bytes
            defer { bytes.wipe() }
            return SecureBytes(copying: bytes)
        }
        let finger = try wire { () throws(WireError) in try request.string(WireTag.finger) } ?? ""
        switch op {
        case .enrollFinger: try await device.enrollFinger(finger, passcode: passcode)
        case .removeFinger: reply.add(WireTag.resultBool, try await device.removeFinger(finger, passcode: passcode))
        case .deleteReader: reply.add(WireTag.resultBool, try await device.deleteReader(passcode: passcode))
        case .enrolledFingers: reply.add(WireTag.resultJSON, WireJSON.encode(try await device.enrolledFingers()))
        case .biometryTypes: reply.add(WireTag.resultJSON, WireJSON.encode(device.biometryTypes()))
        case .deviceCanUse: reply.add(WireTag.resultJSON, WireJSON.encode(try await device.canUseAccessControl(try accessControl(request))))
        case .initialize: reply.add(WireTag.resultJSON, WireJSON.encode(try await device.initialize()))
        case .status: reply.add(WireTag.resultJSON, WireJSON.encode(try await device.status()))
        case .resetTokenPINTries: try await device.resetTokenPINTries()
        case .tokenStatus:
            if let status = try await device.tokenStatus() { reply.add(WireTag.resultJSON, WireJSON.encode(status)) }
        case .unlock: try await device.unlock(passcode: passcode)
        case .lock: try await device.lock()
        case .setPasscode: try await device.setPasscode(newPasscode ?? SecureBytes(copying: []))
        case .changePasscode: try await device.changePasscode(from: passcode ?? SecureBytes(copying: []), to: newPasscode ?? SecureBytes(copying: []))
        case .removePasscode: try await device.removePasscode(current: passcode ?? SecureBytes(copying: []))
        case .resetPasscodeTries: try await device.resetPasscodeTries()
        case .takeTPMCommandCount: reply.add(WireTag.resultNumber, UInt64(await device.takeTPMCommandCount()))
        case .dropCaches: await device.dropCaches()
        default: throw KeychainError(.internal, "not a device call: \(op)")
        }
    }

    private func accessControl(_ request: WireMessage) throws(KeychainError) -> AccessControl {
        let raw = try wire { () throws(WireError) in try request.string(WireTag.accessControl) } ?? ""
        guard let value = AccessControl(rawValue: raw) else { throw .invalidArgument("Invalid accessControl '\(raw)'") }
        return value
    }

    private func wire<T>(_ body: () throws(WireError) -> T) throws(KeychainError) -> T {
        do { return try body() } catch { throw KeychainError(wire: error) }
    }
}

/// What one connection's requests share: they run one at a time (`serve(connection:)` waits for each
/// reply), so a request's task is the only one that touches it.
final class Connection: @unchecked Sendable {
    /// The options of the last storage call and their decoding: a client sends the same bytes with
    /// every call of a storage, and JSONDecoder cost more than the rest of a warm read. Only the
    /// decoding is kept; every check (namespace, access group, lock state) runs for each request.
    private var lastOptions: (bytes: [UInt8], options: KeychainOptions)?

    func options(_ bytes: [UInt8]?) throws(KeychainError) -> KeychainOptions? {
        guard let bytes else { return nil }
        if let lastOptions, lastOptions.bytes == bytes { return lastOptions.options }
        let options: KeychainOptions?
        do { options = try WireJSON.decode(KeychainOptions.self, bytes) } catch { throw KeychainError(wire: error) }
        lastOptions = options.map { (bytes, $0) }
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
        var prompt = WireMessage(kind: WireKind.prompt)
        prompt.add(WireTag.promptJSON, WireJSON.encode(request.prompt))
        prompt.add(WireTag.methods, WireJSON.encode(request.methods))
        // The caller named its service without the daemon's namespace.
        prompt.add(WireTag.service, String(request.service.drop { $0 != "/" }.dropFirst()))
        prompt.add(WireTag.promptKey, request.key)
        prompt.add(WireTag.attempt, UInt64(request.attempt))
        prompt.add(WireTag.previousFailure, request.previousFailure)
        guard var answer = await mailbox.ask(prompt) else { return .interrupted }
        defer { answer.wipe() }
        switch try? answer.uint(WireTag.answerKind) {
        case 0: return (try? answer.string(WireTag.answerFinger)).flatMap { $0 }.map { .finger($0) } ?? .interrupted
        case 1: return answer.bytes(WireTag.answerPasscode).map { .passcode(SecureBytes(copying: $0)) } ?? .interrupted
        case 2: return .cancel
        case 3: return .fallback
        default: return .interrupted
        }
    }
}

/// Between a call's task and its connection's thread: prompts to send, then the reply.
final class Mailbox: @unchecked Sendable {
    enum Event {
        case prompt(WireMessage, CheckedContinuation<WireMessage?, Never>)
        case done(WireMessage)
    }
    private let condition = NSCondition()
    private var events: [Event] = []

    func post(_ event: Event) {
        condition.lock()
        events.append(event)
        condition.signal()
        condition.unlock()
    }

    /// Whether `next()` would return at once: the call's thread has its own work back.
    func hasEvent() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        return !events.isEmpty
    }

    func next() -> Event {
        condition.lock()
        defer { condition.unlock() }
        while events.isEmpty { condition.wait() }
        return events.removeFirst()
    }

    func ask(_ prompt: WireMessage) async -> WireMessage? {
        await withCheckedContinuation { post(.prompt(prompt, $0)) }
    }
}
