import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 22 item 11: the PCR selection is the keychain's, recorded at `init`: every later command
/// and keychaind use it without `--pcrs`, another `--pcrs` is refused naming both, and no message
/// names an empty list.
@Suite("PCR selection recorded at init", .offThePool)
struct PCRSelectionTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    func cli(_ tpm: SoftwareTPM, _ args: [String], _ input: String = "") throws -> (status: Int32, out: String, err: String) {
        let result = try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti] + args, input: Array(input.utf8))
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    @Test func theSelectionInitRecordedIsUsedByEveryLaterCommandAndByKeychaind() throws {
        let tpm = try SoftwareTPM()
        let owner = tpm.directory + "/owner.auth", lockout = tpm.directory + "/lockout.auth"
        let initialized = try cli(tpm, ["--pcrs", "0,7", "init", "--owner-auth-out", owner, "--lockout-auth-out", lockout])
        #expect(initialized.status == 0, "\(initialized.err)")
        // Without --pcrs: the recorded 0,7, so the write is sealed to the approved state.
        let written = try cli(tpm, ["set", "svc", "tdo", "--accessible", "afterFirstUnlockThisDeviceOnly"], "bound")
        #expect(written.status == 0, "\(written.err)")
        #expect(try cli(tpm, ["get", "svc", "tdo"]).out == "bound")
        let state = try cli(tpm, ["boot-state"])
        #expect(state.out.contains("pcrs: 0,7") && state.out.contains("boot state: approved (PCR 0,7)"), "\(state.out)")
        #expect(try cli(tpm, ["--pcrs", "7,0", "get", "svc", "tdo"]).out == "bound", "the same selection in another order")

        // Another selection: INVALID_ARGUMENT naming both, nothing written.
        let other = try cli(tpm, ["--pcrs", "7", "set", "svc", "k2", "--accessible", "afterFirstUnlockThisDeviceOnly"], "x")
        #expect(other.status == 2 && other.err.contains("INVALID_ARGUMENT"), "\(other.err)")
        #expect(other.err.contains("PCR selection is 0,7") && other.err.contains("not 7"), "\(other.err)")
        #expect(try cli(tpm, ["has", "svc", "k2"]).status == 1)
        #expect(try cli(tpm, ["--pcrs", "0,7,14", "init", "--owner-auth-file", owner]).err.contains("not 0,7,14"))

        // keychaind on the store without --pcrs uses the record; with another one, its calls are refused.
        let daemon = try KeychainDaemon(tpm: tpm, store: tpm.directory + "/store")
        let through = try run(ctl, ["set", "svc", "tdo2", "--accessible", "whenUnlockedThisDeviceOnly"], input: Array("via".utf8),
                              environment: daemon.environment)
        #expect(through.status == 0, "\(through.stderr)")
        #expect(String(decoding: try run(ctl, ["get", "svc", "tdo2"], environment: daemon.environment).stdout, as: UTF8.self) == "via")
        _ = daemon.kill()
        let wrong = try KeychainDaemon(tpm: tpm, store: tpm.directory + "/store", arguments: ["--pcrs", "7"])
        let refused = try run(ctl, ["set", "svc", "tdo3", "--accessible", "whenUnlockedThisDeviceOnly"], input: Array("x".utf8),
                              environment: wrong.environment)
        #expect(refused.status == 2 && refused.stderr.contains("PCR selection is 0,7") && refused.stderr.contains("not 7"),
                "\(refused.stderr)")
        _ = wrong.kill()
    }

    /// A PCR of the selection extended: boot-state and the refused write name it (and only it).
    @Test func bootStateAndARefusedWriteNameThePCRThatDiffers() throws {
        let tpm = try SoftwareTPM()
        #expect(try cli(tpm, ["--pcrs", "0,7", "init", "--owner-auth-out", tpm.directory + "/o", "--lockout-auth-out", tpm.directory + "/l"]).status == 0)
        #expect(try run("/usr/bin/tpm2_pcrextend", ["0:sha256=" + String(repeating: "cd", count: 32)],
                        environment: ["TPM2TOOLS_TCTI": tpm.tcti]).status == 0)
        let state = try cli(tpm, ["boot-state"])
        #expect(state.out.contains("pcrs: 0,7") && state.out.contains("NOT approved (PCR 0 differs)"), "\(state.out)")
        let write = try cli(tpm, ["set", "svc", "k", "--accessible", "alwaysThisDeviceOnly"], "x")
        #expect(write.err.contains("DEVICE_STATE_CHANGED") && write.err.contains("PCR 0 "), "\(write.err)")
        for text in [state.out, write.err] {
            #expect(!text.contains("PCR  ") && !text.contains("PCR differs") && !text.contains("the PCRs this keychain is bound to"))
        }
    }
}
