import Foundation
import Keychain
import KeychainTestSupport

/// `keychain-bench --profiles [swtpm|fast|typical|slow|old]…`: what a user waits for on each TPM
/// profile (docs/tpm-profiles.md), each figure a whole `keychainctl` process (keychaind's start: from
/// spawn to its "ready"), with the TPM commands the profile's proxy saw (the wire's count, every
/// process's own). `swtpm` is the same proxy adding nothing. docs/performance.md, "On the chips devices have".
func profileBench(names: [String], runs: Int) async throws -> String {
    let profiles = try names.map { name in
        guard let profile = TPMProfile.named[name] else {
            throw BenchFailure("--profiles: \(name) is not a profile: one of \(TPMProfile.named.keys.sorted().joined(separator: ", "))")
        }
        return (name, profile)
    }
    var results: [(name: String, rows: [ProfileRow])] = []
    for (name, profile) in profiles {
        FileHandle.standardError.write(Data("keychain-bench: profile \(name)…\n".utf8))
        results.append((name, try await ProfileRun(profile: profile, runs: runs).measure()))
    }
    return profileReport(results, runs: runs)
}

/// One operation's figure on one profile: the p50 of its samples and the TPM commands of one.
struct ProfileRow {
    let what: String
    var samples = Samples()
    var commands: [Int] = []

    init(_ what: String) { self.what = what }

    mutating func record(_ nanoseconds: UInt64, commands count: Int) {
        samples.record(nanoseconds)
        commands.append(count)
    }

    /// "12.3 ms (9)", the commands' range when samples differ.
    var cell: String {
        guard samples.count > 0 else { return "—" }
        let (low, high) = (commands.min() ?? 0, commands.max() ?? 0)
        return "\(Format.duration(samples.p50)) (\(low == high ? "\(low)" : "\(low)–\(high)"))"
    }
}

/// The measurements on one profile's TPM: a store of its own, keychainctl as a user runs it.
private struct ProfileRun {
    let tpm: SoftwareTPM
    let runs: Int
    let shell: Subprocess
    let keychainctl: String
    let store: String
    let passcode = Array("2468\n".utf8)
    let secret = String(repeating: "s", count: 32)
    /// The levels' reads: (level, access control or nil).
    static let reads: [(Accessible, String?)] = Accessible.allCases.flatMap { level in
        [(level, nil), (level, "biometryAny")]
    }

    init(profile: TPMProfile, runs: Int) throws {
        tpm = try SoftwareTPM(profile: profile)
        self.runs = runs
        let here = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
            .deletingLastPathComponent()
        keychainctl = here.appendingPathComponent("keychainctl").path
        guard FileManager.default.isExecutableFile(atPath: keychainctl) else { throw BenchFailure("no keychainctl beside the bench: \(keychainctl)") }
        store = tpm.directory + "/store"
        let scratch = tpm.directory + "/profile-bench"
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        shell = Subprocess(directory: scratch, extraEnvironment: ["KEYCHAIN_SOCKET": "", "KEYCHAIN_READER": ""])
    }

    /// `keychainctl --store … --tcti …` (this process's store, no daemon) with `arguments`, timed, into `row`.
    @discardableResult
    func direct(_ arguments: [String], input: [UInt8]? = nil, into row: inout ProfileRow) throws -> [UInt8] {
        try timed(into: &row) { try shell.check([keychainctl, "--store", store, "--tcti", tpm.tcti] + arguments, input: input).output }
    }

    func untimed(_ arguments: [String], input: [UInt8]? = nil) throws -> [UInt8] {
        try shell.check([keychainctl, "--store", store, "--tcti", tpm.tcti] + arguments, input: input).output
    }

    @discardableResult
    func timed<T>(into row: inout ProfileRow, _ body: () throws -> T) rethrows -> T {
        let before = tpm.commandsSeen.count
        let start = monotonicNanoseconds()
        let value = try body()
        row.record(monotonicNanoseconds() - start, commands: tpm.commandsSeen.count - before)
        return value
    }

    func measure() async throws -> [ProfileRow] {
        try setUpRows() + bootRows() + provisioningRows() + daemonRows()
    }

