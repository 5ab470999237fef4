import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// What a `ThisDeviceOnly` key may be sealed to: PCRs that hold a boot state, with the values they had
/// when the keychain was set up.
@Suite("Boot state of ThisDeviceOnly keys", .offThePool)
struct BootStateTests {
    @Test(arguments: [[16], [23], [7, 23], [17], [22], [24], [-1], []])
    func pcrSelectionsThatBindNothingAreRefusedByTheLibrary(pcrs: [Int]) async throws {
        let f = try Fixture(pcrSelection: pcrs)
        #expect(throws: KeychainError.self) { try f.configuration.checkPCRSelection() }
        let storage = try f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        #expect(await code { try await storage.setItem("k", "v") } == .invalidArgument)
        #expect(try await storage.hasItem("k") == false)
        #expect(await code { try await f.device.initialize() } == .invalidArgument)
        // Levels that are not bound to PCRs do not use the selection.
        try await f.storage("afu").setItem("k", "v")
    }

    @Test func theResettablePCRsAreNamedInTheMessage() throws {
        let f = try Fixture(pcrSelection: [7, 23])
        do { try f.configuration.checkPCRSelection(); Issue.record("accepted PCR 23") } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("PCR 23") && error.message.contains("reset"))
        }
        try Fixture(pcrSelection: [0, 7, 15]).configuration.checkPCRSelection()
    }

    @Test func keychainctlRefusesPCR23() throws {
        let tpm = try SoftwareTPM()
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--pcrs", "23", "set", "svc", "k",
                                   "--accessible", "afterFirstUnlockThisDeviceOnly"], input: [1])
        #expect(result.status == 2)
        #expect(result.stderr.contains("INVALID_ARGUMENT") && result.stderr.contains("PCR 23"))
    }

    /// The attack: someone with TPM access extends PCR 7 after boot, so that new ThisDeviceOnly keys
    /// are sealed to a value the device never boots into again, and die at the next reboot.
    @Test func aThisDeviceOnlyWriteAfterPCR7WasExtendedIsRefusedAndWorksAfterAReboot() async throws {
        let f = try Fixture()
        try await f.device.initialize()  // records the boot state
        let earlier = try f.storage("earlier", accessible: .afterFirstUnlockThisDeviceOnly)
        try await earlier.setItem("k", "before")
        #expect(try run("/usr/bin/tpm2_pcrextend",
                        ["7:sha256=" + String(repeating: "ab", count: 32)], environment: ["TPM2TOOLS_TCTI": f.tpm.tcti]).status == 0)
        let fresh = try f.storage("fresh", accessible: .whenUnlockedThisDeviceOnly)
        #expect(await code { try await fresh.setItem("k", "v") } == .deviceStateChanged)
        #expect(try await fresh.hasItem("k") == false)
        let store = try Store(directory: f.configuration.storeDirectory)
        #expect(try store.wrappingKeys(service: "fresh").isEmpty, "nothing sealed, nothing stored")
        // Levels without the PCR binding are not affected.
        try await f.storage("portable", accessible: .afterFirstUnlock).setItem("k", "v")
        // After a reboot PCR 7 is back: the write works, and the earlier item still opens.
        try await f.reboot()
        try await f.device.unlock(passcode: nil)
        try await fresh.setItem("k", "v")
        #expect(try await fresh.getItem("k") == "v")
        #expect(try await earlier.getItem("k") == "before")
    }

    @Test func theBootStateIsRecordedWhenTheStoreIsProvisioned() async throws {
        let f = try Fixture()
        try await f.device.initialize()
        let store = try Store(directory: f.configuration.storeDirectory)
        let recorded = try #require(try store.meta("tpm.boot-state").flatMap(BootState.init(decoding:)))
        let context = try TPMContext(device: f.tpm.device)
        #expect(recorded.values == [7: try context.readPCRs(PCRSelection([7]))[0]])
    }
}
