import Foundation
import Keychain

/// The measured figures as Markdown tables, and each target with its verdict.
struct Report: CustomStringConvertible {
    let options: BenchOptions
    let environment: EnvironmentInfo
    let levels: [LevelResult]
    let transport: Transport
    /// Nil when tpm2-tools is not installed.
    let tpm2Tools: Samples?
    /// Nil when keychainctl was not built next to the bench.
    let keychainctl: Samples?

    var description: String {
        var out: [String] = []
        out.append("""
            # keychain-bench

            \(environment.cores) cores, Linux \(environment.kernel), swtpm \(environment.swtpm), tpm2-tools \(environment.tpm2Tools), \
            \(environment.optimized ? "release build" : "DEBUG BUILD: figures not representative, use -c release"), \
            other processes used \(String(format: "%.0f", environment.otherWork))% of the machine's CPU time during the run \
            (0% on a quiet machine; anything else skews the figures).
            Samples per level: \(options.cold) cold reads (dropCaches() before each), \(options.warm) warm reads, hasItem and \
            getAllKeys calls, \(options.writes) setItem on an existing service, \(options.firstWrites) first writes of a new \
            service. Processes: p50 of \(options.runs) runs after one warm-up. \
            ops/s: one caller, operations over their summed latencies. \
            cmds: TPM commands per operation, counted at the one ESAPI call point.
            """)

        var reads = Table("accessible", "cold p50", "cold p99", "cold ops/s", "cold cmds",
                          "warm p50", "warm p99", "warm ops/s", "warm cmds")
        for level in levels {
            reads.add(level.accessible.rawValue,
                      Format.duration(level.coldGet.p50), Format.duration(level.coldGet.p99),
                      Format.rate(level.coldGet.opsPerSecond), Format.commands(level.coldGet.commandsPerOp),
                      Format.duration(level.warmGet.p50), Format.duration(level.warmGet.p99),
                      Format.rate(level.warmGet.opsPerSecond), Format.commands(level.warmGet.commandsPerOp))
        }
        out.append("## getItem\n\n" + reads.render())

        var others = Table("accessible", "set p50", "set p99", "set ops/s", "set cmds", "first set p50", "first set cmds",
                           "hasItem ops/s", "hasItem cmds", "getAllKeys ops/s", "getAllKeys cmds")
        for level in levels {
            others.add(level.accessible.rawValue,
                       Format.duration(level.set.p50), Format.duration(level.set.p99),
                       Format.rate(level.set.opsPerSecond), Format.commands(level.set.commandsPerOp),
                       Format.duration(level.firstWrite.p50), Format.commands(level.firstWrite.commandsPerOp),
                       Format.rate(level.has.opsPerSecond), Format.commands(level.has.commandsPerOp),
                       Format.rate(level.keys.opsPerSecond), Format.commands(level.keys.commandsPerOp))
        }
        out.append("## setItem (existing service, first write of a new service), hasItem, getAllKeys\n\n" + others.render())

        var paths = Table("one read of the 32-byte secret", "processes", "p50", "p99")
        if let cold = level(.afterFirstUnlock)?.coldGet {
            paths.add("getItem in process, cold (afterFirstUnlock)", "0", Format.duration(cold.p50), Format.duration(cold.p99))
        }
        if let keychainctl {
            paths.add("keychainctl get, whole process, warm store", "1",
                      Format.duration(keychainctl.p50), Format.duration(keychainctl.p99))
        } else {
            paths.add("keychainctl get: not built next to the bench (swift build -c release)", "-", "-", "-")
        }
        if let tpm2Tools {
            paths.add("tpm2_load && tpm2_unseal, persistent SRK", "2",
                      Format.duration(tpm2Tools.p50), Format.duration(tpm2Tools.p99))
        } else {
            paths.add("tpm2-tools: not installed", "-", "-", "-")
        }
        out.append("## Read paths against a shell user's tpm2-tools pipeline\n\n" + paths.render())

        var wire = Table("the TPM connection alone", "p50", "p99", "TPM commands")
        wire.add("open and close a connection (TCTI loader, Esys_Initialize)", Format.duration(transport.connect.p50),
                 Format.duration(transport.connect.p99), "0")
        wire.add("one command with no session (GetCapability), round trip", Format.duration(transport.command.p50),
                 Format.duration(transport.command.p99), Format.commands(transport.command.commandsPerOp))
        out.append("## The TPM transport\n\n" + wire.render())

        var targets = Table("target", "measured", "result")
        for target in self.targets { targets.add(target.name, target.measured, target.verdict) }
        out.append("## Targets\n\n" + targets.render())
        return out.joined(separator: "\n\n") + "\n"
    }