    /// `init`, `passcode set`, `reader enroll` and the writes.
    private func setUpRows() throws -> [ProfileRow] {
        let scratch = shell.directory
        var initRow = ProfileRow("`init` (provision the TPM and the store, take ownership)")
        try direct(["init", "--owner-auth-out", scratch + "/owner.auth", "--lockout-auth-out", scratch + "/lockout.auth"], into: &initRow)
        var passcodeRow = ProfileRow("`passcode set`")
        try direct(["passcode", "set"], input: passcode, into: &passcodeRow)
        var enrollRow = ProfileRow("`reader enroll` (the first finger: the reader's key made in the TPM)")
        try direct(["--owner-auth-file", scratch + "/owner.auth", "reader", "enroll", "thumb"], input: passcode, into: &enrollRow)
        var firstWrite = ProfileRow("`set` of a new service (a wrapping key made and sealed)")
        var write = ProfileRow("`set` over an item (the key exists)")
        var otherFirstWrites = ProfileRow("")
        for (level, control) in Self.reads {
            let arguments = ["set", Self.service(level, control), "k", "--accessible", level.rawValue] + (control.map { ["--access-control", $0] } ?? [])
            if control == nil && level == .afterFirstUnlock {
                try direct(arguments, input: Array(secret.utf8), into: &firstWrite)
            } else {
                try direct(arguments, input: Array(secret.utf8), into: &otherFirstWrites)
            }
        }
        for _ in 0..<runs { try direct(["set", Self.service(.afterFirstUnlock, nil), "k"], input: Array(secret.utf8), into: &write) }

        return [initRow, passcodeRow, enrollRow, firstWrite, write]
    }

    private func bootRows() throws -> [ProfileRow] {
        // After boot: a TPM reset, `unlock`, then the first read of each level in a process of its own.
        var unlock = ProfileRow("`unlock` after boot")
        var reads = Self.reads.map { level, control in
            ProfileRow("first `get` after boot: \(level.rawValue)" + (control.map { ", \($0) (finger)" } ?? ""))
        }
        for _ in 0..<runs {
            try tpm.reboot()
            try direct(["unlock"], input: passcode, into: &unlock)
            for (index, (level, control)) in Self.reads.enumerated() {
                let value = try direct(["get", Self.service(level, control), "k"] + (control == nil ? [] : ["--touch", "thumb"]), into: &reads[index])
                guard value == Array(secret.utf8) else { throw BenchFailure("get \(level) returned another value") }
            }
        }

        return [unlock] + reads
    }

    private func provisioningRows() throws -> [ProfileRow] {
        let scratch = shell.directory
        // Attestation and provisioning (seal-for needs no TPM; import is on this device).
        var attestRespond = ProfileRow("`attest respond` (ActivateCredential)")
        var sealFor = ProfileRow("`seal-for` (no TPM)")
        var importRow = ProfileRow("`import` of a sealed bundle (EK parent)")
        _ = try untimed(["attest", "init", "--owner-auth-file", scratch + "/owner.auth"])
        for run in 0..<runs {
            let request = try untimed(["attest", "request"])
            try Data(request).write(to: URL(fileURLWithPath: scratch + "/request.json"))
            let challenge = try shell.check([keychainctl, "attest", "challenge", scratch + "/request.json", "--state", scratch + "/state-\(run).json",
                                             "--ledger", scratch + "/ledger"]).output
            try Data(challenge).write(to: URL(fileURLWithPath: scratch + "/challenge.json"))
            try direct(["attest", "respond", scratch + "/challenge.json"], into: &attestRespond)
            let identity = scratch + "/identity-\(run).json"
            _ = try untimed(["identity", "--out", identity])
            let bundle = try timed(into: &sealFor) {
                try shell.check([keychainctl, "seal-for", identity, "bench.import", "k\(run)"], input: Array(secret.utf8)).output
            }
            try Data(bundle).write(to: URL(fileURLWithPath: scratch + "/bundle.json"))
            try direct(["import", scratch + "/bundle.json"], into: &importRow)
        }

        return [attestRespond, sealFor, importRow]
    }

