import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// A write whose client is gone before it is made is not made (`CallerPresence`). Before, keychaind
/// made it in its turn, which could come after the write of the program that took the killed one's
/// place: the soak's CI failure (2026-12-07), where a read found a value older than the last one
/// acknowledged. `scripts/killed-write-order.py` shows the order itself under load.
@Suite("keychaind makes no write of a client that is gone", .offThePool)
struct GoneCallerTests {
    typealias ColdCall = FrozenTPMTests.ColdCall
    static let nobody: UInt32 = 65534

    /// Nobody's write and nobody's clearing of a service wait behind root's cold write, which the
    /// stopped TPM holds; both their clients are killed once keychaind has read their requests. When the
    /// TPM runs again their turns come: nothing of theirs is made, and nobody's next write is.
    @Test func aWriteAndAClearingWhoseClientsWereKilledWhileTheyWaitedAreNotMade() throws {
        let times = FileManager.default.temporaryDirectory.appendingPathComponent("gone-caller-\(UUID().uuidString).times").path
        defer { unlink(times) }
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, environment: ["KEYCHAIN_TEST_REQUEST_TIMES": times])
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let pid = tpm.processIdentifier
        try #require(pid > 0)
        func asNobody(_ args: [String], input: String = "") throws -> (status: Int32, out: String, err: String) {
            let result = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", keychainctl] + args,
                                 input: Array(input.utf8), environment: daemon.environment)
            return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
        }
        try #require(try asNobody(["set", "mail", "token"], input: "before").status == 0)
        try #require(try asNobody(["set", "cache", "entry"], input: "kept").status == 0)

        #expect(kill(pid, SIGSTOP) == 0)
        defer { kill(pid, SIGCONT) }
        let holding = try ColdCall(keychainctl, ["set", "first", "k"], environment: daemon.environment)
        try waitUntil("root's cold write to reach the stopped TPM") { try FrozenTPMTests.tpmHasUnreadInput(tpm) }
        let write = try ColdCall(keychainctl, ["set", "mail", "token"], environment: daemon.environment, input: "killed", uid: Self.nobody)
        let clearing = try ColdCall(keychainctl, ["clear", "cache"], environment: daemon.environment, uid: Self.nobody)
        // keychaind has read both requests (its debug builds' record of each request's peer pid).
        let pids = [write.process.processIdentifier, clearing.process.processIdentifier]
        try waitUntil("keychaind to read the two requests") {
            let lines = (try? String(contentsOfFile: times, encoding: .utf8)) ?? ""
            let read = Set(lines.split(separator: "\n").compactMap { $0.split(separator: " ").first.flatMap { Int32($0) } })
            return pids.allSatisfy(read.contains)
        }
        #expect(write.isRunning && clearing.isRunning, "both wait behind root's write")
        for pid in pids { kill(pid, SIGKILL) }
        for call in [write, clearing] { _ = try call.wait() }

        #expect(kill(pid, SIGCONT) == 0)
        let held = try holding.wait()
        #expect(held.status == 0, "root's write, made once the TPM runs again: \(held.stderr)")
        // Nobody's next write goes in after the killed two, in nobody's order of arrival: they were served.
        let next = try asNobody(["set", "mail", "other"], input: "next")
        #expect(next.status == 0, "\(next.err)")
        #expect(try asNobody(["get", "mail", "token"]).out == "before", "the killed client's write was not made")
        #expect(try asNobody(["get", "cache", "entry"]).out == "kept", "the killed client's clearing was not made")
        #expect(try asNobody(["get", "mail", "other"]).out == "next", "a client that stays has its write made")
    }
}
