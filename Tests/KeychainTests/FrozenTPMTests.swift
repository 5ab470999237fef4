import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Synchronization
import Testing

/// Issue 22 item 4: a TPM that stops answering (swtpm stopped with SIGSTOP) under keychaind holds up
/// the calls that need it, and no other: another user's warm read (its key opened before, no TPM
/// command) is answered at once while root's cold calls wait for the TPM; and each cold call fails
/// at the deadline its message names (30 s), counted from when it was made, the one queued behind
/// another's included. `WarmReadTests` does the same in-process.
@Suite("keychaind with a frozen TPM", .offThePool)
struct FrozenTPMTests {
    static let nobody: UInt32 = 65534

    /// A keychainctl process that writes a value, timed from its start to its exit.
    final class ColdCall: Sendable {
        let process = Process()
        let started = ContinuousClock.now
        let ended = Mutex<ContinuousClock.Instant?>(nil)
        let errors = Pipe()

        /// - Parameters:
        ///   - input: its stdin (the value, or a passcode for `--passcode-stdin`).
        ///   - uid: another uid to run as (through `setpriv`); nil for this process's.
        init(_ keychainctl: String, _ arguments: [String], environment: [String: String], input text: String = "v", uid: UInt32? = nil) throws {
            let asUser = uid.map { ["--reuid=\($0)", "--regid=\($0)", "--clear-groups", keychainctl] } ?? []
            process.executableURL = URL(fileURLWithPath: uid == nil ? keychainctl : "/usr/bin/setpriv")
            process.arguments = asUser + arguments
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
            let input = Pipe()
            process.standardInput = input
            process.standardOutput = FileHandle.nullDevice
            process.standardError = errors
            process.terminationHandler = { [weak self] _ in self?.ended.withLock { $0 = .now } }
            try process.run()
            input.fileHandleForWriting.write(Data(text.utf8))
            try input.fileHandleForWriting.close()
        }

        var isRunning: Bool { ended.withLock { $0 == nil } }

        /// Its exit status, what it said on stderr, and when it ended.
        func wait() throws -> (status: Int32, stderr: String, end: ContinuousClock.Instant) {
            let what = "keychainctl \(process.arguments?.joined(separator: " ") ?? "")"
            let stderr = String(decoding: try read(errors.fileHandleForReading, until: what + " to end"), as: UTF8.self)
            try waitForExit(process, what)
            return (process.terminationStatus, stderr, ended.withLock { $0 } ?? .now)
        }
    }

    /// Whether the stopped swtpm has something unread on its command socket, a connection not accepted
    /// yet or a command's bytes: the Recv-Q that `ss -a` shows of the sockets bound to its path (a
    /// listening one counts the connections it has not accepted).
    static func tpmHasUnreadInput(_ tpm: SoftwareTPM) throws -> Bool {
        let listing = String(decoding: try run("/usr/bin/ss", ["-xan"]).stdout, as: UTF8.self)
        return listing.split(separator: "\n").contains { line in
            let fields = line.split(separator: " ")
            return fields.count > 4 && fields[4] == tpm.swtpmSocket && (Int(fields[2]) ?? 0) > 0
        }
    }