    private func daemonRows() throws -> [ProfileRow] {
        let scratch = shell.directory
        // keychaind: its start after a TPM reset (the device unlocked first, directly), then the first
        // read of an afterFirstUnlock item through it, against tpm2-tools' `tpm2_load && tpm2_unseal`.
        var daemonStart = ProfileRow("keychaind's start, after boot (spawn to ready)")
        var daemonPrepared = ProfileRow("keychaind's preparation after ready (`--tpm-session auto` on a chip: the wrapping keys' contexts saved)")
        var daemonRead = ProfileRow("first `keychainctl get` through keychaind after its start (afterFirstUnlock; on a chip once its contexts are saved)")
        var bare = ProfileRow("tpm2-tools: `tpm2_load && tpm2_unseal` (two processes, the same SRK)")
        let daemon = try KeychainDaemon(tpm: tpm, store: store, reader: store + ".reader")
        let throughDaemon = Subprocess(directory: scratch, extraEnvironment: daemon.environment)
        try throughDaemon.check([keychainctl, "set", "bench.daemon", "k", "--accessible", "afterFirstUnlock"], input: Array(secret.utf8))
        for _ in 0..<runs {
            kill(daemon.processIdentifier, SIGTERM)
            _ = daemon.waitForExit()
            try tpm.reboot()
            _ = try untimed(["unlock"], input: passcode)
            let saidBefore = daemon.logLines(containing: Self.contextsSaved)
            try timed(into: &daemonStart) { try daemon.start() }
            if (tpm.profile?.saltedSession ?? .zero) > .zero {
                try timed(into: &daemonPrepared) {
                    guard daemon.waitForLog(Self.contextsSaved, moreThan: saidBefore) else {
                        throw BenchFailure("keychaind did not say it saved the wrapping keys' contexts")
                    }
                }
            }
            let value = try timed(into: &daemonRead) { try throughDaemon.check([keychainctl, "get", "bench.daemon", "k"]).output }
            guard value == Array(secret.utf8) else { throw BenchFailure("the get through keychaind returned another value") }
        }
        kill(daemon.processIdentifier, SIGTERM)
        _ = daemon.waitForExit()
        if let tools = try TPM2ToolsRead(tpm: tpm, secret: secret, directory: scratch + "/tpm2-load-unseal") {
            for _ in 0..<runs {
                let before = tpm.commandsSeen.count
                var after = before
                let took = try tools.read { after = tpm.commandsSeen.count }
                bare.record(took, commands: after - before)
            }
        }
        return [daemonStart, daemonPrepared, daemonRead, bare]
    }

    /// keychaind's log line once its contexts are saved (`DaemonServer.saveWrappingKeyContexts`).
    static let contextsSaved = "saved the contexts of"

    static func service(_ level: Accessible, _ control: String?) -> String {
        "bench.\(level.rawValue)" + (control.map { ".\($0)" } ?? "")
    }
}

/// The table: one row per operation, one column per profile; then the first read through keychaind
/// against the bare pipeline.
private func profileReport(_ results: [(name: String, rows: [ProfileRow])], runs: Int) -> String {
    var report = "## On TPM profiles (keychain-bench --profiles)\n\n"
    report += "p50 of \(runs) runs (one for init, passcode set, reader enroll and a new service's set) and, in brackets, "
        + "the TPM commands the proxy saw for one.\n\n"
    report += "| what | " + results.map { "`\($0.name)`" }.joined(separator: " | ") + " |\n"
    report += "|---|" + results.map { _ in "---|" }.joined() + "\n"
    guard let first = results.first else { return report }
    for index in first.rows.indices {
        report += "| \(first.rows[index].what) | " + results.map { $0.rows[index].cell }.joined(separator: " | ") + " |\n"
    }
    report += "\nFirst read through keychaind vs `tpm2_load && tpm2_unseal`: "
    report += results.map { result in
        let rows = Dictionary(uniqueKeysWithValues: result.rows.map { ($0.what, $0) })
        guard let read = rows.values.first(where: { $0.what.hasPrefix("first `keychainctl get` through keychaind") }),
              let bare = rows.values.first(where: { $0.what.hasPrefix("tpm2-tools") }), bare.samples.count > 0 else { return "\(result.name) —" }
        return "\(result.name) \(Format.ratio(Double(bare.samples.p50) / Double(read.samples.p50)))"
    }.joined(separator: ", ") + " (p50s).\n"
    return report
}
