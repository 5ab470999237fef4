import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 22 item 7: after `init` took ownership, the first fingerprint enrollment through keychaind
/// makes the reader's key persistent (EvictControl), which needs the owner authorization. keychaind
/// is given it the documented ways (`--owner-auth-file`, systemd's `LoadCredential=owner.auth:…`);
/// without it the call says so, with the command that works, instead of a raw EvictControl 0x9A2.
@Suite("keychaind: the owner authorization for the reader", .offThePool)
struct DaemonOwnerAuthorizationTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    @Test func theFirstEnrollmentThroughKeychaindAfterInitWorksWithTheOwnerAuthorizationAndSaysHowWithout() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store", reader = tpm.directory + "/reader", owner = tpm.directory + "/owner.auth"
        let initialized = try run(ctl, ["--store", store, "--tcti", tpm.tcti, "init", "--owner-auth-out", owner,
                                        "--lockout-auth-out", tpm.directory + "/lockout.auth"])
        #expect(initialized.status == 0, "\(initialized.stderr)")

        // Without it: AUTHENTICATION_FAILED naming the ways that work; no finger enrolled.
        var daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader)
        let refused = try run(ctl, ["--json", "reader", "enroll", "thumb"], environment: daemon.environment)
        let error = (try? JSONSerialization.jsonObject(with: Data(refused.stdout)) as? [String: [String: Any]])?["error"]
        #expect(error?["code"] as? String == "AUTHENTICATION_FAILED", "\(String(decoding: refused.stdout, as: UTF8.self))")
        let message = error?["message"] as? String ?? ""
        #expect(message.contains("keychainctl --owner-auth-file FILE reader") && message.contains("keychaind, start it with --owner-auth-file FILE")
                && message.contains("LoadCredential=owner.auth:FILE"), "\(message)")
        #expect(try run(ctl, ["reader", "list"], environment: daemon.environment).stdout.isEmpty)
        _ = daemon.kill()

        // systemd's way: the credential owner.auth in $CREDENTIALS_DIRECTORY (a 0500 directory, a 0400 file).
        let credentials = tpm.directory + "/credentials"
        #expect(mkdir(credentials, 0o700) == 0)
        try FileManager.default.copyItem(atPath: owner, toPath: credentials + "/owner.auth")
        #expect(chmod(credentials + "/owner.auth", 0o400) == 0 && chmod(credentials, 0o500) == 0)
        daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader, environment: ["CREDENTIALS_DIRECTORY": credentials])
        let enrolled = try run(ctl, ["reader", "enroll", "thumb"], environment: daemon.environment)
        #expect(enrolled.status == 0, "\(enrolled.stderr)")
        #expect(try run(ctl, ["passcode", "set"], input: Array("2468\n".utf8), environment: daemon.environment).status == 0)
        let stored = try run(ctl, ["set", "bank", "pin", "--access-control", "biometryAny"], input: Array("4321".utf8),
                             environment: daemon.environment)
        #expect(stored.status == 0, "\(stored.stderr)")
        #expect(String(decoding: try run(ctl, ["get", "bank", "pin", "--touch", "thumb"], environment: daemon.environment).stdout,
                       as: UTF8.self) == "4321")
        // Deleting the reader evicts its key: the owner authorization again.
        #expect(try run(ctl, ["reader", "delete"], input: Array("2468\n".utf8), environment: daemon.environment).status == 0)
        _ = daemon.kill()

        // --owner-auth-file: a first enrollment again.
        daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader, arguments: ["--owner-auth-file", owner])
        let again = try run(ctl, ["reader", "enroll", "index"], input: Array("2468\n".utf8), environment: daemon.environment)
        #expect(again.status == 0, "\(again.stderr)")
        _ = daemon.kill()
    }

    /// Whoever can read the file owns the TPM: keychaind refuses one that group or others may read.
    @Test func keychaindRefusesAnOwnerAuthorizationFileOthersCanRead() throws {
        let tpm = try SoftwareTPM()
        let file = tpm.directory + "/owner.auth"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("hex:00112233\n".utf8), attributes: [.posixPermissions: 0o644]))
        let keychaind = buildDirectory.appendingPathComponent("keychaind").path
        let result = try run(keychaind, ["--socket", tpm.directory + "/k.sock", "--store", tpm.directory + "/store", "--tcti", tpm.tcti,
                                         "--owner-auth-file", file])
        #expect(result.status == 2 && result.stderr.contains("mode 644") && result.stderr.contains("chmod 600"), "\(result.stderr)")
    }
}