    @Test func anotherUsersWarmReadDoesNotWaitForAFrozenTPMAndColdCallsEndAtTheirDeadline() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        func asNobody(_ args: [String], input: String = "") throws -> (status: Int32, out: String) {
            let result = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl] + args,
                                 input: Array(input.utf8), environment: daemon.environment)
            return (result.status, String(decoding: result.stdout, as: UTF8.self))
        }
        #expect(try asNobody(["set", "mail", "token"], input: "nobody's").status == 0)
        #expect(try asNobody(["get", "mail", "token"]).out == "nobody's", "the read that opens the key")

        let pid = tpm.processIdentifier
        try #require(pid > 0)
        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        // Root's cold writes (a new key for their service: TPM commands): the first waits for the
        // TPM, the second behind it for the engine.
        #expect(try !Self.tpmHasUnreadInput(tpm), "the frozen TPM has nothing unread before the cold calls")
        let first = try ColdCall(keychainctl, ["set", "other", "k1"], environment: daemon.environment)
        try waitUntil("the first cold call to reach the frozen TPM") { try Self.tpmHasUnreadInput(tpm) }
        let second = try ColdCall(keychainctl, ["set", "other", "k2"], environment: daemon.environment)
        #expect(first.isRunning, "the cold call waits for the frozen TPM")

        // The TPM stays frozen for the first cold call's 30 s: a warm read that waited for it would
        // return after that call had ended.
        for _ in 0..<3 { #expect(try asNobody(["get", "mail", "token"]).out == "nobody's") }
        #expect(first.isRunning, "the TPM was still frozen when the warm reads returned")

        let results = try [first, second].map { try $0.wait() }
        for (name, result) in zip(["first", "second"], results) {
            #expect(result.status != 0, "the \(name) cold call")
            #expect(result.stderr.contains("did not answer within \(Duration.seconds(30))"), "\(name): \(result.stderr)")
        }
        // The first ends at its deadline, not at twice it (60 s, before); the margin is for the load.
        let firstTook = results[0].end - first.started
        #expect(firstTook < .seconds(50), "the first cold call took \(firstTook) against a deadline of 30 s")
        // Each deadline counts from its own call: the second, queued behind the first, ends about as long
        // after the first as it started after it. Without that it ended a whole deadline (30 s) after the
        // first; a machine's load delays both ends alike.
        let lag = (results[1].end - results[0].end) - (second.started - first.started)
        #expect(lag < .seconds(15), "the second cold call ended \(lag) later than its own deadline would have it")

        #expect(kill(pid, SIGCONT) == 0)
        let after = try run(keychainctl, ["set", "other", "k1"], input: Array("after".utf8), environment: daemon.environment)
        #expect(after.status == 0, "the TPM answers again: \(after.stderr)")
    }

    /// Issue 38 item 7: a uid's call waits for that uid's earlier call (keychaind lets each uid have one
    /// call in the engine at a time), and a passcode read waits for its prompt's answer; before, its
    /// TPM deadline counted from when it entered the engine, after both: a passcode read made 1 s
    /// after the same uid's cold write to a frozen TPM failed a whole deadline after that write did.
    /// Now the wait for the uid's turn counts and only the person's answer does not.
    @Test func aPasscodeReadQueuedBehindTheSameUidsColdCallEndsAtItsOwnDeadline() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        #expect(try run(keychainctl, ["passcode", "set"], input: Array("2468\n".utf8), environment: daemon.environment).status == 0)
        let written = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl,
                                                   "set", "own", "k", "--access-control", "passcode"],
                              input: Array("nobody's".utf8), environment: daemon.environment)
        #expect(written.status == 0, "\(written.stderr)")

        let pid = tpm.processIdentifier
        try #require(pid > 0)
        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        let write = try ColdCall(keychainctl, ["set", "other", "k1"], environment: daemon.environment, uid: Self.nobody)
        try waitUntil("the cold write to reach the frozen TPM") { try Self.tpmHasUnreadInput(tpm) }
        Thread.sleep(forTimeInterval: 1)
        let read = try ColdCall(keychainctl, ["get", "own", "k", "--passcode-stdin"], environment: daemon.environment,
                                input: "2468\n", uid: Self.nobody)
        let results = try [write, read].map { try $0.wait() }
        for (name, result) in zip(["write", "read"], results) {
            #expect(result.status != 0, "the \(name)")
            #expect(result.stderr.contains("did not answer within \(Duration.seconds(30))"), "\(name): \(result.stderr)")
        }
        // Each deadline counts from its own call: the read ends about as long after the write as it
        // started after it. Before, it ended a whole deadline (30 s) later; load delays both ends alike.
        let lag = (results[1].end - results[0].end) - (read.started - write.started)
        #expect(lag < .seconds(15), "the queued passcode read ended \(lag) later than its own deadline would have it")

        #expect(kill(pid, SIGCONT) == 0)
        let after = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl,
                                                 "get", "own", "k", "--passcode-stdin"],
                            input: Array("2468\n".utf8), environment: daemon.environment)
        #expect(String(decoding: after.stdout, as: UTF8.self) == "nobody's", "the TPM answers again: \(after.stderr)")
    }
}
