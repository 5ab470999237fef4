import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
@testable import TPM2

/// keychaind on a chip (issue 39 item 3): a salted session kept between operations encrypts every
/// Unseal's answer, and the wrapping keys' contexts saved after its start make a first read a
/// ContextLoad instead of a Load. On the typical SPI profile, so that `--tpm-session auto` sees a chip.
@Suite("keychaind's kept session and saved contexts on a chip", .offThePool)
struct KeptChipSessionTests {
    typealias Command = TPMProfile.Command
    static let saved = "saved the contexts of"

    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM(profile: .typicalSPI)
        daemon = try KeychainDaemon(tpm: tpm)
    }

    func storage(_ service: String, _ accessible: Accessible = .afterFirstUnlock) throws -> Keychain {
        try createKeychain(.init(service: service, accessible: accessible), configuration: daemon.configuration())
    }

    /// keychaind stopped and started again, then its contexts saved: the next read of each key is a first read.
    func restartAndWaitForContexts() throws {
        let before = daemon.logLines(containing: Self.saved)
        kill(daemon.processIdentifier, SIGTERM)
        _ = daemon.waitForExit()
        try daemon.start()
        #expect(daemon.waitForLog(Self.saved, moreThan: before), "keychaind never said it saved the contexts")
    }

    /// The exchanges since `start`.
    func exchanges(since start: Int) -> [TPMExchange] { Array(tpm.exchangesSeen[start...]) }

    @Test func aFirstReadAfterTheStartIsAContextLoadAndAnUnsealUnderTheKeptSession() async throws {
        let storage = try storage("chip.first")
        try await storage.setItem("k", "v1")
        try restartAndWaitForContexts()
        #expect(daemon.logLines(containing: "a salted session is kept") >= 1)
        let start = tpm.exchangesSeen.count
        #expect(try await storage.getItem("k") == "v1")
        let read = exchanges(since: start)
        let commands = read.map(\.command)
        // The same 5 commands as a read with a session of its own (docs/performance.md), but neither
        // the salted StartAuthSession (33 ms on this profile) nor the Load (20 ms).
        #expect(commands == [Command.startAuthSession, Command.contextLoad, 0x149 /* PolicyNV */, Command.unseal, Command.flushContext],
                "\(commands.map { String($0, radix: 16) })")
        #expect(!read.contains { $0.salted } && read.allSatisfy { $0.responseCode == 0 })
    }

    /// The kept session encrypts each Unseal's answer: the same sealed key unsealed after two starts
    /// crosses the wire as two different answers (in the clear it would be the same bytes twice).
    @Test func theSameKeyUnsealedTwiceCrossesTheWireAsTwoDifferentAnswers() async throws {
        let storage = try storage("chip.wire")
        try await storage.setItem("k", "v1")
        var answers: [[UInt8]] = []
        for _ in 0..<2 {
            try restartAndWaitForContexts()
            let start = tpm.exchangesSeen.count
            #expect(try await storage.getItem("k") == "v1")
            let unseals = exchanges(since: start).filter { $0.command == Command.unseal && $0.responseCode == 0 }
            #expect(unseals.count == 1)
            answers += unseals.map(\.unsealAnswer)
        }
        #expect(answers.count == 2 && answers[0].count == answers[1].count && answers[0].count > 32)
        // The answer's parameter area: after the header (10 bytes) and parameterSize (4), the sealed
        // secret's TPM2B; the sessions' area (nonces, HMACs) after it differs either way.
        let secretSize = answers.first.map { Int($0[14]) << 8 | Int($0[15]) } ?? 0
        #expect(secretSize > 0)
        #expect(answers[0][16..<(16 + secretSize)] != answers[1][16..<(16 + secretSize)],
                "the Unseal's answer crossed the wire in the clear")
    }

    /// Another program flushes keychaind's kept session and starts its own, salted, at the same handle
    /// (it knows that session's key): the TPM refuses keychaind's Unseal under it before it runs (the
    /// policy session's HMAC covers the kept session's nonceTPM, TPM 2.0 Part 1 19.6.5: BAD_AUTH on
    /// session 1), keychaind starts a new session and reads.
    @Test func aKeptSessionSwappedByAnotherProgramIsRefusedAndReplaced() async throws {
        try await storage("chip.warm").setItem("k", "w")
        let target = try storage("chip.swap")
        try await target.setItem("k", "secret value")
        try restartAndWaitForContexts()
        #expect(try await storage("chip.warm").getItem("k") == "w")  // the kept session is in the TPM now

        let attacker = try TPMContext(device: tpm.device)
        let ours = try attacker.handles(from: 0x0200_0000)
        #expect(ours.count == 1, "keychaind's kept session: \(ours)")
        for handle in ours { try attacker.flush(tpmHandle: handle) }
        let srk = try attacker.resource(forPersistent: 0x8100_0001)
        let theirs = try attacker.startSession(.hmac, saltKey: srk, encryptResponse: true, continueSession: true)
        #expect(try attacker.handles(from: 0x0200_0000) == ours, "the attacker's session is at keychaind's handle")

        let start = tpm.exchangesSeen.count
        #expect(try await target.getItem("k") == "secret value")
        let read = exchanges(since: start)
        let unseals = read.enumerated().filter { $0.element.command == Command.unseal }
        #expect(unseals.count == 2, "\(read.map { String($0.command, radix: 16) })")
        #expect(unseals.first?.element.responseCode != 0, "an Unseal ran under the attacker's session")
        #expect(unseals.last?.element.responseCode == 0)
        if let refused = unseals.first?.offset, let answered = unseals.last?.offset {
            #expect(read[refused..<answered].contains { $0.command == Command.startAuthSession && $0.salted },
                    "a new salted session before the second Unseal")
        }
        attacker.flush(theirs)
    }

    /// A context saved before a TPM reset does not load on the TPM after it: the read loads the blob.
    @Test func aContextSavedBeforeATPMResetFallsBackToLoad() async throws {
        let storage = try storage("chip.reset")
        try await storage.setItem("k", "v1")
        try restartAndWaitForContexts()
        try tpm.reboot()
        let start = tpm.exchangesSeen.count
        #expect(try await storage.getItem("k") == "v1")
        let read = exchanges(since: start)
        let contextLoads = read.filter { $0.command == Command.contextLoad }
        #expect(contextLoads.count == 1 && contextLoads.allSatisfy { $0.responseCode != 0 },
                "\(read.map { (String($0.command, radix: 16), String($0.responseCode, radix: 16)) })")
        #expect(read.contains { $0.command == Command.load && $0.responseCode == 0 })
    }

    /// After a service's key is deleted and a new one made, the old key's saved context is never
    /// loaded for the new key: the read loads the new blob and answers the new value.
    @Test func aContextOfADeletedKeyIsNeverLoadedForItsSuccessor() async throws {
        let storage = try storage("chip.rotate", .whenUnlocked)
        try await storage.setItem("k", "old")
        try restartAndWaitForContexts()
        try await storage.clear()  // the service's items and wrapping key deleted
        try await storage.setItem("k", "new")  // a new wrapping key
        let device = KeychainDevice(configuration: daemon.configuration())
        try await device.lock()  // keychaind forgets whenUnlocked keys' secrets
        try await device.unlock(passcode: nil)
        let start = tpm.exchangesSeen.count
        #expect(try await storage.getItem("k") == "new")
        let commands = exchanges(since: start).map(\.command)
        #expect(commands.contains(Command.load) && !commands.contains(Command.contextLoad), "\(commands.map { String($0, radix: 16) })")
    }
}