    private func level(_ accessible: Accessible) -> LevelResult? {
        levels.first { $0.accessible == accessible }
    }

    struct Target {
        let name: String
        let measured: String
        /// Nil when the reference it compares with could not be measured.
        let met: Bool?
        var verdict: String { met.map { $0 ? "met" : "MISSED" } ?? "not measured" }
    }

    var targets: [Target] {
        var targets: [Target] = []
        if let cold = level(.afterFirstUnlock)?.coldGet {
            targets.append(Target(name: "cold getItem (afterFirstUnlock) ≤ 5 TPM commands",
                                  measured: Format.commands(cold.commandsPerOp), met: cold.commandsPerOp <= 5))
            targets.append(ratioTarget("cold getItem (afterFirstUnlock) ≥ 10× faster than tpm2_load && tpm2_unseal",
                                       reference: tpm2Tools, subject: cold, at: 10))
        }
        let warmCommands = levels.map(\.warmGet.commandsPerOp).max() ?? 0
        targets.append(Target(name: "warm getItem: 0 TPM commands (every level)",
                              measured: "at most \(Format.commands(warmCommands))", met: warmCommands == 0))
        let slowest = levels.min { $0.warmGet.opsPerSecond < $1.warmGet.opsPerSecond }
        if let slowest {
            let fastest = levels.map(\.warmGet.opsPerSecond).max() ?? 0
            targets.append(Target(name: "warm getItem ≥ 50,000/s (every level)",
                                  measured: "\(Format.rate(slowest.warmGet.opsPerSecond))/s (\(slowest.accessible.rawValue)) "
                                      + "to \(Format.rate(fastest))/s",
                                  met: slowest.warmGet.opsPerSecond >= 50_000))
        }
        let lookupCommands = levels.flatMap { [$0.has.commandsPerOp, $0.keys.commandsPerOp] }.max() ?? 0
        targets.append(Target(name: "hasItem / getAllKeys: 0 TPM commands (every level)",
                              measured: "at most \(Format.commands(lookupCommands))", met: lookupCommands == 0))
        let setCommands = levels.map(\.set.commandsPerOp).max() ?? 0
        let overBudget = levels.filter { $0.set.commandsPerOp > 1 }
            .map { "\($0.accessible.rawValue): \(Format.commands($0.set.commandsPerOp))" }
        targets.append(Target(name: "setItem on an existing service ≤ 1 TPM command (every level)",
                              measured: overBudget.isEmpty ? "at most \(Format.commands(setCommands))"
                                  : overBudget.joined(separator: ", "),
                              met: overBudget.isEmpty))
        if let keychainctl {
            targets.append(ratioTarget("keychainctl get process ≥ 3× faster than tpm2_load && tpm2_unseal",
                                       reference: tpm2Tools, subject: keychainctl, at: 3))
        } else {
            targets.append(Target(name: "keychainctl get process ≥ 3× faster than tpm2_load && tpm2_unseal",
                                  measured: "keychainctl not built", met: nil))
        }
        return targets
    }

    /// How many times faster `subject` is than `reference`, at p50.
    private func ratioTarget(_ name: String, reference: Samples?, subject: Samples, at least: Double) -> Target {
        guard let reference, subject.p50 > 0 else { return Target(name: name, measured: "tpm2-tools not installed", met: nil) }
        let ratio = Double(reference.p50) / Double(subject.p50)
        return Target(name: name, measured: "\(Format.ratio(ratio)) (\(Format.duration(reference.p50)) / "
                                                + "\(Format.duration(subject.p50)))",
                      met: ratio >= least)
    }
}
