import Foundation
import Keychain

/// The measured figures as Markdown tables, and each target with its verdict.
struct Report: CustomStringConvertible {
    let options: BenchOptions
    let environment: EnvironmentInfo
    let levels: [LevelResult]
    let prompted: [PromptedRead]
    let authValidity: AuthValidityResult
    /// Nil when SoftHSM2 is not installed.
    let token: TokenResult?
    /// The token storage on SoftHSM2 restricted to RSA-OAEP, then to ECDH (each measured in a child process).
    let otherSchemes: [TokenResult]
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
            SoftHSM \(environment.softHSM), OpenSC \(environment.openSC), \
            \(environment.optimized ? "release build" : "DEBUG BUILD: figures not representative, use -c release"), \
            other processes used \(String(format: "%.0f", environment.otherWork))% of the machine's CPU time during the run \
            (0% on a quiet machine; anything else skews the figures).
            Samples per level: \(options.cold) cold reads (dropCaches() before each), \(options.warm) warm reads, hasItem and \
            getAllKeys calls, \(options.writes) setItem on an existing service, \(options.firstWrites) first writes of a new \
            service. The device has a passcode and an enrolled finger. Access control: \(options.cold) reads per row, \
            each answered by the scripted prompt. \
            Processes: p50 of \(options.runs) runs after one warm-up. \
            ops/s: one caller, operations over their summed latencies. \
            cmds: TPM commands per operation, counted at the one ESAPI call point.
            """)

        var reads = Table("accessible", "cold p50", "cold p99", "cold ops/s", "cold cmds",
                          "warm p50", "warm p99", "warm ops/s", "warm cmds")
        for level in levels {
            reads.add([level.accessible.rawValue] + Format.figures(level.coldGet) + Format.figures(level.warmGet))
        }
        out.append("## getItem\n\n" + reads.render())

        var others = Table("accessible", "set p50", "set p99", "set ops/s", "set cmds", "first set p50", "first set cmds",
                           "hasItem ops/s", "hasItem cmds", "getAllKeys ops/s", "getAllKeys cmds")
        for level in levels {
            others.add([level.accessible.rawValue] + Format.figures(level.set) + [
                Format.duration(level.firstWrite.p50), Format.commands(level.firstWrite.commandsPerOp),
                Format.rate(level.has.opsPerSecond), Format.commands(level.has.commandsPerOp),
                Format.rate(level.keys.opsPerSecond), Format.commands(level.keys.commandsPerOp),
            ])
        }
        out.append("## setItem (existing service, first write of a new service), hasItem, getAllKeys\n\n" + others.render())

        var controls = Table("accessControl", "accessible", "answer", "p50", "p99", "ops/s", "cmds", "prompts/read",
                             text: 3)
        for row in prompted {
            controls.add([row.accessControl.rawValue, row.accessible.rawValue, row.answer.rawValue]
                         + Format.figures(row.reads) + [Format.commands(row.promptsPerRead)])
        }
        out.append("## getItem behind an access control (authValidity 0: every read prompts and unseals)\n\n"
                   + controls.render())

        let window = authValidity
        var windowTable = Table("biometryAny, \(AuthValidityResult.accessible.rawValue), authValidity \(AuthValidityResult.seconds)",
                                "p50", "p99", "ops/s", "cmds", "prompts/read")
        func perRead(_ prompts: Int, _ samples: Samples) -> String {
            Format.commands(samples.count == 0 ? 0 : Double(prompts) / Double(samples.count))
        }
        windowTable.add(["first read of a service (prompt, PolicySigned, ticket saved)"] + Format.figures(window.firstRead)
                        + [perRead(window.firstPrompts, window.firstRead)])
        windowTable.add(["later read, same engine (key kept for the window)"] + Format.figures(window.windowRead) + ["0"])
        windowTable.add(["later read, fresh engine (dropCaches(): PolicyTicket)"] + Format.figures(window.ticketRead)
                        + [perRead(window.laterPrompts, window.ticketRead)])
        out.append("## authValidity\n\n" + windowTable.render())

        if let token {
            var ops = Table("keyStorage strongbox (SoftHSM2)", "p50", "p99", "ops/s", "TPM cmds")
            func add(_ name: String, _ samples: Samples) { ops.add([name] + Format.figures(samples)) }
            add("first token call of the process: setItem (module, login, key generated; 1 sample)", token.firstUse)
            add("setItem, first write of a new service (wrapping key generated on the token)", token.firstWrite)
            add("setItem, existing service", token.set)
            add("getItem cold (dropCaches() before each; the token session stays open)", token.coldGet)
            add("getItem warm", token.warmGet)
            var processes = Table("one read of the 32-byte secret from the token", "processes", "p50", "p99")
            processes.add("getItem in process, warm", "0", Format.duration(token.warmGet.p50), Format.duration(token.warmGet.p99))
            if let cli = token.keychainctl {
                processes.add("keychainctl get --key-storage strongbox, whole process", "1",
                              Format.duration(cli.p50), Format.duration(cli.p99))
            } else {
                processes.add("keychainctl get: not built next to the bench (swift build -c release)", "-", "-", "-")
            }
            if let tool = token.pkcs11Tool {
                processes.add("pkcs11-tool --read-object (private data object), whole process", "1",
                              Format.duration(tool.p50), Format.duration(tool.p99))
            } else {
                processes.add("pkcs11-tool: not installed", "-", "-", "-")
            }
            out.append("## The token storage (SoftHSM2, AES-GCM, \(token.keysOnToken) AES keys on the token during the reads)\n\n"
                       + ops.render() + "\n\n" + processes.render())
            var schemes = Table("token scheme (SoftHSM2 offering only its mechanisms)", "first write p50", "overwrite p50",
                                "cold get p50", "warm get p50", "warm get p99", "pkcs11-tool p50", "pkcs11-tool / warm")
            for result in [token] + otherSchemes {
                let ratio = result.pkcs11Tool.map { String(format: "%.0f×", Double($0.p50) / Double(max(result.warmGet.p50, 1))) } ?? "-"
                schemes.add(result.scheme.rawValue, Format.duration(result.firstWrite.p50), Format.duration(result.set.p50),
                            Format.duration(result.coldGet.p50), Format.duration(result.warmGet.p50),
                            Format.duration(result.warmGet.p99), result.pkcs11Tool.map { Format.duration($0.p50) } ?? "-", ratio)
            }
            out.append("## The token storage per wrapping scheme\n\n" + schemes.render())
        } else {
            out.append("## The token storage\n\nSoftHSM2 is not installed (/usr/lib/softhsm/libsofthsm2.so, softhsm2-util).")
        }

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

        var targets = Table("target", "measured", "result", text: 3)
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
        targets.append(commandBudget("biometric getItem (finger) ≤ 6 TPM commands", answer: .finger, budget: 6))
        targets.append(commandBudget("passcode getItem ≤ 7 TPM commands", answer: .passcode, budget: 7))
        let tokenTarget = "token getItem warm ≥ 50× faster than pkcs11-tool --read-object"
        if let token {
            for result in [token] + otherSchemes {
                targets.append(ratioTarget(tokenTarget + " (\(result.scheme.rawValue))", reference: result.pkcs11Tool,
                                           subject: result.warmGet, at: 50, missing: "pkcs11-tool not installed"))
            }
        } else {
            targets.append(Target(name: tokenTarget, measured: "SoftHSM2 not installed", met: nil))
        }
        return targets
    }

    /// Every access-control row answered with `answer` within `budget` TPM commands per read.
    private func commandBudget(_ name: String, answer: PromptedRead.Answer, budget: Double) -> Target {
        let rows = prompted.filter { $0.answer == answer }
        guard !rows.isEmpty else { return Target(name: name, measured: "no such row", met: nil) }
        let over = rows.filter { $0.reads.commandsPerOp > budget }
            .map { "\($0.accessControl.rawValue) (\($0.accessible.rawValue)): \(Format.commands($0.reads.commandsPerOp))" }
        let within = rows.filter { $0.reads.commandsPerOp <= budget }.map(\.reads.commandsPerOp)
        var measured = over.joined(separator: ", ")
        if let best = within.max() {
            measured += (over.isEmpty ? "at most " : "; others at most ") + Format.commands(best)
        }
        return Target(name: name, measured: measured, met: over.isEmpty)
    }

    /// How many times faster `subject` is than `reference`, at p50.
    private func ratioTarget(_ name: String, reference: Samples?, subject: Samples, at least: Double,
                             missing: String = "tpm2-tools not installed") -> Target {
        guard let reference, subject.p50 > 0 else { return Target(name: name, measured: missing, met: nil) }
        let ratio = Double(reference.p50) / Double(subject.p50)
        return Target(name: name, measured: "\(Format.ratio(ratio)) (\(Format.duration(reference.p50)) / "
                                                + "\(Format.duration(subject.p50)))",
                      met: ratio >= least)
    }
}
