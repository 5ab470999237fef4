import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 38 item 13: a call's deadline (30 s, counted from when keychaind read it) bounds each of its
/// TPM commands, not only its wait for the engine. Before, each command of an operation could take
/// what was left of the deadline when the operation began: the soak's `set` made during the TPM's
/// stall ended 43.6 s after keychaind read it.
@Suite("keychaind's call deadline bounds each TPM command", .offThePool)
struct CallDeadlineTests {
    typealias ColdCall = FrozenTPMTests.ColdCall
    static let nobody: UInt32 = 65534
    /// How long the chip takes for each Create: a cold write's one slow command.
    static let createTime: Duration = .seconds(12)

    /// keychaind on `tpm`, the keychainctl to call it with, and the TPM's pid (to stop and continue it).
    private static func started(_ tpm: SoftwareTPM) throws -> (SoftwareTPM, KeychainDaemon, String, pid_t) {
        let daemon = try KeychainDaemon(tpm: tpm)
        let pid = tpm.processIdentifier
        try #require(pid > 0)
        return (tpm, daemon, buildDirectory.appendingPathComponent("keychainctl").path, pid)
    }

    /// Root's cold write holds the TPM for a Create; nobody's cold write, made 1 s after it, waits for
    /// it (11 s), then its own Create is answered slowly (12 s), and the TPM stops (SIGSTOP) before its
    /// next command. Without the call's deadline on each command, that command waited what was left of
    /// the deadline when the operation began (19 s): the write ended about 42 s after it was made.
    @Test func aQueuedCallsCommandAfterASlowOneEndsAtTheCallsDeadline() throws {
        let (tpm, daemon, keychainctl, pid) = try Self.started(SoftwareTPM(profile: TPMProfile(name: "slow Create", latencies: [TPMProfile.Command.create: Self.createTime])))
        defer { kill(pid, SIGCONT) }
        func creates() -> Int { tpm.exchangesSeen.filter { $0.command == TPMProfile.Command.create }.count }
        let before = creates()

        let first = try ColdCall(keychainctl, ["set", "other", "k1"], environment: daemon.environment)
        try waitUntil("the first write's Create to be answered") { creates() > before }
        Thread.sleep(forTimeInterval: 1)
        let second = try ColdCall(keychainctl, ["set", "mail", "token"], environment: daemon.environment, uid: Self.nobody)
        // The second write's Create is answered and held back for the chip's time: its next command
        // reaches a stopped TPM.
        try waitUntil("the second write's Create to be answered") { creates() > before + 1 }
        #expect(kill(pid, SIGSTOP) == 0)
        let firstResult = try first.wait()
        #expect(firstResult.status == 0, "the first write, done before the TPM stopped: \(firstResult.stderr)")
        let result = try second.wait()
        let took = result.end - second.started
        // Its deadline is 30 s from when keychaind read it; 5 s are for the client's own start and
        // exit (at most 2.7 s in the soak's slices at load 40–65, docs/performance.md).
        #expect(took < .seconds(35), "the queued write took \(took) against a deadline of 30 s: \(result.stderr)")
        // The command cut short is the FlushContext of the write's session: the item was written.
        #expect(result.status == 0, "\(result.stderr)")

        #expect(kill(pid, SIGCONT) == 0)
        let read = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl,
                                                "get", "mail", "token"], environment: daemon.environment)
        #expect(String(decoding: read.stdout, as: UTF8.self) == "v", "the TPM answers again: \(read.stderr)")
    }

    /// Nobody's second cold write waits for nobody's turn behind the first, whose TPM command the stopped
    /// TPM holds for its whole deadline; meanwhile root's cold write, made 19 s after it, enters the
    /// engine. When the turn comes, the second write's job waits behind root's TPM command, which runs
    /// to root's deadline, 19 s after its own: before, it ended there. Now its thread answers at its
    /// own deadline, and its work, not begun, is never done.
    @Test func aCallQueuedBehindALaterCallsTPMCommandEndsAtItsOwnDeadline() throws {
        let (tpm, daemon, keychainctl, pid) = try Self.started(SoftwareTPM())
        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        let holding = try ColdCall(keychainctl, ["set", "first", "k"], environment: daemon.environment, uid: Self.nobody)
        try waitUntil("nobody's first write to reach the frozen TPM") { try FrozenTPMTests.tpmHasUnreadInput(tpm) }
        Thread.sleep(forTimeInterval: 1)
        let queued = try ColdCall(keychainctl, ["set", "second", "k"], environment: daemon.environment, uid: Self.nobody)
        Thread.sleep(forTimeInterval: 19)
        #expect(holding.isRunning && queued.isRunning, "both of nobody's writes wait for the frozen TPM")
        let later = try ColdCall(keychainctl, ["set", "other", "k"], environment: daemon.environment)

        let result = try queued.wait()
        let took = result.end - queued.started
        // 5 s are for the client's own start and exit, as above.
        #expect(took < .seconds(35), "the queued write took \(took) against a deadline of 30 s: \(result.stderr)")
        #expect(result.status != 0)
        #expect(result.stderr.contains("whole deadline (\(Duration.seconds(30)))"), "\(result.stderr)")
        for (name, call) in [("nobody's first", holding), ("root's", later)] {
            let ended = try call.wait()
            #expect(ended.stderr.contains("did not answer within \(Duration.seconds(30))"), "\(name) write: \(ended.stderr)")
        }

        #expect(kill(pid, SIGCONT) == 0)
        let read = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl,
                                                "get", "second", "k"], environment: daemon.environment)
        #expect(read.status != 0 && read.stdout.isEmpty, "the write given up at its deadline was not done later")
        let after = try run(keychainctl, ["set", "other", "k"], input: Array("after".utf8), environment: daemon.environment)
        #expect(after.status == 0, "the TPM answers again: \(after.stderr)")
    }

    /// Nobody's warm write (its key open: no TPM command) is made while root's cold write waits for the
    /// stopped TPM; root's second cold write, made 14 s later, queues behind it. When root's first ends
    /// at its deadline, nobody's write runs and writes at once, but the rest of its task (the hop back
    /// from the engine that posts its reply) was queued behind root's second, which the TPM holds to its
    /// own deadline, 14 s after nobody's: the write answered `ok` 44 s after it was made (the soak's
    /// 30-minute run). Now a running call's next job goes before the next call's first.
    @Test func aBegunCallIsAnsweredBeforeALaterCallsTPMCommandHoldsTheEngine() throws {
        let (tpm, daemon, keychainctl, pid) = try Self.started(SoftwareTPM())
        let nobody = ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl]
        let warm = try run("/usr/bin/setpriv", nobody + ["set", "mail", "token"], input: Array("before".utf8), environment: daemon.environment)
        try #require(warm.status == 0, "\(warm.stderr)")
        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        let holding = try ColdCall(keychainctl, ["set", "first", "k"], environment: daemon.environment)
        try waitUntil("root's first write to reach the frozen TPM") { try FrozenTPMTests.tpmHasUnreadInput(tpm) }
        Thread.sleep(forTimeInterval: 1)
        let write = try ColdCall(keychainctl, ["set", "mail", "token"], environment: daemon.environment, uid: Self.nobody)
        Thread.sleep(forTimeInterval: 14)
        let later = try ColdCall(keychainctl, ["set", "second", "k"], environment: daemon.environment)

        let result = try write.wait()
        let took = result.end - write.started
        // 5 s are for the client's own start and exit, as above.
        #expect(took < .seconds(35), "nobody's write took \(took) against a deadline of 30 s: \(result.stderr)")
        for call in [holding, later] { _ = try call.wait() }

        #expect(kill(pid, SIGCONT) == 0)
        // What it answered is what it did: `ok` and the new value, or a failure and the old one.
        let read = try run("/usr/bin/setpriv", nobody + ["get", "mail", "token"], environment: daemon.environment)
        let value = String(decoding: read.stdout, as: UTF8.self)
        #expect(value == (result.status == 0 ? "v" : "before"), "the write answered \(result.status): \(result.stderr); reads \(value)")
    }
}
