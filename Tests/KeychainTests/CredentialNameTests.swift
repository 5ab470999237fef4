import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// `keychainctl credential set/rm` hold unit names and credential IDs to systemd's own rules
/// (issue 37 item 6): a credential no unit could ever load is refused, not stored.
@Suite("Credential names by systemd's rules", .offThePool)
struct CredentialNameTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    /// `credential ls` with no unit: every unit's IDs, one `UNIT ID` per line, never a value; for
    /// administrators only, and a user's own with --user.
    @Test func lsWithNoUnitListsEveryUnitsCredentials() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        for (unit, id) in [("web.service", "tls-key"), ("db.service", "password"), ("db.service", "replica"), ("getty@tty1.service", "pin")] {
            #expect(try run(ctl, ["credential", "set", unit, id], input: Array("secret-\(id)".utf8), environment: daemon.environment).status == 0)
        }
        #expect(try run(ctl, ["set", "svc", "k"], input: Array("v".utf8), environment: daemon.environment).status == 0)  // not a credential
        let listed = try run(ctl, ["credential", "ls"], environment: daemon.environment)
        let text = String(decoding: listed.stdout, as: UTF8.self)
        #expect(listed.status == 0 && text == "db.service password\ndb.service replica\ngetty@tty1.service pin\nweb.service tls-key\n",
                "\(text) \(listed.stderr)")
        #expect(!text.contains("secret"))
        let json = try run(ctl, ["--json", "credential", "ls"], environment: daemon.environment)
        #expect(String(decoding: json.stdout, as: UTF8.self)
                == "{\"db.service\":[\"password\",\"replica\"],\"getty@tty1.service\":[\"pin\"],\"web.service\":[\"tls-key\"]}\n")
        // Not an administrator: refused, as every credential command is.
        let nobody = try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", ctl, "credential", "ls"],
                             environment: daemon.environment)
        #expect(nobody.status == 3 && nobody.stderr.contains("ACCESS_DENIED"), "\(nobody.stderr)")
    }

    @Test func unitNamesAndIDsSystemdWouldRefuseAreRefused() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        func credential(_ args: [String]) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, ["credential"] + args, input: Array("value".utf8), environment: daemon.environment)
        }
        let refused: [([String], String)] = [
            (["set", "dbapp", "id"], "must end in a unit type"),
            (["set", "not-a-unit", "id"], "must end in a unit type"),
            (["set", "db app.service", "id"], "only letters, digits"),
            (["set", "@x.service", "id"], "a name must come before @"),
            (["set", "getty@.service", "id"], "template"),
            (["set", String(repeating: "a", count: 250) + ".service", "id"], "1 to 255 bytes"),
            (["set", "web.service", "bad/id"], "may not contain /"),
            (["set", "web.service", ".."], "may not be . or .."),
            (["set", "web.service", "a:b"], "printable ASCII other than :"),
            (["set", "web.service", String(repeating: "i", count: 256)], "1 to 255 bytes"),
            (["rm", "dbapp", "id"], "must end in a unit type"),
            (["rm", "web.service", "bad/id"], "may not contain /"),
        ]
        for (args, rule) in refused {
            let result = try credential(args)
            #expect(result.status == 2 && result.stderr.contains("INVALID_ARGUMENT") && result.stderr.contains(rule), "\(args): \(result.stderr)")
        }
        #expect(try credential(["ls", "dbapp"]).stdout.isEmpty, "nothing was stored")
        for (unit, id) in [("dbapp.service", "db-password"), ("getty@tty1.service", "pin.v2"), ("x.timer", "A_b-c")] {
            let stored = try credential(["set", unit, id])
            #expect(stored.status == 0, "\(unit) \(id): \(stored.stderr)")
            #expect(try credential(["get", unit, id]).stdout == Array("value".utf8))
            #expect(try credential(["rm", unit, id]).status == 0)
        }
    }
}
