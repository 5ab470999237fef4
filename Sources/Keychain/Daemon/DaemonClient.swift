import Glibc
import FoundationEssentials
import Dispatch
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
    private static let idle = Mutex<[String: [Kept]]>([:])
    static let maxIdle = 16

    let socketPath: String
    /// This client's exchanges that hopped to a blocking thread (for tests).
    let hops = HopCount()
    final class HopCount: Sendable {
        let count = Atomic<Int>(0)
        /// This client's exchanges waiting for a reply now on Dispatch's global queue, and on a thread of their own.
        let waitingOnGlobalQueue = Atomic<Int>(0)
        let waitingOnOwnThread = Atomic<Int>(0)
        func waiting(_ onGlobalQueue: Bool, _ change: Int) {
            if onGlobalQueue { waitingOnGlobalQueue.add(change, ordering: .relaxed) } else { waitingOnOwnThread.add(change, ordering: .relaxed) }
        }
    }
    /// This process's exchanges waiting on Dispatch's global queue now: at most `globalQueueWaits`.
    private static let waitingOnGlobalQueue = Atomic<Int>(0)
    /// Dispatch's global queue runs as many threads as there are processors, and Swift's tasks run on
    /// them too: one more exchange waiting there would wait for a thread, not for keychaind.
    static let globalQueueWaits = max(1, ProcessInfo.processInfo.activeProcessorCount)
    /// This process's exchanges waiting now on threads of their own: at most `ownThreadWaits`, a thread
    /// each (beyond that they queue on the global queue, as all did before): a process with hundreds of
    /// tasks calling a stopped keychaind at once does not start hundreds of threads.
    private static let waitingOnOwnThread = Atomic<Int>(0)
    static let ownThreadWaits = 64

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
        // Read once a call (two system calls): the connection's identity is the one it was made with.
        let identity = Identity.current
        var connection = try await checkOut(as: identity)
        // Back to the pool only after a complete exchange; on any failure the stream may be out of step.
        var complete = false
        defer {
            // Bytes past the reply: the daemon said more than it was asked, the stream is out of step.
            if complete && !connection.reader.hasPending { checkIn(connection) } else { close(connection.reader.fd) }
        }
        var reply: WireMessage
        if let served = try await exchangeUnlessUnread(connection, request) {
            reply = served
        } else {
            // Closed by the daemon before it read the request: a kept one while idle (its idle timeout, a
            // restart), a new one that waited past the idle timeout for a thread to wait on. The request was
            // not served: once more, on a connection made where the request goes at once.
            let (fresh, served) = try await connectAndExchange(as: identity, request)
            close(connection.reader.fd)
            (connection, reply) = (fresh, served)
        }
        // `WireReply.awaiting`'s steps, with this process's authenticator (async) answering.
        while true {
            let final: WireReply?
            do { final = try WireReply(reply) } catch { throw failure(error) }
            switch final {
            case .ok(let result)?:
                complete = true
                return result
            case .error(let thrown)?:
                complete = true
                throw KeychainError(thrown)
            case .unknown(let kind)?: throw KeychainError(WireFailure(unknownKind: kind))
            case nil:
                var answer = try await answer(reply, authenticator: authenticator)
                defer { answer.wipe() }
                reply.wipe()
                reply = try await exchange(connection.reader, answer)
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
        do { request = try AuthenticationRequest(wire: WirePromptQuestion(decoding: prompt)) } catch { throw failure(error) }
        let given = await authenticator?.authenticate(request) ?? .interrupted
        return WirePromptAnswer(given).message
    }

    /// The effective uid and gid that the daemon sees on a connection made now (SO_PEERCRED).
    struct Identity: Equatable {
        let uid: uid_t
        let gid: gid_t
        static var current: Identity { Identity(uid: geteuid(), gid: getegid()) }
    }

    /// A connection of this process to the daemon, its frames read by `reader` (which keeps the
    /// socket's receive timeout and its buffer from one call to the next).
    struct Kept: Sendable {
        let reader: WireReader
        /// Who the daemon knows it as; nil when the identity changed while it was made (it is not kept).
        let identity: Identity?
        /// Whether it comes from the pool: the daemon may have closed it meanwhile.
        var reused = false
    }

    /// An idle connection made as `identity`, or a new one. One the daemon closed meanwhile is found
    /// when the request is sent (`exchangeKept`), not by a `poll` of it here.
    private func checkOut(as identity: Identity) async throws(KeychainError) -> Kept {
        while var kept = Self.idle.withLock({ $0[socketPath]?.popLast() }) {
            guard kept.identity == identity else { close(kept.reader.fd); continue }
            kept.reused = true
            return kept
        }
        return try await connect(as: identity)
    }

    private func checkIn(_ connection: Kept) {
        var connection = connection
        connection.reused = false
        let kept = connection.identity != nil && Self.idle.withLock { idle in
            guard idle[socketPath, default: []].count < Self.maxIdle else { return false }
            idle[socketPath, default: []].append(connection)
            return true
        }
        if !kept { close(connection.reader.fd) }
    }

    /// A new connection; kept for later calls only when this process's identity was `identity` both
    /// before and after the connect (another thread may change it meanwhile, and the kernel records
    /// the one of the moment).
    private func connect(as identity: Identity) async throws(KeychainError) -> Kept {
        switch Self.connection(to: socketPath, as: identity) {
        case .success(let kept): return kept
        case .failure(let error): throw KeychainError(WireFailure(connecting: error, socket: socketPath))
        }
    }

    /// `connect(as:)` on whichever thread runs it.
    private static func connection(to socketPath: String, as identity: Identity) -> Result<Kept, WireError> {
        WireSocket.connect(path: socketPath).map { Kept(reader: WireReader(fd: $0), identity: Identity.current == identity ? identity : nil) }
    }

    private func failure(_ error: WireError) -> KeychainError {
        KeychainError(WireFailure(exchanging: error, socket: socketPath, replyTimeout: Self.replyTimeout))
    }

    /// Where the next exchange waits for its reply, counted there until `leaveWaitingPlace`: the global
    /// queue (true) while it has room, else a thread of its own while fewer than `ownThreadWaits` do,
    /// else the global queue after all (it waits for one of its threads, as every exchange did before).
    private static func takeWaitingPlace() -> Bool {
        guard waitingOnGlobalQueue.wrappingAdd(1, ordering: .relaxed).newValue > globalQueueWaits else { return true }
        guard waitingOnOwnThread.wrappingAdd(1, ordering: .relaxed).newValue <= ownThreadWaits else {
            waitingOnOwnThread.wrappingSubtract(1, ordering: .relaxed)
            return true
        }
        waitingOnGlobalQueue.wrappingSubtract(1, ordering: .relaxed)
        return false
    }

    private static func leaveWaitingPlace(_ onGlobalQueue: Bool) {
        if onGlobalQueue { waitingOnGlobalQueue.wrappingSubtract(1, ordering: .relaxed) } else {
            waitingOnOwnThread.wrappingSubtract(1, ordering: .relaxed)
        }
    }

    /// Sends `message` and waits for the daemon's next message (`WireReader.exchange`).
    private func exchange(_ reader: WireReader, _ message: WireMessage) async throws(KeychainError) -> WireMessage {
        try await blocking { () throws(WireError) in try reader.exchange(message, idle: Self.replyTimeout, stall: Self.stallTimeout) }
    }

    /// `exchange` of a call's first message; nil when the daemon had closed the connection unread and
    /// said nothing (`WireReader.exchangeKept` on one from the pool, `exchangeNew` on a new one).
    private func exchangeUnlessUnread(_ connection: Kept, _ message: WireMessage) async throws(KeychainError) -> WireMessage? {
        let (reader, reused) = (connection.reader, connection.reused)
        return try await blocking { () throws(WireError) in
            reused ? try reader.exchangeKept(message, idle: Self.replyTimeout, stall: Self.stallTimeout)
                : try reader.exchangeNew(message, idle: Self.replyTimeout, stall: Self.stallTimeout)
        }
    }

    /// A new connection and `message` sent on it at once, both on the thread that waits for the reply
    /// (so no wait for a thread comes between them): for a request an earlier connection did not deliver.
    private func connectAndExchange(as identity: Identity, _ message: WireMessage) async throws(KeychainError) -> (Kept, WireMessage) {
        let socketPath = socketPath
        let made: Result<(Kept, Result<WireMessage, WireError>), WireError> = try await blocking { () throws(WireError) in
            Self.connection(to: socketPath, as: identity).map { kept in
                (kept, Result { () throws(WireError) in try kept.reader.exchange(message, idle: Self.replyTimeout, stall: Self.stallTimeout) })
            }
        }
        switch made {
        case .failure(let error): throw KeychainError(WireFailure(connecting: error, socket: socketPath))
        case .success((let kept, .success(let reply))): return (kept, reply)
        case .success((let kept, .failure(let error))):
            close(kept.reader.fd)
            throw failure(error)
        }
    }

    /// Runs an exchange, never on Swift's shared pool's task: on the caller's thread when it is a thread
    /// of its own (a synchronous caller's, such as the vault's: `SerialThreadExecutor.isOwnThread`), else
    /// one hop to a thread that waits for the reply, and back. The hop goes to Dispatch's global queue
    /// while fewer than `globalQueueWaits` of this process's exchanges wait there (the cheapest: the
    /// thread that ran the task is free to take it, no thread switch), and beyond that to a serial
    /// queue of its own, which Dispatch's overcommitting threads run (one is started when none is
    /// free): so 16 callers have 16 requests in flight, not one per processor, and the global queue's
    /// threads stay free for the process's tasks. A thread of this process waiting in epoll for every
    /// caller's reply, tried instead, switched threads more often per read (docs/performance.md,
    /// "Where a read through keychaind goes").
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws(WireError) -> T) async throws(KeychainError) -> T {
        if SerialThreadExecutor.isOwnThread {
            do { return try body() } catch { throw failure(error) }
        }
        hops.count.add(1, ordering: .relaxed)
        let hops = hops, onGlobalQueue = Self.takeWaitingPlace()
        let result: Result<T, WireError> = await withCheckedContinuation { continuation in
            (onGlobalQueue ? DispatchQueue.global() : DispatchQueue(label: "keychain.exchange")).async {
                hops.waiting(onGlobalQueue, 1)
                let result = Result { () throws(WireError) in try body() }
                hops.waiting(onGlobalQueue, -1)
                Self.leaveWaitingPlace(onGlobalQueue)
                continuation.resume(returning: result)
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

/// keychaind as a `KeychainService`: each call is one request (the storage's options, encoded once
/// when the storage was made, travel with each storage call).
extension DaemonClient: KeychainService {
    private func call(_ op: WireOp, _ storage: StorageRef, key: String? = nil, authenticator: (any Authenticator)? = nil,
                      _ build: (inout WireMessage) -> Void = { _ in }) async throws(KeychainError) -> WireMessage {
        try await call(op, { message in
            message.add(WireTag.options, storage.wireOptions)
            message.add(WireTag.key, key)
            build(&message)
        }, authenticator: authenticator)
    }

    func setItem(_ key: String, _ value: SecureBytes, options call: SetItemOptions?, in storage: StorageRef) async throws(KeychainError) {
        _ = try await self.call(.setItem, storage, key: key) { message in
            message.add(WireTag.value, value.wireBytes)
            call?.add(to: &message)
        }
    }

    func getItem(_ key: String, options call: GetItemOptions?, in storage: StorageRef,
                 authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes? {
        var reply = try await self.call(.getItem, storage, key: key, authenticator: authenticator) { message in
            message.add(WireTag.prompt, call?.prompt?.wire.encoded())
            message.add(WireTag.attempts, authenticator.map { UInt64(max(1, $0.attemptsPerRead)) })
        }
        defer { reply.wipe() }
        return reply.bytes(WireTag.resultBytes).map { SecureBytes(copying: $0) }
    }

    /// One `getItems` request per `WireList.maxKeys` keys, and again for the keys a reply left out
    /// (past its budget); a daemon answers its warm reads at once. A keychaind that predates
    /// `getItems` answers it as an unknown request: then one `getItem` a key.
    func getItems(_ keys: [String], in storage: StorageRef,
                  authenticator: (any Authenticator)?) async throws(KeychainError) -> [ItemRead] {
        var reads: [ItemRead] = []
        while reads.count < keys.count {
            let asked = keys[reads.count...].prefix(WireList.maxKeys)
            var reply: WireMessage
            do throws(KeychainError) {
                reply = try await batch(asked, in: storage, authenticator: authenticator)
            } catch {
                guard Self.isUnknown(error, .getItems) else { throw error }
                for key in keys[reads.count...] {
                    do throws(KeychainError) {
                        reads.append(.success(try await getItem(key, options: nil, in: storage, authenticator: authenticator)))
                    } catch {
                        reads.append(.failure(error))
                    }
                }
                return reads
            }
            defer { reply.wipe() }
            do throws(WireError) {
                var outcomes = try WireList.decode(reply.bytes(WireTag.resultItems) ?? [])
                defer { for index in outcomes.indices { outcomes[index].wipe() } }
                guard (1...asked.count).contains(outcomes.count) else {
                    throw WireError(.malformed, "\(outcomes.count) outcomes for \(asked.count) keys")
                }
                for outcome in outcomes { reads.append(try Self.read(outcome)) }
            } catch {
                throw failure(error)
            }
        }
        return reads
    }

    private func batch(_ keys: ArraySlice<String>, in storage: StorageRef,
                       authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        try await call(.getItems, storage, authenticator: authenticator) { message in
            message.add(WireTag.attempts, authenticator.map { UInt64(max(1, $0.attemptsPerRead)) })
            message.add(WireTag.keys, WireList.encode(keys.map { Array($0.utf8) }))
        }
    }

    /// Whether `error` is a keychaind's answer to a request it does not know (`DaemonRequestHandler`'s,
    /// as a keychaind older than `op` says it).
    private static func isUnknown(_ error: KeychainError, _ op: WireOp) -> Bool {
        error.code == .invalidArgument && error.message.hasPrefix("The keychain service does not know request \(op.rawValue):")
    }

    /// One outcome of a `getItems` reply: the reply `getItem` would have had.
    private static func read(_ outcome: [UInt8]) throws(WireError) -> ItemRead {
        var message = try WireMessage.decode(outcome)
        defer { message.wipe() }
        switch message.kind {
        case WireKind.ok: return .success(message.bytes(WireTag.resultBytes).map { SecureBytes(copying: $0) })
        case WireKind.error: return .failure(try KeychainError(decoding: message))
        default: throw WireError(.malformed, "an outcome of kind \(message.kind)")
        }
    }

    /// Every read is a request: the daemon answers a warm one at once.
    func warmItem(_ key: String, in storage: StorageRef) -> WarmRead? { nil }

    func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool {
        try await call(.hasItem, storage, key: key).resultBool()
    }
    func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError) {
        _ = try await call(.removeItem, storage, key: key)
    }
    func clear(_ storage: StorageRef) async throws(KeychainError) { _ = try await call(.clear, storage) }
    func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await call(.allKeys, storage).result([String].self)
    }

    func allServices(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await call(.allServices, storage).result([String].self)
    }
    func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo? {
        let reply = try await call(.itemInfo, storage, key: key)
        return reply.bytes(WireTag.resultJSON) == nil ? nil : try reply.result(ItemInfo.self)
    }
    func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck {
        try await call(.storageCanUse, storage) { $0.add(WireTag.accessControl, value.rawValue) }.result(AccessControlCheck.self)
    }

    func endWindows(in storage: StorageRef) async throws(KeychainError) { _ = try await call(.endWindows, storage) }

    func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation {
        let reply = try await call(.attestKey, storage) { $0.add(WireTag.nonce, nonce) }
        guard let document = reply.bytes(WireTag.resultBytes) else {
            throw KeychainError(.internal, "The keychain service's reply has no key attestation")
        }
        return try KeyAttestation(json: Data(document))
    }

    func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {
        _ = try await call(.enrollFinger) { $0.add(WireTag.finger, name); $0.add(WireTag.passcode, passcode?.wireBytes) }
    }
    func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await call(.removeFinger) { $0.add(WireTag.finger, name); $0.add(WireTag.passcode, passcode?.wireBytes) }.resultBool()
    }
    func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await call(.deleteReader) { $0.add(WireTag.passcode, passcode?.wireBytes) }.resultBool()
    }
    func enrolledFingers() async throws(KeychainError) -> [String] { try await call(.enrolledFingers).result([String].self) }
    func biometryTypes() -> [BiometryType] {
        callBlocking(.biometryTypes).flatMap { try? $0.result([BiometryType].self) } ?? []
    }
    func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        try await call(.deviceCanUse) { $0.add(WireTag.accessControl, value.rawValue) }.result(AccessControlCheck.self)
    }
    func initialize() async throws(KeychainError) -> DeviceStatus { try await call(.initialize).result(DeviceStatus.self) }
    func status() async throws(KeychainError) -> DeviceStatus { try await call(.status).result(DeviceStatus.self) }
    func resetTokenPINTries() async throws(KeychainError) { _ = try await call(.resetTokenPINTries) }
    func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        let reply = try await call(.tokenStatus)
        return reply.bytes(WireTag.resultJSON) == nil ? nil : try reply.result(TokenStatus.self)
    }
    func unlock(passcode: SecureBytes?) async throws(KeychainError) {
        _ = try await call(.unlock) { $0.add(WireTag.passcode, passcode?.wireBytes) }
    }
    func lock() async throws(KeychainError) { _ = try await call(.lock) }
    func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError) {
        switch (old, new) {
        case (nil, let new?): _ = try await call(.setPasscode) { $0.add(WireTag.newPasscode, new.wireBytes) }
        case (let old?, let new?):
            _ = try await call(.changePasscode) { $0.add(WireTag.passcode, old.wireBytes); $0.add(WireTag.newPasscode, new.wireBytes) }
        case (let old?, nil): _ = try await call(.removePasscode) { $0.add(WireTag.passcode, old.wireBytes) }
        case (nil, nil): throw KeychainError.invalidArgument("Invalid passcode change: neither the current passcode nor a new one")
        }
    }
    func resetPasscodeTries() async throws(KeychainError) { _ = try await call(.resetPasscodeTries) }
    func takeTPMCommandCount() async -> Int {
        (try? await call(.takeTPMCommandCount).uint(WireTag.resultNumber)).flatMap { $0 }.map(Int.init) ?? 0
    }
    func dropCaches() async { _ = try? await call(.dropCaches) }
    func identity() async throws(KeychainError) -> DeviceIdentity {
        guard let document = try await call(.identity).bytes(WireTag.resultBytes) else {
            throw KeychainError(.internal, "The keychain service's reply has no identity document")
        }
        return try DeviceIdentity(json: Data(document))
    }
    /// keychaind chooses the scope: the caller's uid (or the system's credentials for a credential bundle).
    func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?, in scope: ItemScope) async throws(KeychainError) -> ImportOutcome {
        let document = [UInt8](bundle.json())
        guard document.count < Wire.maxMessage - (64 << 10) else {
            throw KeychainError.invalidArgument("This bundle (\(document.count) bytes) is larger than one request to the keychain service can "
                                                + "carry: import it where the store is (keychainctl --direct --store <the service's store> import)")
        }
        return try await call(.importBundle) { $0.add(WireTag.bundle, document); $0.add(WireTag.passcode, passcode?.wireBytes) }
            .result(ImportOutcome.self)
    }
}
