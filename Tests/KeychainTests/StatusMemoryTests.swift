import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import Testing

/// Issue 38 item 5: `status`, open to every uid, grew keychaind by about 2.8 KB a call (32 → 187 MB
/// over 45,000 calls) and slowed it to a third: each of its TPM commands left a timer queued in
/// libdispatch until its 30 s deadline (`AnswerDeadline`). keychaind runs as root, the calls come
/// from another uid through `setpriv`, on a real swtpm.
@Suite("keychaind's memory under another uid's status calls", .offThePool)
struct StatusMemoryTests {
    static let nobody: UInt32 = 65534

    @Test func anotherUidsStatusCallsLeaveKeychaindsMemoryFlat() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let calls = rawWireClient + """
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            for _ in range(int(sys.argv[2])):
                reply = request(s, bytes([V, \(WireOp.status.rawValue)]))
                assert reply[1] == 0x80, fields(reply)
            """
        // Rounds of 500 calls, each its own connection; resident memory after each round.
        var resident: [Int] = []
        for _ in 0..<8 {
            let round = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups",
                                                     "/usr/bin/python3", "-c", calls, daemon.socket, "500"])
            try #require(round.status == 0, "another uid's status calls: \(round.stderr)")
            resident.append(try processStatusKiB(daemon.processIdentifier, "VmRSS"))
        }
        print("keychaind's resident memory after each 500 status calls (KiB): \(resident)")
        // After a warm-up of 1,000 calls, the next 3,000 leave it flat; before, they added about
        // 8 MB. The margin is for the allocator's own growth, a few pages.
        let growth = resident[7] - resident[1]
        #expect(growth < 2048, "3,000 status calls after warm-up grew keychaind by \(growth) KiB: \(resident)")
    }
}
