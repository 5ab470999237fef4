import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import TPM2
import Testing

/// Issue 18 (cold reads through keychaind) and issue 20: keychaind keeps its TPM connection, the
/// TPM's turn and a salted transport session from one TPM operation to the next (`--tpm-linger`),
/// so a cold read after the first sends no leftover check and no salted StartAuthSession. Counted
/// in TPM commands (`takeTPMCommandCount`, every command through `TPMContext.call`), never timed.
@Suite("keychaind's kept TPM connection", .offThePool)
struct KeptTPMConnectionTests {
    /// The TPM commands of one cold read through `daemon`: its key forgotten first (`dropCaches`).
    static func coldReadCommands(_ storage: Keychain, _ device: KeychainDevice, expecting value: String) async throws -> Int {
        await device.dropCaches()
        _ = await device.takeTPMCommandCount()
        #expect(try await storage.getItem("k") == value)
        return await device.takeTPMCommandCount()
    }

    @Test func aSecondColdReadReusesTheConnectionAndSessionOfTheFirst() async throws {
        let tpm = try SoftwareTPM()
        // Per operation (--tpm-linger 0, as before) and kept, on one TPM and store, one after the other.
        var counts: [String: [Int]] = [:]
        for (name, linger) in [("per operation", "0"), ("kept", "600")] {
            let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--tpm-linger", linger])
            let storage = try createKeychain(.init(service: "kept"), configuration: daemon.configuration())
            let device = KeychainDevice(configuration: daemon.configuration())
            if name == "per operation" { try await storage.setItem("k", "value") }
            // A new keychaind: its first read is its first TPM operation (a new connection), then two more.
            _ = daemon.kill()
            try daemon.start()
            var reads: [Int] = []
            for _ in 0..<3 { reads.append(try await Self.coldReadCommands(storage, device, expecting: "value")) }
            counts[name] = reads
            _ = daemon.kill()
        }
        let perOperation = try #require(counts["per operation"]), kept = try #require(counts["kept"])
        // First read: the leftover check (GetCapability), the passcode mark (NV_Read), the transport
        // session (a salted StartAuthSession), then the unseal (StartAuthSession, Load, PolicyNV,
        // Unseal, FlushContext). Later reads: the unseal alone, in an unsalted policy session.
        #expect(kept[1] < kept[0], "the second cold read costs fewer TPM commands than the first: \(kept)")
        #expect(kept[1] == kept[2], "later cold reads cost the same: \(kept)")
        #expect(kept[1] < perOperation[1],
                "a cold read on the kept connection costs fewer commands than one on a connection of its own: kept \(kept), per operation \(perOperation)")
        #expect(perOperation[1] == perOperation[2], "per operation, every later read costs the same: \(perOperation)")
    }

    @Test func theKeptSessionRecoversWhenTheTPMRestarts() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--tpm-linger", "600"])
        defer { _ = daemon.kill() }
        let device = KeychainDevice(configuration: daemon.configuration())
        // The default level (afterFirstUnlock) unseals in a policy session with the transport session
        // checking the Load and encrypting the answer; `always` (no policy, no unlock needed after a
        // reboot) in a salted session of its own, as before.
        let always = try createKeychain(.init(service: "kept.always", accessible: .always), configuration: daemon.configuration())
        let storage = try createKeychain(.init(service: "kept.default"), configuration: daemon.configuration())
        try await always.setItem("k", "always's")
        try await storage.setItem("k", "the default's")
        _ = try await Self.coldReadCommands(storage, device, expecting: "the default's")
        let before = try await Self.coldReadCommands(storage, device, expecting: "the default's")

        // swtpm restarted: a reboot. keychaind's ESAPI context is kept, the TPM lost its session.
        try tpm.reboot()
        _ = try await Self.coldReadCommands(always, device, expecting: "always's")
        try await device.unlock(passcode: nil)  // after a reboot; no passcode is set, so none is needed
        let afterReboot = try await Self.coldReadCommands(storage, device, expecting: "the default's")
        #expect(afterReboot > before,
                "the read after the restart was refused its Load (TPM_RC_REFERENCE_S1) and started a new session: \(before), then \(afterReboot)")
        let again = try await Self.coldReadCommands(storage, device, expecting: "the default's")
        #expect(again == before, "and kept it: \(before), \(afterReboot), then \(again)")

        // Once more, and the next TPM operation is a seal (the first write of a service): its Create
        // is refused for the lost session and made again with a new one.
        try tpm.reboot()
        #expect(try await storage.getItem("k") == "the default's", "a warm read needs no TPM")
        try await device.unlock(passcode: nil)
        let fresh = try createKeychain(.init(service: "kept.fresh"), configuration: daemon.configuration())
        try await fresh.setItem("k", "written after the restart")
        #expect(try await Self.coldReadCommands(fresh, device, expecting: "written after the restart") == before)
    }

    /// The sessions loaded in `tpm` now (tpm2-tools: the swtpm TCTI connects for each command, so
    /// other programs' commands come between keychaind's at any time).
    static func loadedSessions(_ tpm: SoftwareTPM) throws -> [String] {
        let listed = try run("/usr/bin/tpm2_getcap", ["handles-loaded-session"], environment: ["TPM2TOOLS_TCTI": tpm.tcti])
        #expect(listed.status == 0)
        return String(decoding: listed.stdout, as: UTF8.self).split(separator: "\n").compactMap { line in
            line.hasPrefix("- 0x") ? String(line.dropFirst(2)) : nil
        }
    }

    @Test func aSessionAnotherProgramFlushedIsReplacedAndAnIdleKeychaindLeavesNone() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--tpm-linger", "600"])
        defer { _ = daemon.kill() }
        let storage = try createKeychain(.init(service: "kept"), configuration: daemon.configuration())
        try await storage.setItem("k", "value")
        let device = KeychainDevice(configuration: daemon.configuration())
        // The first read also unlocks the device (no passcode) after its set-up: not counted.
        _ = try await Self.coldReadCommands(storage, device, expecting: "value")
        let steady = try await Self.coldReadCommands(storage, device, expecting: "value")
        let kept = try Self.loadedSessions(tpm)
        #expect(kept.count == 1, "keychaind keeps one session between operations: \(kept)")

        // Another program flushes it (anyone on a TPM without a resource manager can): keychaind's next
        // Load is refused for that session (TPM_RC_REFERENCE_S1), nothing was unsealed, and it reads
        // again with a new session.
        for handle in kept {
            #expect(try run("/usr/bin/tpm2_flushcontext", [handle], environment: ["TPM2TOOLS_TCTI": tpm.tcti]).status == 0)
        }
        let recovered = try await Self.coldReadCommands(storage, device, expecting: "value")
        #expect(recovered > steady, "the refused Load and a new salted session: \(steady), then \(recovered)")
        #expect(try await Self.coldReadCommands(storage, device, expecting: "value") == steady)
        #expect(try Self.loadedSessions(tpm).count == 1)

        // Idle for --tpm-linger, keychaind flushes its session and gives back its turn at the TPM.
        let idle = try KeychainDaemon(tpm: tpm, arguments: ["--tpm-linger", "0.2"])
        defer { _ = idle.kill() }
        _ = daemon.kill()
        let idleDevice = KeychainDevice(configuration: idle.configuration())
        let idleStorage = try createKeychain(.init(service: "kept"), configuration: idle.configuration())
        _ = try await Self.coldReadCommands(idleStorage, idleDevice, expecting: "value")
        var left = try Self.loadedSessions(tpm)
        for _ in 0..<300 where !left.isEmpty {
            try await Task.sleep(for: .milliseconds(100))
            left = try Self.loadedSessions(tpm)
        }
        #expect(left.isEmpty, "an idle keychaind left sessions loaded: \(left)")
        #expect(try await Self.coldReadCommands(idleStorage, idleDevice, expecting: "value") > steady,
                "after the release, a new session again")
    }

    /// On the wire (the pcap TCTI under keychaind): six cold reads of two items (keys with a policy)
    /// start one salted session between them (the transport), every Unseal answers encrypted in a
    /// session salted to the SRK and every Load is checked by it, and no value crosses in clear.
    @Test func theKeptSessionIsSaltedAndEncryptsEveryUnsealOnTheWire() async throws {
        let tpm = try SoftwareTPM()
        let values = ["default": "default-value-JKVM", "whenUnlocked": "unlocked-value-QXWZ"]
        do {
            let writer = try KeychainDaemon(tpm: tpm)
            defer { _ = writer.kill() }
            for (name, value) in values {
                let storage = try createKeychain(.init(service: "wire." + name, accessible: name == "default" ? .afterFirstUnlock : .whenUnlocked),
                                                 configuration: writer.configuration())
                try await storage.setItem("k", value)
                #expect(try await storage.getItem("k") == value)
            }
        }
        let capturePath = tpm.directory + "/kept.pcap"
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--tcti", "pcap:" + tpm.tcti, "--tpm-linger", "600"],
                                        environment: ["TCTI_PCAP_FILE": capturePath])
        let device = KeychainDevice(configuration: daemon.configuration())
        for _ in 0..<3 {
            for (name, value) in values {
                let storage = try createKeychain(.init(service: "wire." + name, accessible: name == "default" ? .afterFirstUnlock : .whenUnlocked),
                                                 configuration: daemon.configuration())
                _ = try await Self.coldReadCommands(storage, device, expecting: value)
            }
        }
        _ = daemon.kill()
        let capture = try TPMCapture(path: capturePath)
        let srk: UInt32 = 0x8100_0001
        let salted = capture.commands.filter { $0.code == CommandCode.startAuthSession && $0.handles.first == srk }
        let unseals = capture.commands.filter { $0.code == CommandCode.unseal }
        let loads = capture.commands.filter { $0.code == TPMCapture.load && $0.handles.first == srk }
        #expect(unseals.count == 6 && loads.count == 6, "\(unseals.count) Unseal, \(loads.count) Load")
        #expect(salted.count == 1, "six cold reads started \(salted.count) salted sessions, not one kept between them")
        for command in unseals {
            let encrypting = zip(command.sessions, command.authorizations).filter { $0.0?.saltedWith == srk && $0.1.encrypts }
            #expect(encrypting.count == 1, "an Unseal whose answer no session salted to the SRK encrypts")
        }
        for command in loads {
            #expect(command.sessions.contains { $0?.saltedWith == srk }, "a Load not checked by the salted session")
        }
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: capturePath)))
        for value in values.values {
            let needle = Array(value.utf8)
            let found = (0...(bytes.count - needle.count)).contains { bytes[$0..<$0 + needle.count].elementsEqual(needle) }
            #expect(!found, "\(value) crossed the TPM connection in clear")
        }
    }
}
