import Foundation
@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Synchronization
import Testing

#if DEBUG
/// keychaind's quota measures the caller's namespace (a range scan of its items and keys) before the
/// TPM work, so a write over the quota costs no TPM command. Before, the write's transaction scanned
/// it again: two scans per write. Now the transaction takes the first measure when nothing was
/// committed since (the store's writer saw no other connection's commit and made no change of its
/// own): one scan per write. keychaind's engine and request handler in this process, on a real
/// swtpm; the scans counted in debug builds (`StoreUsage.scans`, this process's: no other suite runs
/// keychaind's engine in the test process).
@Suite(.offThePool) struct QuotaScanTests {
    @Test func aWriteThroughKeychaindScansItsNamespaceOnce() async throws {
        let tpm = try SoftwareTPM()
        let server = DaemonServer(configuration: tpm.configuration(), groups: AccessGroups(directory: nil))
        let nobody = Peer(pid: 1, uid: 65534, gid: 65534, groups: [])
        func set(_ service: String, _ key: String) async throws {
            var request = WireMessage(kind: WireOp.setItem.rawValue)
            request.add(WireTag.options, KeychainOptions(service: service).wire.encoded())
            request.add(WireTag.key, key)
            request.add(WireTag.value, Array("v".utf8))
            let reply = await server.handler.respond(to: try WireMessage.decode(request.encoded()), from: nobody,
                                                     options: Connection().options, authenticator: { _ in fatalError("no prompt here") })
            #expect(reply.kind == WireKind.ok, "\(service)/\(key): \((try? KeychainError(decoding: reply)).map(String.init(describing:)) ?? "?")")
        }
        func scans(_ write: () async throws -> Void) async throws -> Int {
            let before = StoreUsage.scans.load(ordering: .relaxed)
            try await write()
            return StoreUsage.scans.load(ordering: .relaxed) - before
        }
        // The store's first write also sets the TPM up (the SRK, the device's lock state), committed
        // between its measure and its transaction: that one measures again, as it must.
        let first = try await scans { try await set("first", "k") }
        print("the store's first write scanned its namespace \(first) times")
        var counts = [try await scans { try await set("second", "k") }]  // a new service: its key sealed on the TPM
        for index in 0..<8 { counts.append(try await scans { try await set("second", "k\(index)") }) }  // its key kept
        #expect(counts == Array(repeating: 1, count: 9), "scans per write: \(counts)")
    }
}
#endif
