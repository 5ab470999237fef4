import Foundation
import Keychain
import KeychainTestSupport

/// `keychain-bench --daemon`: keychaind on a private swtpm, against tpm2-tools' policy pipeline for
/// the same kind of secret, one run side by side (docs/performance.md, "keychaind").
func daemonBench(runs: Int, clients: Int, readsPerClient: Int) async throws -> String {
    let tpm = try SoftwareTPM()
    let daemon = try KeychainDaemon(tpm: tpm)
    let (configuration, device, secret) = try await storeBenchSecret(through: daemon)
    let scratch = tpm.directory + "/daemon-bench"
    try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
    let here = URL(fileURLWithPath: (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0])
        .deletingLastPathComponent()
    // keychainctl is the lean front; keychainctl-full the whole tool it runs for what it does not do.
    let keychainctl = here.appendingPathComponent("keychainctl").path
    let full = here.appendingPathComponent("keychainctl-full").path

    // 1. The whole `keychainctl get` process through the daemon, the full tool's for comparison, and
    // start-up alone: the front with no daemon to answer (its connect fails at once), `--help` (the
    // front runs the full tool), /bin/true.
    var processes = try await processRuns(runs: runs, scratch: scratch, environment: daemon.environment, secret: secret,
                                          keychainctl: keychainctl, full: full, device: device)
    processes.get.tpmCommands = await device.takeTPMCommandCount()
    let (get, fullGet, help) = (processes.get, processes.fullGet, processes.help)
    let (frontStart, fullHelp, trueProcess) = (processes.frontStart, processes.fullHelp, processes.trueProcess)

    // 2. tpm2-tools on the same TPM: a secret sealed to PCR 7 under the same SRK, read as a shell
    // user would (load, policy session, PolicyPCR, unseal, flush: five processes).
    let tools = try tpm2ToolsPolicyPipeline(tpm: tpm, secret: secret, runs: runs, scratch: scratch)

    // 3. Concurrent clients in this process, each read a call of its own (connections are reused).
    _ = await device.takeTPMCommandCount()
    let reads = await concurrentReads(configuration, clients: clients, readsPerClient: readsPerClient, secret: secret)
    var concurrent = reads.samples
    let (errors, aggregate) = (reads.errors, reads.readsPerSecond)
    concurrent.tpmCommands = await device.takeTPMCommandCount()

    // 4. Cold reads through keychaind: the first read of a storage's key by a daemon that holds no
    // key (dropCaches: what a daemon that just started holds), by a client of this process, against
    // tpm2-tools' cheapest read of the same kind of secret under the same SRK, alternated (a TPM
    // connection and salted session per operation).
    let loadAndUnseal = try TPM2ToolsRead(tpm: tpm, secret: secret, directory: scratch + "/tpm2-load-unseal")
    let (coldRead, loadUnseal) = try await coldReads(configuration, runs: runs, secret: secret, loadAndUnseal: loadAndUnseal)

    // 5. In-process warm getItem, one caller, in this run too (its own swtpm and store).
    let inProcess = try await warmReadBench(reads: runs * 5_000)

    var report = "## keychaind (keychain-bench --daemon)\n\n"
    report += "One run: \(ProcessInfo.processInfo.activeProcessorCount) cores, swtpm on a Unix socket, a 32-byte secret, "
        + "\(runs) process runs, \(clients) clients × \(readsPerClient) reads.\n\n"
    report += "| what | p50 | p99 | TPM commands per op |\n|---|---|---|---|\n"
    report += "| `keychainctl get` through keychaind (whole process: the front, no Foundation) | \(Format.duration(get.p50)) | \(Format.duration(get.p99)) | \(Format.commands(get.commandsPerOp)) |\n"
    if let tools {
        report += "| tpm2-tools: load, startauthsession, policypcr, unseal, flushcontext (five processes) | \(Format.duration(tools.p50)) | \(Format.duration(tools.p99)) | — |\n"
    }
    report += "| `keychainctl-full get` through keychaind (the whole tool: Foundation, tpm2-tss, OpenSSL, SQLite) | \(Format.duration(fullGet.p50)) | \(Format.duration(fullGet.p99)) | 0 |\n"
    report += "| `keychainctl get` with no daemon (the front's start-up and a refused connect) | \(Format.duration(frontStart.p50)) | \(Format.duration(frontStart.p99)) | 0 |\n"
    report += "| `keychainctl --help` (the front, then the full tool's start-up) | \(Format.duration(help.p50)) | \(Format.duration(help.p99)) | 0 |\n"
    report += "| `keychainctl-full --help` (the full tool's start-up alone: the front's hand-over costs the difference) | \(Format.duration(fullHelp.p50)) | \(Format.duration(fullHelp.p99)) | 0 |\n"
    report += "| `/bin/true` (the spawn-and-reap floor) | \(Format.duration(trueProcess.p50)) | \(Format.duration(trueProcess.p99)) | 0 |\n"
    report += "| cold read through keychaind (its first read of the key: the daemon forgot every key, `dropCaches`; the connection kept from its last operation, a salted session per operation) | \(Format.duration(coldRead.p50)) | \(Format.duration(coldRead.p99)) | \(Format.commands(Double(coldRead.tpmCommands) / Double(runs + 1))) |\n"
    if loadUnseal.count > 0 {
        report += "| tpm2-tools: `tpm2_load && tpm2_unseal` of a 32-byte secret under the same SRK (two processes), alternated with the row above | \(Format.duration(loadUnseal.p50)) | \(Format.duration(loadUnseal.p99)) | — |\n"
    }
    report += "| one read of \(clients) concurrent clients (in one process; a client keeps its connections between calls) | \(Format.duration(concurrent.p50)) | \(Format.duration(concurrent.p99)) | \(Format.commands(concurrent.commandsPerOp)) |\n\n"
    if let tools {
        report += "`keychainctl get` through keychaind vs tpm2-tools: \(Format.ratio(Double(tools.p50) / Double(get.p50))) faster (p50); "
            + "`keychainctl-full get` \(Format.ratio(Double(tools.p50) / Double(fullGet.p50))).\n"
    }
    if loadUnseal.count > 0 {
        report += "Cold read through keychaind vs `tpm2_load && tpm2_unseal`: \(Format.ratio(Double(loadUnseal.p50) / Double(coldRead.p50))) faster (p50).\n"
    }
    report += "In-process \(inProcess).\n"

    report += "\(clients) clients × \(readsPerClient) reads: \(Format.rate(aggregate)) reads/s aggregate, "
        + "\(errors) errors, \(concurrent.tpmCommands) TPM commands in all.\n"
    return report
}

