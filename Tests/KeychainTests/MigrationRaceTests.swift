import Foundation
import KeychainTestSupport
import Synchronization
import Testing

extension FirstFormatMigrationTests {
    /// Four processes open one first-format store at once: one migrates it (schema, then the token
    /// namespace, each in one BEGIN IMMEDIATE transaction that checks again inside), the others wait
    /// and see the migrated store; every one lists the service's items, none twice, none lost.
    @Test func processesOpeningAFirstFormatStoreAtOnceAllSeeItMigrated() throws {
        let t = try TokenBackendTests.Token()
        try Self.writeFirstFormatNoneItems(t, ["k": "from the token", "only": "token only"], modified: 1)
        #expect(try t.cli(["set", "svc", "tpm-only", "--accessible", "always"], input: Array("tpm only".utf8)).status == 0)
        try Self.downgradeToFirstFormat(t.store)
        let outputs = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            let listed = (try? t.cli(["ls", "svc"])).map { $0.status == 0 ? String(decoding: $0.stdout, as: UTF8.self) : "exit \($0.status): \($0.stderr)" }
            outputs.withLock { $0.append(listed ?? "did not run") }
        }
        for listed in outputs.withLock({ $0 }) { #expect(listed == "k\nonly\np\ntpm-only\n") }
        #expect(try t.cli(["get", "svc", "only"]).stdout == Array("token only".utf8))
    }
}
