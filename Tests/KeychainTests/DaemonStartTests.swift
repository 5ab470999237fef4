import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// Issue 20 (a credential asked for at boot): keychaind's start makes the unlock that the first read
/// after a TPM reset would begin with, on a device without a passcode (which counts as unlocked), before
/// it says it is ready; so that read sends a cold read's commands and no more. Counted in TPM commands
/// (`takeTPMCommandCount`: keychaind's), never timed.
@Suite("keychaind's start after a TPM reset", .offThePool)
struct DaemonStartTests {
    @Test func theFirstReadAfterATPMResetAndKeychaindsStartSendsOnlyAColdReadsCommands() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let configuration = daemon.configuration()
        let storage = try createKeychain(.init(service: "boot"), configuration: configuration)
        let device = KeychainDevice(configuration: configuration)
        try await storage.setItem("k", "value")
        // A cold read on a TPM that runs and was unlocked (a connection of its own, its key unsealed again):
        // the first read has unlocked it, if keychaind's start had not.
        for _ in 0..<2 {
            await device.dropCaches()
            _ = await device.takeTPMCommandCount()
            #expect(try await storage.getItem("k") == "value")
        }
        let coldRead = await device.takeTPMCommandCount()
        #expect(coldRead >= 5, "a cold read counted \(coldRead) TPM commands")

        // A boot: keychaind stopped, the TPM reset (its lock state is cleared), keychaind started.
        #expect(daemon.kill() != nil)
        try tpm.reboot()
        try daemon.start()
        _ = await device.takeTPMCommandCount()  // the start's own
        #expect(try await storage.getItem("k") == "value")
        // Without the unlock at the start: the unlock's commands more (PolicySecret, NV_Write, its sessions).
        let firstRead = await device.takeTPMCommandCount()
        #expect(firstRead == coldRead, "the first read after the reset: \(firstRead) TPM commands, a cold read \(coldRead)")
    }

    /// A device with a passcode stays locked over keychaind's start: its lock is its user's, and no
    /// passcode is tried (the TPM's count of wrong ones does not move).
    @Test func aDeviceWithAPasscodeStaysLockedOverKeychaindsStart() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let configuration = daemon.configuration()
        let storage = try createKeychain(.init(service: "boot", accessible: .whenUnlocked), configuration: configuration)
        let device = KeychainDevice(configuration: configuration)
        try await device.setPasscode(SecureBytes(copying: Array("2468".utf8)))
        try await storage.setItem("k", "value")

        #expect(daemon.kill() != nil)
        try tpm.reboot()
        try daemon.start()
        #expect(try await device.status().lockState != .unlocked)
        do {
            _ = try await storage.getItem("k")
            Issue.record("a whenUnlocked item was read after the TPM reset without the passcode")
        } catch {
            #expect(error.code == .interactionNotAllowed, "\(error.message)")
        }
        try await device.unlock(passcode: SecureBytes(copying: Array("2468".utf8)))
        #expect(try await storage.getItem("k") == "value")
    }
}