/// The process runs of `daemonBench`'s part 1 (the first run not kept).
private struct ProcessSamples {
    var get, fullGet, help, frontStart, fullHelp, trueProcess: Samples
}

private func processRuns(runs: Int, scratch: String, environment: [String: String], secret: String, keychainctl: String,
                         full: String, device: KeychainDevice) async throws -> ProcessSamples {
    let shell = Subprocess(directory: scratch, extraEnvironment: environment)
    let noDaemon = Subprocess(directory: scratch, extraEnvironment: ["KEYCHAIN_SOCKET": scratch + "/nothing.sock"])
    var get = Samples(capacity: runs), fullGet = Samples(capacity: runs), help = Samples(capacity: runs)
    var frontStart = Samples(capacity: runs), fullHelp = Samples(capacity: runs), trueProcess = Samples(capacity: runs)
    _ = await device.takeTPMCommandCount()
    for run in 0...runs {
        let result = try shell.check([keychainctl, "get", "bench", "k0"])
        guard result.output == Array(secret.utf8) else { throw BenchFailure("keychainctl get returned another value") }
        let whole = try shell.check([full, "get", "bench", "k0"])
        guard whole.output == Array(secret.utf8) else { throw BenchFailure("keychainctl-full get returned another value") }
        let start = try shell.check([keychainctl, "--help"])
        let fullStart = try shell.check([full, "--help"])
        let refused = try noDaemon.run([keychainctl, "get", "bench", "k0"])
        guard refused.status == 3 else { throw BenchFailure("keychainctl get without a daemon: exit \(refused.status), not 3") }
        let floor = try shell.check(["/bin/true"])
        if run > 0 {
            get.record(result.nanoseconds); fullGet.record(whole.nanoseconds)
            help.record(start.nanoseconds); fullHelp.record(fullStart.nanoseconds)
            frontStart.record(refused.nanoseconds); trueProcess.record(floor.nanoseconds)
        }
    }
    return ProcessSamples(get: get, fullGet: fullGet, help: help, frontStart: frontStart, fullHelp: fullHelp,
                          trueProcess: trueProcess)
}

