import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// The keychain on TPMs that behave like chips devices have (issue 39). On a revision 1.16 TPM without
/// PolicyAuthorizeNV a ThisDeviceOnly item written is an item that reads (sealed with PolicyPCR to the
/// boot state recorded at set-up), no 0x143 reaches a caller, and approving another state is UNSUPPORTED.
@Suite("The keychain on TPM chip profiles", .offThePool)
struct ChipProfileKeychainTests {
    static let passcode = "5173"
    /// The old firmware's missing commands, without its latencies (scripts/tpm-profiles.sh runs the timed one).
    static let oldFirmware = TPMProfile(name: "revision 1.16, untimed", missingCommands: TPMProfile.oldFirmware.missingCommands)

    /// No message of an error mentions the raw command-code refusal.
    func expectNoCommandCodeLeak(_ error: KeychainError) {
        #expect(!error.message.contains("0x143") && !error.message.contains("PolicyAuthorizeNV failed"), "\(error.message)")
    }

    @Test func aThisDeviceOnlyItemWrittenOnAnOldTPMReadsAndNeverSendsPolicyAuthorizeNV() async throws {
        let f = try Fixture(profile: Self.oldFirmware)
        let storage = try f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        try await storage.setItem("k", "v")
        await f.device.dropCaches()  // a new process: the key is unsealed by the TPM again
        #expect(try await storage.getItem("k") == "v")
        #expect(!f.tpm.commandsSeen.contains(TPMProfile.Command.policyAuthorizeNV))
        let status = try await f.administration.bootState()
        #expect(status.mode == "set-up" && status.matches, "\(status)")
    }

    /// The issue's steps, each its own process: init, a ThisDeviceOnly set, then get in a later process.
    @Test func keychainctlInitSetAndGetOfAThisDeviceOnlyItemOnAnOldTPM() throws {
        let tpm = try SoftwareTPM(profile: Self.oldFirmware)
        func cli(_ args: [String], _ input: String = "") throws -> (status: Int32, stdout: String, stderr: String) {
            let result = try run(buildDirectory.appendingPathComponent("keychainctl").path,
                                 ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none"] + args, input: Array(input.utf8))
            return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
        }
        let initialized = try cli(["init", "--owner-auth-out", tpm.directory + "/owner.auth", "--lockout-auth-out", tpm.directory + "/lockout.auth"])
        #expect(initialized.status == 0, "\(initialized.stderr)")
        let set = try cli(["set", "tdo", "k", "--accessible", "afterFirstUnlockThisDeviceOnly"], "the secret")
        #expect(set.status == 0, "\(set.stderr)")
        let got = try cli(["get", "tdo", "k"])
        #expect(got.status == 0 && got.stdout == "the secret", "\(got.stderr)")
        #expect(!got.stderr.contains("0x143"))
    }

    @Test func everyLevelRoundTripsOnAnOldTPM() async throws {
        let f = try Fixture(profile: Self.oldFirmware)
        try await f.device.setPasscode(bytes(Self.passcode))
        for level in Accessible.allCases {
            try await f.storage("svc.\(level.rawValue)", accessible: level).setItem("secret", "value of \(level.rawValue)")
        }
        await f.device.dropCaches()
        for level in Accessible.allCases {
            #expect(try await f.storage("svc.\(level.rawValue)", accessible: level).getItem("secret") == "value of \(level.rawValue)")
        }
    }

    @Test func approvingABootStateOnAnOldTPMIsUnsupportedNamingTheCommand() async throws {
        let f = try Fixture(profile: Self.oldFirmware)
        try await f.device.setPasscode(bytes(Self.passcode))
        do {
            _ = try await f.administration.approveBootState(passcode: bytes(Self.passcode))
            Issue.record("approved a boot state on a TPM without PolicyAuthorizeNV")
        } catch {
            #expect(error.code == .unsupported, "\(error)")
            #expect(error.message.contains("TPM2_PolicyAuthorizeNV") && error.message.contains("recorded when this keychain was set up"),
                    "\(error.message)")
        }
        let shown = try run(buildDirectory.appendingPathComponent("keychainctl").path,
                            ["--store", f.configuration.storeDirectory, "--tcti", f.tpm.tcti, "--reader", "none", "boot-state"])
        let text = String(decoding: shown.stdout, as: UTF8.self)
        #expect(shown.status == 0 && text.contains("mode: set-up") && text.contains("lacks TPM2_PolicyAuthorizeNV"), "\(text)\(shown.stderr)")
    }

    @Test func aChangedBootOnAnOldTPMIsDeviceStateChangedNotACommandCode() async throws {
        let f = try Fixture(profile: Self.oldFirmware)
        let storage = try f.storage("tdo", accessible: .whenUnlockedThisDeviceOnly)
        try await storage.setItem("k", "v")
        try f.extendPCR(7)
        await f.device.dropCaches()
        // A service's first write seals its wrapping key (later ones encrypt to it, and open where it opens).
        let other = try f.storage("tdo.new", accessible: .whenUnlockedThisDeviceOnly)
        for (what, attempt) in [("read", { _ = try await storage.getItem("k") }), ("first write of a service", { try await other.setItem("k2", "w") })]
            as [(String, () async throws -> Void)] {
            do {
                try await attempt()
                Issue.record("a ThisDeviceOnly item's \(what) succeeded in a boot state other than the one recorded")
            } catch let error as KeychainError {
                #expect(error.code == .deviceStateChanged, "\(error)")
                expectNoCommandCodeLeak(error)
            }
        }
    }

    /// The engine's common calls on the typical SPI chip's timings: the same answers, slower.
    @Test func theCommonCallsAnswerAlikeOnATypicalSPIChip() async throws {
        let f = try Fixture(profile: .typicalSPI)
        try await f.device.setPasscode(bytes(Self.passcode))
        let levels: [Accessible] = [.afterFirstUnlock, .whenUnlockedThisDeviceOnly, .whenPasscodeSetThisDeviceOnly]
        for level in levels { try await f.storage("svc.\(level.rawValue)", accessible: level).setItem("k", level.rawValue) }
        try await f.reboot()
        #expect(await code { try await f.storage("svc.afterFirstUnlock", accessible: .afterFirstUnlock).getItem("k") } == .interactionNotAllowed)
        try await f.device.unlock(passcode: bytes(Self.passcode))
        for level in levels { #expect(try await f.storage("svc.\(level.rawValue)", accessible: level).getItem("k") == level.rawValue) }
        try await f.device.lock()
        #expect(await code { try await f.storage("svc.whenUnlockedThisDeviceOnly", accessible: .whenUnlockedThisDeviceOnly).getItem("k") }
                == .interactionNotAllowed)
    }
}
