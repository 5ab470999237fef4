import Foundation
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import Testing
@testable import Keychain

/// Many calls on one keychaind connection: the daemon keeps the decoding of a connection's last
/// options (a client sends the same bytes with every call of a storage), never a decision.
@Suite("keychaind: one connection, many calls", .offThePool)
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
}