/// Cold reads through keychaind (`daemonBench`'s part 4), alternated with tpm2-tools' `loadAndUnseal`.
private func coldReads(_ configuration: KeychainConfiguration, runs: Int, secret: String,
                       loadAndUnseal: TPM2ToolsRead?) async throws -> (reads: Samples, tools: Samples) {
    var coldRead = Samples(capacity: runs), loadUnseal = Samples(capacity: runs)
    let device = KeychainDevice(configuration: configuration)
    let cold = try createKeychain(.init(service: "bench.cold"), configuration: configuration)
    try await cold.setItem("k0", secret)
    await device.dropCaches()
    guard try await cold.getItem("k0") == secret else { throw BenchFailure("the daemon's cold read returned another value") }
    _ = await device.takeTPMCommandCount()
    for run in 0...runs {
        await device.dropCaches()
        let start = monotonicNanoseconds()
        let value = try await cold.getItem("k0")
        let took = monotonicNanoseconds() - start
        guard value == secret else { throw BenchFailure("the daemon's cold read returned another value") }
        let tools = try loadAndUnseal?.read()
        if run > 0 {
            coldRead.record(took)
            tools.map { loadUnseal.record($0) }
        }
    }
    coldRead.tpmCommands = await device.takeTPMCommandCount()
    return (coldRead, loadUnseal)
}

/// `tpm2_create` with a PCR 7 policy under the persistent SRK, then `runs` reads (the first not kept).
private func tpm2ToolsPolicyPipeline(tpm: SoftwareTPM, secret: String, runs: Int, scratch: String) throws -> Samples? {
    let tools = ["tpm2_createpolicy", "tpm2_create", "tpm2_load", "tpm2_startauthsession", "tpm2_policypcr", "tpm2_unseal",
                 "tpm2_flushcontext"]
    guard tools.allSatisfy(Subprocess.isInstalled) else { return nil }
    let directory = scratch + "/tpm2-tools"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    let secretFile = directory + "/secret.bin"
    guard FileManager.default.createFile(atPath: secretFile, contents: Data(secret.utf8), attributes: [.posixPermissions: 0o600]) else {
        throw BenchFailure("cannot write \(secretFile)")
    }
    let shell = Subprocess(directory: directory, extraEnvironment: ["TPM2TOOLS_TCTI": tpm.tcti])
    try shell.check(["tpm2_flushcontext", "-t"])
    try shell.check(["tpm2_flushcontext", "-s"])
    try shell.check(["tpm2_createpolicy", "--policy-pcr", "-l", "sha256:7", "-L", directory + "/pcr.policy", "-Q"])
    try shell.check(["tpm2_create", "-C", "0x81000001", "-L", directory + "/pcr.policy", "-i", secretFile,
                     "-u", directory + "/seal.pub", "-r", directory + "/seal.priv", "-Q"])
    var samples = Samples(capacity: runs)
    for run in 0...runs {
        var total: UInt64 = 0
        total += try shell.check(["tpm2_load", "-C", "0x81000001", "-u", directory + "/seal.pub", "-r", directory + "/seal.priv",
                                  "-c", directory + "/seal.ctx", "-Q"]).nanoseconds
        total += try shell.check(["tpm2_startauthsession", "--policy-session", "-S", directory + "/session.ctx"]).nanoseconds
        total += try shell.check(["tpm2_policypcr", "-S", directory + "/session.ctx", "-l", "sha256:7", "-Q"]).nanoseconds
        let unseal = try shell.check(["tpm2_unseal", "-c", directory + "/seal.ctx", "-p", "session:" + directory + "/session.ctx"])
        guard unseal.output == Array(secret.utf8) else { throw BenchFailure("tpm2_unseal returned another value") }
        total += unseal.nanoseconds
        total += try shell.check(["tpm2_flushcontext", directory + "/session.ctx"]).nanoseconds
        // The loaded object: the kernel's resource manager would flush it; swtpm has none (untimed).
        try shell.check(["tpm2_flushcontext", "-t"])
        if run > 0 { samples.record(total) }
    }
    return samples
}

