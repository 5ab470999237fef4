import Foundation
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import Testing
@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon

/// Many calls on one keychaind connection: the daemon keeps the decoding of a connection's last
/// options (a client sends the same bytes with every call of a storage), never a decision.
///
/// One test at a time: the stopped-daemon tests fill this process's places to wait for a reply
/// (`DaemonClient.globalQueueWaits`, `ownThreadWaits`: counts of the whole process, not of a client),
/// so beside each other one's reads would find the places the other holds, and wait for threads
/// Dispatch starts only after a while, or land where its expectations say they must not.
@Suite("keychaind: one connection, many calls", .offThePool, .serialized)
struct DaemonConnectionTests {
    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM()
        daemon = try KeychainDaemon(tpm: tpm)
    }

    /// getItem on `fd` with these options; the reply's value, or its error code.
    func get(_ fd: Int32, _ options: KeychainOptions, _ key: String) throws -> (value: String?, error: String?) {
        var request = WireMessage(kind: WireOp.getItem.rawValue)
        request.add(WireTag.options, options.wire.encoded())
        request.add(WireTag.key, key)
        try WireSocket.send(fd, request)
        let reply = try WireSocket.receive(fd, idle: 60, stall: 60)
        if reply.kind == WireKind.error { return (nil, try reply.string(WireTag.errorCode)) }
        return (reply.bytes(WireTag.resultBytes).map { String(decoding: $0, as: UTF8.self) }, nil)
    }

    func connect() throws -> Int32 {
        switch WireSocket.connect(path: daemon.socket) {
        case .success(let fd): return fd
        case .failure(let error): throw error
        }
    }

    @Test func eachCallReadsItsOwnOptionsService() async throws {
        let configuration = daemon.configuration()
        try await createKeychain(.init(service: "a"), configuration: configuration).setItem("k", "in a")
        try await createKeychain(.init(service: "b"), configuration: configuration).setItem("k", "in b")
        let fd = try connect()
        defer { close(fd) }
        for service in ["a", "a", "b", "a", "b", "b"] {
            #expect(try get(fd, .init(service: service), "k").value == "in \(service)")
        }
        #expect(try get(fd, .init(service: "c"), "k") == (nil, nil))
    }

    /// The same options bytes again on the same connection: the access group is checked again (an
    /// edit of groups.d takes effect at the next call), and so is the lock state.
    @Test func theSameOptionsAgainAreCheckedAgain() async throws {
        let configuration = daemon.configuration()
        try daemon.setGroup("team", ["uid 0"])
        let shared = KeychainOptions(service: "vpn", accessGroup: "team")
        try await createKeychain(shared, configuration: configuration).setItem("psk", "shared")
        let device = KeychainDevice(configuration: configuration)
        try await device.setPasscode(SecureBytes(copying: Array("2468".utf8)))
        let unlocked = KeychainOptions(service: "mail", accessible: .whenUnlocked)
        try await createKeychain(unlocked, configuration: configuration).setItem("token", "t")

        let fd = try connect()
        defer { close(fd) }
        #expect(try get(fd, shared, "psk").value == "shared")
        try daemon.setGroup("team", ["uid 4242"])
        #expect(try get(fd, shared, "psk").error == KeychainError.Code.accessDenied.rawValue)

        #expect(try get(fd, unlocked, "token").value == "t")
        try await device.lock()
        #expect(try get(fd, unlocked, "token").error == KeychainError.Code.interactionNotAllowed.rawValue)
    }

    /// A synchronous caller's task (one that prefers a thread of its own, as the vault's calls do)
    /// waits for keychaind's replies on that thread, with no hop to a blocking thread and back; a
    /// task on Swift's shared pool hops for every exchange (the pool's threads never block on the socket).
    @Test func aCallerOnAThreadOfItsOwnWaitsForTheRepliesThereAndThePoolHops() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        let client = try #require(storage.backing as? DaemonClient)
        try await storage.setItem("k", "v")
        let thread = SerialThreadExecutor(name: "a caller's own thread")
        defer { thread.stop() }
        let before = client.hops.count.load(ordering: .relaxed)
        let values = try await Task(executorPreference: thread) { () async throws -> [String?] in
            var values: [String?] = []
            for _ in 0..<20 { values.append(try await storage.getItem("k")) }
            return values
        }.value
        #expect(values == Array(repeating: "v", count: 20))
        #expect(client.hops.count.load(ordering: .relaxed) == before)
        for _ in 0..<20 { #expect(try await storage.getItem("k") == "v") }
        #expect(client.hops.count.load(ordering: .relaxed) == before + 20)
    }

    /// `callers` reads by tasks of Swift's pool with keychaind stopped (SIGSTOP), so that each waits for its
    /// reply: where this client's exchanges waited once `enough` of them did (the deadline only bounds a
    /// failure); then, keychaind going on, every read's value.
    func readsWaitingOnAStoppedDaemon(_ callers: Int, enough: Int) async throws -> (onGlobalQueue: Int, onOwnThread: Int) {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        let client = try #require(storage.backing as? DaemonClient)
        try await storage.setItem("k", "v")
        let pid = daemon.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        var stopped = true
        defer { if stopped { kill(pid, SIGCONT) } }
        let reads = (0..<callers).map { _ in
            Task(executorPreference: globalConcurrentExecutor) { try await storage.getItem("k") }
        }
        let waiting = { (onGlobalQueue: client.hops.waitingOnGlobalQueue.load(ordering: .relaxed),
                         onOwnThread: client.hops.waitingOnOwnThread.load(ordering: .relaxed)) }
        let deadline = ContinuousClock.now + .seconds(60)
        while waiting().onGlobalQueue + waiting().onOwnThread < enough, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        let seen = waiting()
        #expect(seen.onGlobalQueue + seen.onOwnThread >= enough, "\(seen) of \(callers) reads waiting for keychaind's reply")
        #expect(kill(pid, SIGCONT) == 0)
        stopped = false
        for read in reads { #expect(try await read.value == "v") }
        #expect(waiting() == (0, 0))
        return seen
    }

    /// More of the pool's callers at once than Dispatch's global queue has threads: the exchanges beyond
    /// `globalQueueWaits` wait for their replies on threads of their own, so every request is in flight
    /// at once (not one per processor, the rest queued behind them for a thread).
    @Test func thePoolsCallersBeyondTheProcessorsWaitOnThreadsOfTheirOwn() async throws {
        let processors = ProcessInfo.processInfo.activeProcessorCount
        let seen = try await readsWaitingOnAStoppedDaemon(processors + 4, enough: processors + 4)
        // Dispatch's global queue has a thread per processor (it adds more only after its threads
        // have blocked for a while): no more exchanges than that wait there.
        #expect(seen.onGlobalQueue <= processors && seen.onOwnThread >= 4, "\(seen)")
    }

    /// No more than `ownThreadWaits` of a process's exchanges wait on threads of their own (a thread
    /// each): with keychaind stopped and more callers than that and the processors together, the rest
    /// wait for the global queue's threads, as every exchange did before.
    @Test func atMostSixtyFourExchangesWaitOnThreadsOfTheirOwn() async throws {
        #expect(DaemonClient.ownThreadWaits == 64)
        let processors = ProcessInfo.processInfo.activeProcessorCount
        let seen = try await readsWaitingOnAStoppedDaemon(processors + 64 + 4, enough: processors + 64)
        #expect(seen.onOwnThread <= 64, "\(seen)")
    }

    /// keychaind closes a connection idle past --idle-timeout; the library's kept connection is then
    /// dead, and the next call (a write, which must not be sent twice) goes on a new one, once.
    ///
    /// The calls run on a thread of their own, which makes each exchange there (no hop): a pool task's
    /// exchange waits for a place when this process's others hold them all, as the stopped-daemon tests
    /// of this suite make them do at the same time, and a wait past the 1 s idle timeout between the
    /// new connection and its request had the daemon close that one too (a CI run, EPIPE).
    @Test func aCallAfterTheDaemonClosedTheKeptConnectionGoesOnANewOne() async throws {
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--idle-timeout", "1"])
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        let client = try #require(storage.backing as? DaemonClient)
        let thread = SerialThreadExecutor(name: "a caller whose kept connection the daemon closes")
        defer { thread.stop() }
        try await Task(executorPreference: thread) { try await Self.callAfterTheDaemonClosedTheKeptConnection(storage, daemon) }.value
        #expect(client.hops.count.load(ordering: .relaxed) == 0, "an exchange hopped off the caller's own thread")
    }

    private static func callAfterTheDaemonClosedTheKeptConnection(_ storage: Keychain, _ daemon: KeychainDaemon) async throws {
        try await storage.setItem("k", "1")
        #expect(try await storage.getItem("k") == "1")
        // A connection made after the kept one went idle: once the daemon has closed it, the kept one is closed too.
        let later = try { () throws -> Int32 in
            switch WireSocket.connect(path: daemon.socket) {
            case .success(let fd): return fd
            case .failure(let error): throw error
            }
        }()
        defer { close(later) }
        var entry = pollfd(fd: later, events: Int16(POLLIN) | 0x2000, revents: 0)  // POLLRDHUP
        #expect(poll(&entry, 1, 30_000) == 1, "keychaind did not close an idle connection")
        try await storage.setItem("k", "2")
        #expect(try await storage.getItem("k") == "2")
    }

    /// A connection is the daemon's record of who made it (SO_PEERCRED, at connect): a thread that
    /// changed its effective uid never reuses one made as root, nor root one made as the other uid.
    /// The uid changes for one thread only (the raw setresuid system call; glibc's would change every
    /// thread of the test process), and the calls run on that thread.
    @Test(.enabled(if: geteuid() == 0, "changing the effective uid needs root"))
    func aCallerWhoseEffectiveUidChangedGetsItsOwnConnection() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        try await storage.setItem("k", "root's")
        let thread = SerialThreadExecutor(name: "a caller that changes its euid")
        defer { thread.stop() }
        let values = try await Task(executorPreference: thread) { () async throws -> [String?] in
            let nobody: UInt32 = 65534
            var values: [String?] = [try await storage.getItem("k")]
            #expect(threadSetEffectiveUID(nobody) == 0 && geteuid() == nobody)
            do {
                values.append(try await storage.getItem("k"))
            } catch {
                _ = threadSetEffectiveUID(0)
                throw error
            }
            #expect(threadSetEffectiveUID(0) == 0 && geteuid() == 0)
            values.append(try await storage.getItem("k"))
            return values
        }.value
        #expect(values == ["root's", nil, "root's"])
    }
}

/// setresuid(-1, uid, -1) for the calling thread alone: the kernel keeps credentials per thread, and
/// only glibc's wrapper applies them to every thread. Through `syscall`, which Swift does not import
/// (it is variadic): its integer arguments pass in the same registers either way.
private func threadSetEffectiveUID(_ uid: UInt32) -> Int {
    typealias Syscall = @convention(c) (Int, UInt32, UInt32, UInt32) -> Int
    #if arch(x86_64)
    let setresuid = 117  // __NR_setresuid (Glibc's SYS_setresuid is not imported)
    #elseif arch(arm64)
    let setresuid = 147
    #endif
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "syscall") else { return -1 }
    return unsafeBitCast(symbol, to: Syscall.self)(setresuid, UInt32.max, uid, UInt32.max)
}
