import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainBasics
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// Issue 22 item 1: a name any user can store must never make the administrator's backup
/// impossible to restore. One bound (`ItemNames`) for every way in, counted as the seed's
/// JavaScript counts; a restore that meets a name out of bounds restores the rest and names it.
@Suite("names: one bound from the write to the restore", .offThePool)
struct NameBoundsTests: TwoDeviceTest {
    static let nobody: UInt32 = 65534
    /// 256 characters to Swift, 77,056 UTF-16 code units, 153,856 UTF-8 bytes.
    static let attack = String(repeating: "a" + String(repeating: "\u{0301}", count: 300), count: 256)

    /// The attack through keychaind: nobody sends a raw setItem frame with the 150 KB service (too
    /// long for an argv string). Refused at the write with the seed's message; the administrator's
    /// whole-store backup then restores every user's items on another device.
    @Test func anotherUsersLongServiceIsRefusedAtTheWriteAndTheWholeStoreBackupRestores() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let asNobody = ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups"]
        #expect(try run("/usr/bin/setpriv", asNobody + [keychainctl, "set", "mail", "token"], input: Array("nobody's".utf8),
                        environment: daemon.environment).status == 0)
        #expect(try run(keychainctl, ["set", "vpn", "psk"], input: Array("root's".utf8), environment: daemon.environment).status == 0)
        let script = rawWireClient + """
            service = ('a' + '\\u0301' * 300) * 256
            body = bytes([V, 1]) + field(1, options(service)) + field(2, b'k') + field(3, b'v')
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            reply = request(s, body)
            print(json.dumps({'kind': reply[1], 'fields': fields(reply)}))
            """
        let sent = try run("/usr/bin/setpriv", asNobody + ["/usr/bin/python3", "-c", script, daemon.socket])
        #expect(sent.status == 0, "\(sent.stderr)")
        let reply = try JSONSerialization.jsonObject(with: Data(sent.stdout)) as? [String: Any]
        let fields = reply?["fields"] as? [String: String]
        #expect(reply?["kind"] as? Int == 0x81, "an error reply: \(String(decoding: sent.stdout, as: UTF8.self).prefix(300))")
        #expect(fields?["30"] == "INVALID_ARGUMENT")
        #expect(fields?["31"] == "Invalid service: expected a non-empty string of up to 256 characters, got 77056 characters")
        _ = daemon.kill()

        // Nothing of it in the store; the administrator's backup of every user restores whole.
        let longest = try run("/usr/bin/sqlite3", [daemon.store + "/keychain.db", "SELECT max(length(CAST(service AS BLOB))) FROM items"])
        #expect(String(decoding: longest.stdout, as: UTF8.self) == "14\n", "uid:65534/mail is the longest")
        let file = tpm.directory + "/all.kcb"
        let made = try run(keychainctl, ["--store", daemon.store, "--tcti", tpm.tcti, "--json", "backup", "--passphrase-stdin",
                                         "--cost", "interactive", "--out", file], input: Array("pass phrase\n".utf8))
        #expect(made.status == 0, "\(made.stderr)")
        let b = try CLIDevice()
        let restored = try cli(b, ["--json", "restore", file, "--passphrase-stdin"], "pass phrase\n")
        #expect(restored.status == 0, "\(restored.stderr)")
        let report = try JSONDecoder().decode(RestoreReport.self, from: Data(restored.stdout))
        #expect(Set(report.restored.map(\.service)) == ["uid:0/vpn", "uid:65534/mail"] && report.skipped.isEmpty)
    }

    /// A backup an older version wrote holds one service of 150 KB among good items (and a daemon
    /// user's service of a full 256 characters after its namespace): the restore writes the good
    /// ones, names the one it skipped and why, and exits 0.
    @Test func aBackupWithOneBadItemRestoresTheRestAndNamesTheOneItSkipped() throws {
        let b = try CLIDevice()
        let file = b.tpm.directory + "/old.kcb"
        let fd = open(file, O_RDWR | O_CREAT | O_EXCL, 0o600)
        let full = "uid:1600/" + String(repeating: "s", count: 256)
        do {
            defer { close(fd) }
            let writer = try BackupWriter(fd: fd, passphrase: SecureBytes(copying: Array("pass phrase".utf8)), opsLimit: 1, memLimit: 8192)
            for (service, key) in [("mail", "a"), (Self.attack, "k"), (full, "b"), ("mail", "c")] {
                try writer.append(BackupItem(service: service, key: key, accessible: .afterFirstUnlock, accessControl: .none,
                                             authValidity: 0, label: nil, created: 1, modified: 2,
                                             value: SecureBytes(copying: Array("value \(key)".utf8))))
            }
            try writer.finish()
        }
        let restored = try cli(b, ["--json", "restore", file, "--passphrase-stdin"], "pass phrase\n")
        #expect(restored.status == 0, "\(restored.stderr)")
        let report = try JSONDecoder().decode(RestoreReport.self, from: Data(restored.stdout))
        #expect(report.restored.map(\.key) == ["a", "b", "c"])
        #expect(report.skipped == [BackupSkip(service: Self.attack, key: "k", reason: .invalidName,
                                              detail: "Invalid service: expected a non-empty string of up to 256 characters, got 77056 characters")])
        #expect(try text(b, ["get", "mail", "c"]) == "value c")
        // In words: the skipped item by its start and size, and why.
        let words = try cli(b, ["restore", file, "--passphrase-stdin"], "pass phrase\n")
        let said = String(decoding: words.stdout, as: UTF8.self)
        #expect(said.contains("(153856 bytes) k (invalidName: Invalid service: expected a non-empty string of up to 256 characters, got 77056 characters"),
                "\(said.suffix(400))")
    }

    /// An item stored before names were checked (planted with sqlite3) is left out of the backup and
    /// named, so the backup restores: backup never writes what restore refuses.
    @Test func aStoredNameOutOfBoundsIsLeftOutOfTheBackupWhichRestores() throws {
        let a = try CLIDevice(), b = try CLIDevice()
        #expect(try cli(a, ["set", "mail", "k1"], "one").status == 0)
        #expect(try cli(a, ["set", "mail", "k2"], "two").status == 0)
        let planted = try run("/usr/bin/sqlite3", [a.store + "/keychain.db"],
                              input: Array("UPDATE items SET service = '\(Self.attack)' WHERE key = 'k2';".utf8))
        #expect(planted.status == 0, "\(planted.stderr)")
        let file = a.tpm.directory + "/a.kcb"
        let made = try cli(a, ["--json", "backup", "--passphrase-stdin", "--cost", "interactive", "--out", file], "pass phrase\n")
        #expect(made.status == 0, "\(made.stderr)")
        let backup = try JSONDecoder().decode(BackupReport.self, from: Data(made.stdout))
        #expect(backup.backedUp.map(\.key) == ["k1"])
        #expect(backup.skipped.map { "\($0.key):\($0.reason.rawValue)" } == ["k2:invalidName"])
        let restored = try cli(b, ["--json", "restore", file, "--passphrase-stdin"], "pass phrase\n")
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(try text(b, ["get", "mail", "k1"]) == "one")
    }
}
