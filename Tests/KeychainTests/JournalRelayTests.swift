@testable import KeychainDaemon
import Keychain
import Testing

/// What keychain-journal-relay takes from keychaind's datagrams into a refused unit's journal (issue 37 item 6):
/// a unit name by systemd's rules, a reason bounded and escaped. The relay itself, its socket's mode and its
/// sender check run in the booted container (scripts/test-systemd.sh, "systemd credentials").
@Suite("The journal relay's datagrams")
struct JournalRelayTests {
    @Test func aRefusalGoesThroughWhole() throws {
        for manager in [SystemdCredentials.Manager.system, .user(1001)] {
            let refusal = RelayedRefusal(manager: manager, unit: "db.service", reason: "credential pw: no such credential")
            #expect(try RelayedRefusal.parse(refusal.encoded).get() == refusal)
        }
        let user = RelayedRefusal(manager: .user(1001), unit: "app.service", reason: "r")
        #expect(user.journalFields.contains("OBJECT_SYSTEMD_USER_UNIT=app.service") && user.journalFields.contains("OBJECT_UID=1001"))
        let system = RelayedRefusal(manager: .system, unit: "db.service", reason: "r")
        #expect(system.journalFields.contains("OBJECT_SYSTEMD_UNIT=db.service"))
        #expect(system.journalFields.contains("MESSAGE=keychaind refused this unit's credential: r"))
    }

    @Test func aForgedLineIsEscapedAndALongReasonCut() throws {
        let forged = Array("system\0db.service\0first\nkeychaind: forged \u{1B}[31m\0".utf8)
        let refusal = try RelayedRefusal.parse(forged).get()
        #expect(refusal.reason == "first\\nkeychaind: forged \\x1b[31m\\x00")
        #expect(refusal.journalFields.allSatisfy { !$0.contains("\n") })
        let long = try RelayedRefusal.parse(Array("system\0db.service\0".utf8) + [UInt8](repeating: 0x61, count: 1500)).get()
        #expect(long.reason == String(repeating: "a", count: RelayedRefusal.reasonLimit) + " (cut at 1024 bytes)")
    }

    /// Found by the `journal-relay` fuzz target: keychaind cut a long reason to the limit itself, so the relay never said so.
    @Test func aLongReasonKeychaindSendsArrivesSayingItWasCut() throws {
        let sent = RelayedRefusal(manager: .user(1001), unit: "app.service", reason: String(repeating: "b", count: 5000))
        #expect(sent.encoded.count <= RelayedRefusal.datagramLimit)
        let received = try RelayedRefusal.parse(sent.encoded).get()
        #expect(received.reason == String(repeating: "b", count: RelayedRefusal.reasonLimit) + " (cut at 1024 bytes)")
    }

    /// The relay's line about a dropped unit name is cut in bytes: 64 characters can be any length (combining marks).
    @Test func aDroppedUnitNameIsLoggedCutInBytes() {
        let unit = "a" + String(repeating: "\u{301}", count: 900) + ".service"
        guard case .failure(let drop) = RelayedRefusal.parse(Array("system\0\(unit)\0r".utf8)) else {
            Issue.record("accepted a unit of combining marks"); return
        }
        #expect(drop.why.utf8.count <= 36 + 4 * 64, "\(drop.why.utf8.count) bytes")
    }

    @Test func whatSystemdWouldNotGiveADaemonIsDropped() {
        for (datagram, why) in [("system\0db.service\nx.service\0r", "a unit name systemd does not give"),
                                ("system\0dbapp\0r", "a unit name systemd does not give"),
                                ("root\0db.service\0r", "a manager that is neither system nor uid:N"),
                                ("uid:01\0db.service\0r", "a manager that is neither system nor uid:N"),
                                ("system\0db.service", "not MANAGER\\0UNIT\\0REASON")] {
            guard case .failure(let drop) = RelayedRefusal.parse(Array(datagram.utf8)) else {
                Issue.record("accepted \(datagram)"); continue
            }
            #expect(drop.why.hasPrefix(why), "\(drop.why)")
        }
        let oversized = [UInt8](repeating: 0x61, count: RelayedRefusal.datagramLimit + 1)
        #expect(throws: RelayDrop.self) { try RelayedRefusal.parse(oversized).get() }
    }
}
