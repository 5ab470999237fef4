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

        init(_ keychainctl: String, _ arguments: [String], environment: [String: String]) throws {
            process.executableURL = URL(fileURLWithPath: keychainctl)
            process.arguments = arguments
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
            let input = Pipe()
            process.standardInput = input
            process.standardOutput = FileHandle.nullDevice
            process.standardError = errors
            process.terminationHandler = { [weak self] _ in self?.ended.withLock { $0 = .now } }
            try process.run()
            input.fileHandleForWriting.write(Data("v".utf8))
            try input.fileHandleForWriting.close()
        }

        var isRunning: Bool { ended.withLock { $0 == nil } }

        /// Its exit status, what it said on stderr, and how long it ran.
        func wait() -> (status: Int32, stderr: String, took: Duration) {
            let stderr = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            process.waitUntilExit()
            let end = ended.withLock { $0 } ?? .now
            return (process.terminationStatus, stderr, end - started)
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
        let first = try ColdCall(keychainctl, ["set", "other", "k1"], environment: daemon.environment)
        Thread.sleep(forTimeInterval: 1)
        let second = try ColdCall(keychainctl, ["set", "other", "k2"], environment: daemon.environment)
        Thread.sleep(forTimeInterval: 1)
        #expect(first.isRunning, "the cold call waits for the frozen TPM")

        // The TPM stays frozen for the first cold call's 30 s: a warm read that waited would take that long.
        let started = ContinuousClock.now
        for _ in 0..<3 { #expect(try asNobody(["get", "mail", "token"]).out == "nobody's") }
        let took = ContinuousClock.now - started
        #expect(took < .seconds(10), "three warm reads took \(took) while the TPM was frozen")
        #expect(first.isRunning, "the TPM was still frozen when the warm reads returned")

        for (name, call) in [("first", first), ("second", second)] {
            let result = call.wait()
            #expect(result.status != 0, "the \(name) cold call")
            #expect(result.stderr.contains("did not answer within \(Duration.seconds(30))"), "\(name): \(result.stderr)")
            // Without the deadline counted from the call, the second took about 29 s + 30 s.
            #expect(result.took < .seconds(34), "the \(name) cold call took \(result.took) against a deadline of 30 s")
        }

        #expect(kill(pid, SIGCONT) == 0)
        let after = try run(keychainctl, ["set", "other", "k1"], input: Array("after".utf8), environment: daemon.environment)
        #expect(after.status == 0, "the TPM answers again: \(after.stderr)")
    }
}
