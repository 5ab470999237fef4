import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Synchronization
import Testing

/// Warm reads answered on the caller's thread (`Engine.warmGet`): no TPM command, no wait for the
/// engine's thread (issue 22 item 4: a frozen TPM must not hold them up), and never a value the
/// engine would refuse: a lock, a window's end, a write or a removal is seen at the next read.
/// In-process: `FrozenTPMTests` does the same through keychaind.
@Suite("Warm reads on the caller's thread", .offThePool)
struct WarmReadTests {
    static let pin = "2468"

    /// A call's error code, message and how long it took.
    static func timed(_ body: () async throws -> Void) async -> (code: KeychainError.Code?, message: String, took: Duration) {
        let started = ContinuousClock.now
        do {
            try await body()
            return (nil, "", ContinuousClock.now - started)
        } catch {
            let error = error as? KeychainError
            return (error?.code, error?.message ?? "", ContinuousClock.now - started)
        }
    }

    @Test func warmReadsAnswerWhileColdCallsWaitForAFrozenTPMAndColdCallsEndAtTheirDeadline() async throws {
        let tpm = try SoftwareTPM()
        var configuration = tpm.configuration()
        // Long enough that the warm reads below end before it on a loaded machine: a warm read that
        // waited for the frozen TPM would end at it or after it (firstDone below), not before.
        let deadline = Duration.seconds(90)
        configuration.tpmTimeout = deadline
        let warm = try createKeychain(.init(service: "warm"), configuration: configuration)
        let unlocked = try createKeychain(.init(service: "warm.unlocked", accessible: .whenUnlocked), configuration: configuration)
        try await warm.setItem("k", "v")
        try await unlocked.setItem("k", "w")
        #expect(try await warm.getItem("k") == "v")  // opens the keys
        #expect(try await unlocked.getItem("k") == "w")

        let pid = tpm.processIdentifier
        try #require(pid > 0)
        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        // Two writes that need new keys (TPM commands): the first waits for the TPM, the second
        // behind it in the engine's queue.
        let cold = try createKeychain(.init(service: "cold"), configuration: configuration)
        let firstDone = Mutex(false)
        let first = Task {
            defer { firstDone.withLock { $0 = true } }
            return await Self.timed { try await cold.setItem("k", "needs a new key") }
        }
        try await Task.sleep(for: .milliseconds(500))
        let second = Task { await Self.timed { try await cold.setItem("k2", "queued behind the first") } }
        try await Task.sleep(for: .milliseconds(500))

        let started = ContinuousClock.now
        for _ in 0..<100 {
            #expect(try await warm.getItem("k") == "v")
            #expect(try await unlocked.getItem("k") == "w")
        }
        let took = ContinuousClock.now - started
        // Ordered against the first cold call, not the clock: it ends only at its deadline.
        #expect(!firstDone.withLock { $0 }, "200 warm reads took \(took): they ended after the frozen TPM's deadline")

        // Each cold call fails at its own deadline, the one its message names: the second counts the
        // time it was queued behind the first, so it takes about as long as the first (without that,
        // about a deadline more: its queue time and then a deadline of its own). Compared with each other, not
        // with the clock: on a loaded machine a task may resume seconds after its call returned.
        let (firstResult, secondResult) = (await first.value, await second.value)
        for (name, result) in [("first", firstResult), ("second", secondResult)] {
            #expect(result.code == .hardwareUnavailable, "\(name): \(result.message)")
            #expect(result.message.contains("did not answer within \(deadline)"), "\(name): \(result.message)")
        }
        // Without the call-wide deadline the second would take about a whole deadline more (its queue
        // time, then a deadline of its own); half of one is the margin for a loaded machine.
        #expect(secondResult.took < firstResult.took + deadline / 2,
                "the queued cold call took \(secondResult.took), the first \(firstResult.took), against a deadline of \(deadline)")

