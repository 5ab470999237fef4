import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// The first provisioning of a fresh TPM (SRK, device-lock indices, boot-state approval index, the
/// store's records), killed after each of its TPM commands in turn, each time on a TPM with no state:
/// the next run must finish it and leave a working device. Before, a kill between the descriptor
/// index's NV_DefineSpace and its NV_Write left an index nobody ever wrote, and every later operation
/// failed with "Cannot provision the TPM (NV_Read)" (TPM_RC_NV_UNINITIALIZED) for good.
@Suite("First provisioning killed at every TPM command", .offThePool)
struct FirstProvisioningCrashTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    @Test func aKilledFirstProvisioningIsFinishedByTheNextRun() throws {
        for n in 1...150 {
            let tpm = try SoftwareTPM()
            let store = tpm.directory + "/store"
            func cli(_ args: [String], _ input: String = "", abortAfter: Int? = nil) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
                try run(ctl, ["--store", store, "--tcti", tpm.tcti] + args, input: Array(input.utf8),
                        environment: abortAfter.map { ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\($0)"] } ?? [:])
            }
            let killed = try cli(["status"], abortAfter: n)
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let again = try cli(["status"])
            #expect(again.status == 0, "after kill \(n): \(again.stderr)")
            // The device works: an item, the passcode, lock and unlock.
            #expect(try cli(["set", "s", "a", "--accessible", "whenUnlocked"], "value").status == 0, "after kill \(n)")
            #expect(try cli(["get", "s", "a"]).stdout == Array("value".utf8), "after kill \(n)")
            #expect(try cli(["passcode", "set"], "2468\n").status == 0, "after kill \(n)")
            #expect(try cli(["lock"]).status == 0, "after kill \(n)")
            #expect(try cli(["get", "s", "a"]).status != 0, "after kill \(n): read while locked")
            #expect(try cli(["unlock"], "1357\n").status != 0, "after kill \(n): a wrong passcode unlocked")
            #expect(try cli(["unlock"], "2468\n").status == 0, "after kill \(n)")
            #expect(try cli(["get", "s", "a"]).stdout == Array("value".utf8), "after kill \(n)")
            if killed.status == 0 {
                // Every command of a first provisioning was a crash point (n - 1 of them, then one run whole).
                #expect(n > 20, "a first provisioning took only \(n - 1) TPM commands")
                print("first provisioning: \(n - 1) TPM commands, each killed once")
                return
            }
        }
        Issue.record("the first provisioning never completed")
    }
}
