import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 20 (a credential through a keychaind that is not running yet): the first read after this process
/// started the embedded software TPM (a TPM reset, as keychaind's start on a device without a TPM is) unlocks
/// a device without a passcode before its Unseal, instead of after an Unseal attempt whose PolicyNV fails on
/// the unwritten state index. Counted in TPM commands (`takeTPMCommandCount`), never timed.
@Suite("The first read after the embedded TPM starts", .offThePool)
struct EmbeddedTPMStartTests {
    @Test func theFirstReadAfterTheEmbeddedTPMStartsUnlocksBeforeItsUnsealAndSendsNoUnsealThatFails() async throws {
        let store = EmbeddedStore("keychain-start")
        defer { store.remove() }
        let configuration = store.configuration
        let device = KeychainDevice(configuration: configuration)
        let storage = try createKeychain(.init(service: "start"), configuration: configuration)
        let unlocked = try createKeychain(.init(service: "start.unlocked", accessible: .whenUnlocked), configuration: configuration)
        try await storage.setItem("k", "value")
        try await unlocked.setItem("k", "unlocked value")

        // The writes started the TPM; the first read after that unlocks (below). What the parts cost on a TPM
        // that runs: a cold read, and an unlock (each on the kept connection, and without the leftover check:
        // each turn follows this engine's last).
        await device.dropCaches()
        #expect(try await storage.getItem("k") == "value")
        await device.dropCaches()
        _ = await device.takeTPMCommandCount()
        #expect(try await storage.getItem("k") == "value")
        let coldRead = await device.takeTPMCommandCount()
        try await device.unlock(passcode: nil)
        let unlock = await device.takeTPMCommandCount()

        // A restart of the swtpm is a TPM reset. The first read: the start's own two commands (its permanent
        // flags and dictionary-attack settings), then on one connection the passcode mark (NV_Read: none is
        // set), the store's rollback counter read again after the restart (StartAuthSession, NV_Read,
        // ReadClock: 3), the unlock's commands and the unseal's (no leftover check: the turn follows this
        // engine's last, and a TPM just started holds nothing). An Unseal tried before the unlock would
        // add StartAuthSession, Load, PolicyNV and two FlushContext.
        EmbeddedTPM.reboot(storeDirectory: store.directory)
        await device.dropCaches()
        _ = await device.takeTPMCommandCount()
        #expect(try await storage.getItem("k") == "value")
        let first = await device.takeTPMCommandCount()
        #expect(first == 2 + 1 + 3 + unlock + coldRead,
                "the first read after the start: \(first) TPM commands, not 2 + 1 + 3 + an unlock's \(unlock) + a cold read's \(coldRead)")
        await device.dropCaches()
        #expect(try await unlocked.getItem("k") == "unlocked value")
        #expect(await device.takeTPMCommandCount() == coldRead, "later reads unseal at once")

        // With a passcode the start unlocks nothing: a whenUnlocked item stays closed until the passcode is given.
        try await device.setPasscode(bytes("2468"))
        EmbeddedTPM.reboot(storeDirectory: store.directory)
        await device.dropCaches()
        do {
            _ = try await unlocked.getItem("k")
            Issue.record("a whenUnlocked item was read after a TPM reset with a passcode set and no unlock")
        } catch {
            #expect(error.code == .interactionNotAllowed, "\(error)")
        }
        try await device.unlock(passcode: bytes("2468"))
        #expect(try await unlocked.getItem("k") == "unlocked value")
    }
}
