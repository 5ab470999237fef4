import KeychainCore
import KeychainEngine
import KeychainBasics
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
    #if DEBUG
    /// This client's exchanges that hopped to a blocking thread: tests read it, release builds have none.
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
    #endif
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

    /// One call: `call`'s request with `fields` (released before the request is wiped, so a secret in
    /// them is wiped in place), the daemon's prompts answered by `authenticator`, then its reply's fields.
    func call<Request, Reply>(_ call: WireCall<Request, Reply>, _ fields: consuming Request,
                              authenticator: (any Authenticator)? = nil) async throws(KeychainError) -> Reply {
        var request = call.request(fields)
        _ = consume fields
        defer { request.wipe() }
        // The reply's buffers are this call's alone; those the fields do not keep (a batch's list) are wiped here.
        var reply = try await exchange(request, authenticator: authenticator)
        defer { reply.wipe() }
        do { return try call.reply(from: reply) } catch { throw failure(error) }
    }

    /// `request` and the daemon's messages until its reply: its ok message, or the error it threw.
    private func exchange(_ request: WireMessage, authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        // Read once a call (two system calls): the connection's identity is the one it was made with.
        let identity = Identity.current
        var connection = try await checkOut(as: identity)
        // Back to the pool only after a complete exchange; on any failure the stream may be out of step.
        var complete = false
        defer {
            // Bytes past the reply: the daemon said more than it was asked, the stream is out of step.
            if complete && !connection.reader.hasPending { checkIn(connection) } else { close(connection.reader.fd) }
        }
        let first: WireMessage
        if let served = try await exchangeUnlessUnread(connection, request) {
            first = served
        } else {
            // Closed by the daemon before it read the request: a kept one while idle (its idle timeout, a
            // restart), a new one that waited past the idle timeout for a thread to wait on. The request was
            // not served: once more, on a connection made where the request goes at once.
            let (fresh, served) = try await connectAndExchange(as: identity, request)
            close(connection.reader.fd)
            (connection, first) = (fresh, served)
        }
        let reader = connection.reader
        let reply = try await WireReply.awaiting(first, unreadable: failure) { prompt async throws(KeychainError) in
            var answer = try await answer(prompt, authenticator: authenticator)
            defer { answer.wipe() }
            return try await exchange(reader, answer)
        }
        if case .unknown = reply {} else { complete = true }
        return try (consume reply).result(thrown: KeychainError.init, unknown: KeychainError.init)
    }

    /// A call without fields and without prompts, for the API's few synchronous calls; nil on any failure.
    func callBlocking<Reply>(_ call: WireCall<WireNone, Reply>) -> Reply? {
        guard case .success(let fd) = WireSocket.connect(path: socketPath) else { return nil }
        defer { close(fd) }
        guard (try? WireSocket.send(fd, call.request(WireNone()))) != nil,
              let reply = try? WireSocket.receive(fd, idle: Self.replyTimeout, stall: Self.stallTimeout),
              reply.kind == WireKind.ok else { return nil }
        return try? call.reply(from: reply)
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
        #if DEBUG
        hops.count.add(1, ordering: .relaxed)
        let hops = hops
        #endif
        let onGlobalQueue = Self.takeWaitingPlace()
        // Handed over through a lock: the connection's reader and the reply were written on that thread.
        let result: Result<T, WireError> = await handedOver { handover in
            (onGlobalQueue ? DispatchQueue.global() : DispatchQueue(label: "keychain.exchange")).async {
                #if DEBUG
                hops.waiting(onGlobalQueue, 1)
                #endif
                let result = Result { () throws(WireError) in try body() }
                #if DEBUG
                hops.waiting(onGlobalQueue, -1)
                #endif
                Self.leaveWaitingPlace(onGlobalQueue)
                handover.deliver(result)
            }
        }
        switch result {
        case .success(let value): return value
        case .failure(let error): throw failure(error)
        }
    }
}

extension WireJSONResult {
    /// The result decoded, or `INTERNAL` naming what was missing.
    func decoded<T: Decodable>(_ type: T.Type) throws(KeychainError) -> T {
        guard let value = try decodedIfPresent(type) else { throw KeychainError(.internal, "The keychain service's reply has no result") }
        return value
    }
    /// nil for a reply without a result (no item, no token).
    func decodedIfPresent<T: Decodable>(_ type: T.Type) throws(KeychainError) -> T? {
        do { return try WireJSON.decode(type, json) } catch {
            throw KeychainError(.internal, "The keychain service's reply does not decode: \(error.detail)")
        }
    }
}

