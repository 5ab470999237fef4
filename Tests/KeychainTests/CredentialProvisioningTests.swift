import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// Issue 20: a fleet's pipeline seals a service's secret to one device (`seal-for --credential
/// UNIT:ID`), and the administrator's `import` through keychaind makes it that unit's systemd
/// credential; `identity` and `import` go through keychaind, for root and the group `admin` only.
@Suite("systemd credentials provisioned through keychaind", .offThePool)
struct CredentialProvisioningTests {
    static let user: UInt32 = 1600

    func ctl(_ daemon: KeychainDaemon, _ args: [String], input: [UInt8] = [], uid: UInt32) throws -> (status: Int32, out: String, err: String) {
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", keychainctl] + args,
                             input: input, environment: daemon.environment)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    @Test func aCredentialBundleImportedThroughKeychaindBecomesThatUnitsCredential() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let files = FileManager.default.temporaryDirectory.appendingPathComponent("credential-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: files, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: files) }

        // identity through keychaind: root only.
        let refusedIdentity = try ctl(daemon, ["identity"], uid: Self.user)
        #expect(refusedIdentity.status != 0 && refusedIdentity.err.contains("ACCESS_DENIED"), "\(refusedIdentity)")
        let identity = try ctl(daemon, ["identity", "--out", files + "/identity.json"], uid: 0)
        #expect(identity.status == 0, "\(identity)")

        // The pipeline's side: no TPM, no keychaind.
        let value: [UInt8] = Array("db-pa\u{0}ss".utf8) + [0xff]
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let sealed = try run(keychainctl, ["seal-for", files + "/identity.json", "--credential", "db.service:db-password",
                                           "--accessible", "afterFirstUnlockThisDeviceOnly"], input: value)
        #expect(sealed.status == 0, "\(sealed.stderr)")
        let bundlePath = files + "/db.bundle"
        try Data(sealed.stdout).write(to: URL(fileURLWithPath: bundlePath))

        let refusedImport = try ctl(daemon, ["import", bundlePath], uid: Self.user)
        #expect(refusedImport.status != 0 && refusedImport.err.contains("ACCESS_DENIED"), "\(refusedImport)")
        let imported = try ctl(daemon, ["import", bundlePath], uid: 0)
        #expect(imported.status == 0 && imported.out.contains("imported: systemd credential db-password of db.service"), "\(imported)")
        let stored = try run(keychainctl, ["credential", "get", "db.service", "db-password"], environment: daemon.environment)
        #expect(stored.stdout == value, "root reads it back as the unit's credential: \(stored.stderr)")
        #expect(try ctl(daemon, ["get", "db.service", "db-password"], uid: 0).status != 0, "not among root's own items")

        // The flag is authenticated: a bundle whose credential mark was taken out does not open.
        var document = try JSONSerialization.jsonObject(with: Data(sealed.stdout)) as! [String: Any]
        document["credential"] = nil
        try JSONSerialization.data(withJSONObject: document).write(to: URL(fileURLWithPath: files + "/unmarked.bundle"))
        let unmarked = try ctl(daemon, ["import", files + "/unmarked.bundle"], uid: 0)
        #expect(unmarked.status != 0 && unmarked.err.contains("DATA_CORRUPTED"), "\(unmarked)")
        #expect(try ctl(daemon, ["get", "db.service", "db-password"], uid: 0).status != 0, "the unmarked bundle wrote nothing")
        // Nor does a plain bundle marked afterwards: an item's bundle cannot be made a system unit's credential.
        let plain = try run(keychainctl, ["seal-for", files + "/identity.json", "api.service", "token"], input: Array("plain".utf8))
        var marked = try JSONSerialization.jsonObject(with: Data(plain.stdout)) as! [String: Any]
        marked["credential"] = true
        try JSONSerialization.data(withJSONObject: marked).write(to: URL(fileURLWithPath: files + "/marked.bundle"))
        let promoted = try ctl(daemon, ["import", files + "/marked.bundle"], uid: 0)
        #expect(promoted.status != 0 && promoted.err.contains("DATA_CORRUPTED"), "\(promoted)")
        #expect(try run(keychainctl, ["credential", "ls", "api.service"], environment: daemon.environment).stdout.isEmpty)
    }

    @Test func aCredentialIsNeverSealedBehindAPrompt() throws {
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let identity = try run(keychainctl, ["--store", store, "--tcti", tpm.tcti, "identity"])
        let path = tpm.directory + "/identity.json"
        try Data(identity.stdout).write(to: URL(fileURLWithPath: path))
        let refused = try run(keychainctl, ["seal-for", path, "--credential", "db.service:pw", "--access-control", "passcode"], input: [1])
        #expect(refused.status != 0 && refused.stderr.contains("nobody can answer a prompt"), "\(refused.stderr)")
        let malformed = try run(keychainctl, ["seal-for", path, "--credential", "db.service"], input: [1])
        #expect(malformed.status != 0 && malformed.stderr.contains("expected UNIT:ID"), "\(malformed.stderr)")
    }
}
