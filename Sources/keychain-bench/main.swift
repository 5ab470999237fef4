import Foundation

// keychain-bench: the keychain's latencies, throughput and TPM commands per operation for every
// accessibility level and access control, on a private swtpm, and of the PKCS#11 token storage on a
// private SoftHSM2 token; against tpm2-tools, pkcs11-tool and the keychainctl process.
// Run it with `swift run -c release keychain-bench`; see docs/performance.md.

/// Runs the benchmark; the swtpm and its directory are removed on every path.
func runBench(_ options: BenchOptions) async -> Int32 {
    do {
        let bench = try Bench(options: options)
        let signals = bench.cleanUpOnSignals()
        defer {
            signals.forEach { $0.cancel() }
            bench.cleanUp()
        }
        if let scheme = options.tokenScheme {
            print(try await bench.measureTokenScheme(scheme))
        } else {
            print(try await bench.run())
        }
        return 0
    } catch {
        FileHandle.standardError.write(Data("keychain-bench: \(error)\n".utf8))
        return 1
    }
}

/// Prints what a one-mode run measured and exits 0, or names its error and exits 1.
func report(_ measure: () async throws -> String) async -> Never {
    do {
        print(try await measure())
        exit(0)
    } catch {
        FileHandle.standardError.write(Data("keychain-bench: \(error)\n".utf8))
        exit(1)
    }
}

if CommandLine.arguments.count == 3, ["--warm-reads", "--daemon-warm-reads", "--cold-reads"].contains(CommandLine.arguments[1]),
   let reads = Int(CommandLine.arguments[2]), reads > 0 {
    await report {
        try await warmReadBench(reads: reads, throughDaemon: CommandLine.arguments[1] == "--daemon-warm-reads",
                                cold: CommandLine.arguments[1] == "--cold-reads")
    }
}

if CommandLine.arguments.count == 3, CommandLine.arguments[1] == "--client-warm-reads", let reads = Int(CommandLine.arguments[2]), reads > 0 {
    await report { try await clientWarmReadBench(reads: reads) }
}

if (4...5).contains(CommandLine.arguments.count), CommandLine.arguments[1] == "--daemon-concurrent-reads",
   let clients = Int(CommandLine.arguments[2]), let reads = Int(CommandLine.arguments[3]), clients > 0, reads > 0,
   CommandLine.arguments.count == 4 || CommandLine.arguments[4] == "--own-threads" {
    await report { try await concurrentReadBench(clients: clients, readsPerClient: reads, ownThreads: CommandLine.arguments.count == 5) }
}

if CommandLine.arguments.count >= 2, CommandLine.arguments[1] == "--profiles" {
    // --profiles [--runs N] [PROFILE…]: every profile by default (docs/performance.md, "On TPM profiles").
    var rest = Array(CommandLine.arguments.dropFirst(2)), runs = 5
    if rest.first == "--runs", rest.count >= 2, let n = Int(rest[1]), n > 0 { runs = n; rest.removeFirst(2) }
    await report { try await profileBench(names: rest.isEmpty ? ["swtpm", "fast", "typical", "slow", "old"] : rest, runs: runs) }
}

if CommandLine.arguments.count >= 3, CommandLine.arguments[1] == "--vault-state", let reads = Int(CommandLine.arguments[2]), reads > 0 {
    let rest = CommandLine.arguments.dropFirst(3)
    let modes = ["in-process", "keychaind"].filter { rest.isEmpty || rest.contains($0) }
    let kinds = ["ready", "available", "signed-in"].filter { !rest.contains(where: ["ready", "available", "signed-in"].contains) || rest.contains($0) }
    await report { try await vaultStateBench(reads: reads, modes: modes.isEmpty ? ["in-process", "keychaind"] : modes, kinds: kinds) }
}

if CommandLine.arguments.count == 3, CommandLine.arguments[1] == "--prompter-reach", let calls = Int(CommandLine.arguments[2]), calls > 0 {
    await report { try await prompterReachBench(calls: calls) }
}

do {
    let options = try BenchOptions(CommandLine.arguments.dropFirst())
    if options.daemon {
        await report { try await daemonBench(runs: options.runs, clients: 16, readsPerClient: options.cold * 20) }
    }
    if options.attestation {
        await report { try await attestationBench(rounds: options.writes * 5) }
    }
    if options.provisioning {
        await report { try await provisioningBench(items: options.writes * 5, seals: options.warm / 10, imports: options.cold / 5) }
    }
    exit(await runBench(options))
} catch {
    guard let message = error.message else { print(BenchOptions.usage); exit(0) }
    FileHandle.standardError.write(Data("keychain-bench: \(message)\n\(BenchOptions.usage)\n".utf8))
    exit(2)
}