        // The TPM answers again: so do cold calls.
        #expect(kill(pid, SIGCONT) == 0)
        try await cold.setItem("k", "after")
        #expect(try await cold.getItem("k") == "after")
    }

    @Test func aLockByAnotherProcessEndsWarmReadsOfWhenUnlockedItems() async throws {
        let tpm = try SoftwareTPM()
        let configuration = tpm.configuration()
        let device = KeychainDevice(configuration: configuration)
        try await device.setPasscode(bytes(Self.pin))
        let unlocked = try createKeychain(.init(service: "u", accessible: .whenUnlocked), configuration: configuration)
        let afterFirst = try createKeychain(.init(service: "a"), configuration: configuration)
        try await unlocked.setItem("k", "v")
        try await afterFirst.setItem("k", "a")
        #expect(try await unlocked.getItem("k") == "v")
        #expect(try await afterFirst.getItem("k") == "a")
        _ = await device.takeTPMCommandCount()
        #expect(try await unlocked.getItem("k") == "v")
        #expect(await device.takeTPMCommandCount() == 0, "a warm read")

        // Another process locks: this one's engine is not told; the store's lock generation is.
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let locked = try run(keychainctl, ["lock"], environment: tpm.environment)
        try #require(locked.status == 0, "\(locked.stderr)")
        #expect(await code { try await unlocked.getItem("k") } == .interactionNotAllowed)
        #expect(try await afterFirst.getItem("k") == "a", "an afterFirstUnlock item still reads while locked")
        try await device.unlock(passcode: bytes(Self.pin))
        #expect(try await unlocked.getItem("k") == "v")
    }

    @Test func warmReadsSeeEveryWriteAndRemovalWithoutATPMCommand() async throws {
        let tpm = try SoftwareTPM()
        let configuration = tpm.configuration()
        let device = KeychainDevice(configuration: configuration)
        let store = try createKeychain(.init(service: "s"), configuration: configuration)
        try await store.setItem("k", "v1")
        try await store.setItem("other", "o")
        #expect(try await store.getItem("k") == "v1")
        _ = await device.takeTPMCommandCount()
        try await store.setItem("k", "v2")
        #expect(try await store.getItem("k") == "v2")
        try await store.removeItem("k")
        #expect(try await store.getItem("k") == nil)
        try await store.setItem("k", "v3")
        #expect(try await store.getItem("k") == "v3")
        #expect(try await store.getItem("other") == "o")
        #expect(await device.takeTPMCommandCount() == 0, "the key stays open: no TPM command")
        try await store.clear()
        #expect(try await store.getItem("k") == nil)
        #expect(try await store.getItem("other") == nil)
    }

    /// A warm read keeps what it found while the store's data version stays the same
    /// (`WarmState.items`): another process's write, removal, or a stored byte changed by hand is a
    /// commit on another connection, so the next read looks again and never answers from what it kept.
    @Test func warmReadsSeeAnotherProcessesWritesRemovalsAndAChangedStoredByte() async throws {
        let tpm = try SoftwareTPM()
        let configuration = tpm.configuration()
        let device = KeychainDevice(configuration: configuration)
        let store = try createKeychain(.init(service: "s"), configuration: configuration)
        try await store.setItem("k", "v1")
        for _ in 0..<3 { #expect(try await store.getItem("k") == "v1") }
        _ = await device.takeTPMCommandCount()
        #expect(try await store.getItem("k") == "v1")
        #expect(await device.takeTPMCommandCount() == 0, "a warm read")

        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let set = try run(keychainctl, ["set", "s", "k"], input: Array("v2".utf8), environment: tpm.environment)
        try #require(set.status == 0, "\(set.stderr)")
        #expect(try await store.getItem("k") == "v2", "another process's write")
        #expect(try await store.getItem("k") == "v2")

        let removed = try run(keychainctl, ["rm", "s", "k"], environment: tpm.environment)
        try #require(removed.status == 0, "\(removed.stderr)")
        #expect(try await store.getItem("k") == nil, "another process's removal")
        #expect(try await store.getItem("k") == nil)

        try await store.setItem("k", "v3")
        #expect(try await store.getItem("k") == "v3")
        #expect(try await store.getItem("k") == "v3")
        // A byte of the stored value changed by another connection (no process of the keychain's):
        // the read checks the stored bytes again, and they fail authentication.
        let edit = try run("/usr/bin/python3", ["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                                                + "c.execute(\"UPDATE items SET ciphertext = zeroblob(length(ciphertext))\"); c.commit()",
                                                configuration.storeDirectory + "/keychain.db"])
        try #require(edit.status == 0, "\(edit.stderr)")
        #expect(await code { try await store.getItem("k") } == .dataCorrupted, "the changed stored byte")
        #expect(await device.takeTPMCommandCount() == 0, "no read needed the TPM")

        // The engine forgets its keys (no store change): what warm reads kept goes with them.
        try await store.setItem("k", "v4")
        #expect(try await store.getItem("k") == "v4")
        #expect(try await store.getItem("k") == "v4")
        await device.dropCaches()
        _ = await device.takeTPMCommandCount()
        #expect(try await store.getItem("k") == "v4")
        #expect(await device.takeTPMCommandCount() > 0, "after dropCaches the read unsealed the key again")
    }

    @Test func anAccessControlItemsWindowBoundsItsWarmReadsAndALockOrAPasscodeRemovalEndsIt() async throws {
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), reader: false, throughDaemon: false)
        func storage(_ service: String, window: Int) throws -> Keychain {
            try createKeychain(.init(service: service, accessControl: .passcode, authValidity: window), configuration: d.configuration)
        }
        // A window of 1 s: once it ended, the read asks again (a slow machine only makes that surer).
        let short = try storage("w.short", window: 1)
        try await short.setItem("k", "s")
        d.answers.push(.passcode(bytes(Self.pin)), .passcode(bytes(Self.pin)))
        #expect(try await short.getItem("k") == "s")
        try await Task.sleep(for: .seconds(1.5))
        #expect(try await short.getItem("k") == "s")
        #expect(d.answers.requests.count == 2, "the window ended: the read asked again")

        // A window of 10 minutes: within it, reads are warm (no prompt, no TPM command).
        let long = try storage("w.long", window: 600)
        try await long.setItem("k", "v")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await long.getItem("k") == "v")
        _ = await d.device.takeTPMCommandCount()
        #expect(try await long.getItem("k") == "v")
        #expect(d.answers.requests.count == 3, "within the window: no prompt")
        #expect(await d.device.takeTPMCommandCount() == 0, "a warm read within the window")

        // A lock forgets every opened key in this process: the next read goes to the TPM (which may
        // take the window's ticket instead of asking), never to the kept key.
        try await d.lock()
        try await d.unlock()
        _ = await d.device.takeTPMCommandCount()
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await long.getItem("k") == "v")
        #expect(await d.device.takeTPMCommandCount() > 0, "after a lock the read did not use the key kept before it")
        #expect(try await long.getItem("k") == "v")
        #expect(await d.device.takeTPMCommandCount() == 0, "a warm read within the window again")

        // The passcode goes: the item is dead, never read from the kept key.
        try await d.device.removePasscode(current: bytes(Self.pin))
        #expect(await code { try await long.getItem("k") } == .keyInvalidated)
    }
}
