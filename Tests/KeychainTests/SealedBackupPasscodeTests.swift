import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import SecureMemory
import Testing

extension BackupTests {
    /// `backup --to B` of a passcode item: with the file and raw TPM access on B, B unlocked but
    /// without B's passcode, the backup's key does not open (it is sealed under B's passcode, as the
    /// item is on B once restored); B's owner restores it with the passcode. The key's unseal here is
    /// the library's own (`openBundle`, which holds no secret), standing for the same tpm2-tools calls.
    @Test func aSealedBackupOfAPasscodeItemOpensOnlyWithTheTargetsPasscode() async throws {
        let a = try Device(), b = try Device()
        #expect(try cli(a, ["passcode", "set"], "2468\n").status == 0)
        #expect(try cli(a, ["set", "svc", "pin", "--access-control", "passcode"], "behind the passcode").status == 0)
        let identity = b.tpm.directory + "/b.identity"
        #expect(try cli(b, ["identity", "--out", identity]).status == 0)
        #expect(try cli(b, ["passcode", "set"], "1357\n").status == 0)
        let file = a.tpm.directory + "/to-b.kcb"
        let made = try cli(a, ["--json", "backup", "--to", identity, "--out", file, "--passcode-stdin"], "2468\n")
        #expect(made.status == 0, "\(made.stderr)")
        #expect(try cli(b, ["unlock"], "1357\n").status == 0)

        // Without B's passcode: refused, nothing restored; with it: restored behind B's passcode.
        let refused = try cli(b, ["--json", "restore", file])
        #expect(errorCode(refused) == "INTERACTION_NOT_ALLOWED", "\(String(decoding: refused.stdout, as: UTF8.self))")
        #expect(try cli(b, ["has", "svc", "pin"]).status == 1)
        let restored = try cli(b, ["--json", "restore", file, "--passcode-stdin"], "1357\n")
        #expect(restored.status == 0, "\(restored.stderr) \(String(decoding: restored.stdout, as: UTF8.self))")
        #expect(try text(b, ["get", "svc", "pin", "--passcode-stdin"], "1357\n") == "behind the passcode")

        // The attacker on B: the file, the TPM, B unlocked, no passcode; a store of their own.
        let fd = open(file, O_RDONLY)
        defer { close(fd) }
        let (header, headerBytes) = try BackupReader.header(fd)
        let bundle = try ProvisioningBundle(json: Data(try #require(header.sealedKey)))
        let attacker = try KeychainAdministration(configuration: KeychainConfiguration(storeDirectory: b.tpm.directory + "/attacker", tpm: .tcti(b.tpm.tcti)))
        let engine = attacker.engine
        let master: SecureBytes?
        do { master = try await engine.openBundle(bundle, passcode: nil) } catch { master = nil }
        #expect(master == nil, "the backup's key opened on B without B's passcode")
        if let master {
            let reader = try BackupReader(fd: fd, header: header, headerBytes: headerBytes, master: master)
            while let item = try reader.next() {
                Issue.record("read \(item.service)/\(item.key) (\(item.accessControl.rawValue)) without a passcode")
            }
        }
    }
}