/// `clients` tasks of this process, each with a storage of its own, reading `k0` `readsPerClient`
/// times, every value checked: each read's time, the reads that failed or returned another value,
/// and the reads per second of all together.
/// With `ownThreads`, each client's task prefers a thread of its own (`SerialThreadExecutor`, as the
/// vault's synchronous calls do), so it waits for keychaind's replies there instead of hopping to
/// Dispatch's global threads: the 16 clients are then 16 callers in flight at once, as 16 processes
/// with one thread each would be.
func concurrentReads(_ configuration: KeychainConfiguration, clients: Int, readsPerClient: Int,
                     secret: String, ownThreads: Bool = false) async -> (samples: Samples, errors: Int, readsPerSecond: Double) {
    let threads = ownThreads ? (0..<clients).map { SerialThreadExecutor(name: "bench.client.\($0)") } : []
    defer { for thread in threads { thread.stop() } }
    let started = monotonicNanoseconds()
    let perClient = await withTaskGroup(of: (Samples, Int).self) { group in
        for client in 0..<clients {
            group.addTask(executorPreference: ownThreads ? threads[client] : nil) {
                var samples = Samples(capacity: readsPerClient)
                var errors = 0
                guard let mine = try? createKeychain(.init(service: "bench"), configuration: configuration) else {
                    return (samples, readsPerClient)
                }
                for _ in 0..<readsPerClient {
                    let start = monotonicNanoseconds()
                    let value = try? await mine.getItem("k0")
                    samples.record(monotonicNanoseconds() - start)
                    if value != secret { errors += 1 }
                }
                return (samples, errors)
            }
        }
        var all: [(Samples, Int)] = []
        for await result in group { all.append(result) }
        return all
    }
    let elapsed = monotonicNanoseconds() - started
    var samples = Samples(capacity: clients * readsPerClient)
    for (client, _) in perClient { for ns in client.nanoseconds { samples.record(ns) } }
    return (samples, perClient.reduce(0) { $0 + $1.1 }, Double(samples.count) / (Double(elapsed) / 1e9))
}

/// `--daemon-concurrent-reads CLIENTS READS`: only the concurrent warm reads of `--daemon` (keychaind
/// on a private swtpm, `CLIENTS` clients of this process × `READS` reads each), for `perf stat` and
/// `strace -c` of that part alone.
func concurrentReadBench(clients: Int, readsPerClient: Int, ownThreads: Bool = false) async throws -> String {
    try await withBenchDaemon { daemon in try await concurrentReads(through: daemon, clients: clients, readsPerClient: readsPerClient,
                                                                  ownThreads: ownThreads) }
}

/// Runs `body` with keychaind on a private swtpm of its own, both stopped on every path.
func withBenchDaemon<T>(_ body: (KeychainDaemon) async throws -> T) async throws -> T {
    let tpm = try SoftwareTPM()
    defer { tpm.stop() }
    let daemon = try KeychainDaemon(tpm: tpm)
    defer {
        kill(daemon.processIdentifier, SIGTERM)
        _ = daemon.waitForExit()
    }
    return try await body(daemon)
}

private func concurrentReads(through daemon: KeychainDaemon, clients: Int, readsPerClient: Int, ownThreads: Bool) async throws -> String {
    let (configuration, device, secret) = try await storeBenchSecret(through: daemon)
    _ = await device.takeTPMCommandCount()
    let (samples, errors, rate) = await concurrentReads(configuration, clients: clients, readsPerClient: readsPerClient, secret: secret,
                                                        ownThreads: ownThreads)
    let commands = await device.takeTPMCommandCount()
    return "\(clients) clients\(ownThreads ? " on threads of their own" : "") × \(readsPerClient) warm reads through keychaind: \(Format.rate(rate)) reads/s aggregate, "
        + "p50 \(Format.duration(samples.p50)), p99 \(Format.duration(samples.p99)), \(errors) errors, \(commands) TPM commands"
}

/// The set-up `--daemon` and `--daemon-concurrent-reads` share: a 32-byte secret stored as `bench`'s `k0`
/// through `daemon` and read back once.
private func storeBenchSecret(through daemon: KeychainDaemon) async throws
    -> (configuration: KeychainConfiguration, device: KeychainDevice, secret: String) {
    let configuration = daemon.configuration()
    let secret = String(repeating: "s", count: 32)
    let storage = try createKeychain(.init(service: "bench"), configuration: configuration)
    try await storage.setItem("k0", secret)
    guard try await storage.getItem("k0") == secret else { throw BenchFailure("the daemon returned another value") }
    return (configuration, KeychainDevice(configuration: configuration), secret)
}