extension WireFlag {
    func result() throws(KeychainError) -> Bool {
        guard let value else { throw KeychainError(.internal, "The keychain service's reply has no boolean result") }
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
    private func storage(_ storage: StorageRef, _ key: String? = nil) -> WireStorage { WireStorage(options: storage.wireOptions, key: key) }

    func setItem(_ key: String, _ value: SecureBytes, options call: SetItemOptions?, in storage: StorageRef) async throws(KeychainError) {
        _ = try await self.call(.setItem, WireSetItem(storage: self.storage(storage, key), value: value.wireBytes, options: call?.wire))
    }

    func getItem(_ key: String, options call: GetItemOptions?, in storage: StorageRef,
                 authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes? {
        var reply = try await self.call(.getItem, WireGetItem(storage: self.storage(storage, key), prompt: call?.prompt?.wire,
                                                              attempts: authenticator.map { UInt64(max(1, $0.attemptsPerRead)) }),
                                        authenticator: authenticator)
        defer { reply.wipe() }
        return reply.bytes.map { SecureBytes(copying: $0) }
    }

    /// One `getItems` request per `WireList.maxKeys` keys, and again for the keys a reply left out
    /// (past its budget); a daemon answers its warm reads at once. A keychaind that predates
    /// `getItems` answers it as an unknown request: then one `getItem` a key.
    func getItems(_ keys: [String], in storage: StorageRef,
                  authenticator: (any Authenticator)?) async throws(KeychainError) -> [ItemRead] {
        var reads: [ItemRead] = []
        while reads.count < keys.count {
            let asked = Array(keys[reads.count...].prefix(WireList.maxKeys))
            var reply: WireOutcomes
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
                guard (1...asked.count).contains(reply.outcomes.count) else {
                    throw WireError(.malformed, "\(reply.outcomes.count) outcomes for \(asked.count) keys")
                }
                for outcome in reply.outcomes { reads.append(try Self.read(outcome)) }
            } catch {
                throw failure(error)
            }
        }
        return reads
    }

    private func batch(_ keys: [String], in storage: StorageRef,
                       authenticator: (any Authenticator)?) async throws(KeychainError) -> WireOutcomes {
        try await call(.getItems, WireGetItems(storage: self.storage(storage), attempts: authenticator.map { UInt64(max(1, $0.attemptsPerRead)) },
                                               keys: keys), authenticator: authenticator)
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
        case WireKind.ok:
            var value = try WireCall.getItem.reply(from: message)
            defer { value.wipe() }
            return .success(value.bytes.map { SecureBytes(copying: $0) })
        case WireKind.error: return .failure(try KeychainError(decoding: message))
        default: throw WireError(.malformed, "an outcome of kind \(message.kind)")
        }
    }

    /// Every read is a request: the daemon answers a warm one at once.
    func warmItem(_ key: String, in storage: StorageRef) -> WarmRead? { nil }

    func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool {
        try await call(.hasItem, self.storage(storage, key)).result()
    }
    func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError) {
        _ = try await call(.removeItem, self.storage(storage, key))
    }
    func clear(_ storage: StorageRef) async throws(KeychainError) { _ = try await call(.clear, self.storage(storage)) }
    func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await call(.allKeys, self.storage(storage)).decoded([String].self)
    }

    func allServices(in storage: StorageRef) async throws(KeychainError) -> [String] {
        try await call(.allServices, self.storage(storage)).decoded([String].self)
    }
    func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo? {
        try await call(.itemInfo, self.storage(storage, key)).decodedIfPresent(ItemInfo.self)
    }
    func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck {
        try await call(.storageCanUse, WireCanUse(storage: self.storage(storage), accessControl: value.rawValue)).decoded(AccessControlCheck.self)
    }

    func endWindows(in storage: StorageRef) async throws(KeychainError) { _ = try await call(.endWindows, self.storage(storage)) }

    func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation {
        guard let document = try await call(.attestKey, WireAttestKey(storage: self.storage(storage), nonce: nonce)).bytes else {
            throw KeychainError(.internal, "The keychain service's reply has no key attestation")
        }
        return try KeyAttestation(json: Data(document))
    }

    func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {
        _ = try await call(.enrollFinger, WireDevice(finger: name, passcode: passcode?.wireBytes))
    }
    func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await call(.removeFinger, WireDevice(finger: name, passcode: passcode?.wireBytes)).result()
    }
    func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool {
        try await call(.deleteReader, WireDevice(passcode: passcode?.wireBytes)).result()
    }
    func enrolledFingers() async throws(KeychainError) -> [String] { try await call(.enrolledFingers, WireNone()).decoded([String].self) }
    func biometryTypes() -> [BiometryType] {
        callBlocking(.biometryTypes).flatMap { try? $0.decoded([BiometryType].self) } ?? []
    }
    func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        try await call(.deviceCanUse, WireCanUse(accessControl: value.rawValue)).decoded(AccessControlCheck.self)
    }
    func initialize() async throws(KeychainError) -> DeviceStatus { try await call(.initialize, WireNone()).decoded(DeviceStatus.self) }
    func status() async throws(KeychainError) -> DeviceStatus { try await call(.status, WireNone()).decoded(DeviceStatus.self) }
    func resetTokenPINTries() async throws(KeychainError) { _ = try await call(.resetTokenPINTries, WireNone()) }
    func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        try await call(.tokenStatus, WireNone()).decodedIfPresent(TokenStatus.self)
    }
    func unlock(passcode: SecureBytes?) async throws(KeychainError) {
        _ = try await call(.unlock, WireDevice(passcode: passcode?.wireBytes))
    }
    func lock() async throws(KeychainError) { _ = try await call(.lock, WireNone()) }
    func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError) {
        let call: WireCall<WireDevice, WireNone>
        switch (old, new) {
        case (nil, _?): call = .setPasscode
        case (_?, _?): call = .changePasscode
        case (_?, nil): call = .removePasscode
        case (nil, nil): throw KeychainError.invalidArgument("Invalid passcode change: neither the current passcode nor a new one")
        }
        _ = try await self.call(call, WireDevice(passcode: old?.wireBytes, newPasscode: new?.wireBytes))
    }
    func resetPasscodeTries() async throws(KeychainError) { _ = try await call(.resetPasscodeTries, WireNone()) }
    func takeTPMCommandCount() async -> Int {
        (try? await call(.takeTPMCommandCount, WireNone()).value).flatMap { $0 }.map(Int.init) ?? 0
    }
    func dropCaches() async { _ = try? await call(.dropCaches, WireNone()) }
    func identity() async throws(KeychainError) -> DeviceIdentity {
        guard let document = try await call(.identity, WireNone()).bytes else {
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
        return try await call(.importBundle, WireImport(bundle: document, passcode: passcode?.wireBytes)).decoded(ImportOutcome.self)
    }
}
