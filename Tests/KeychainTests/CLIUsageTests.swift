import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// keychainctl's usage as a person meets it (issue 37 item 6): help for one command, a usage error
/// that fits on the screen, and options a command does not take refused.
@Suite("keychainctl's usage", .offThePool)
struct CLIUsageTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path
    /// A store that is never made and a TPM that is never reached: nothing here gets that far.
    let place = ["--store", NSTemporaryDirectory() + "usage-" + UUID().uuidString, "--tcti", "swtpm:host=127.0.0.1,port=1"]

    func cli(_ args: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        let result = try run(ctl, place + args)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    @Test func helpForACommandPrintsThatCommandsUsageOnly() throws {
        let page = try cli(["help"])
        #expect(page.status == 0 && page.stdout.contains("attest challenge REQUEST") && page.stdout.contains("set SERVICE KEY"))
        let help = try cli(["help", "set"]), flag = try cli(["set", "--help"])
        #expect(help.status == 0 && flag.status == 0 && help.stdout == flag.stdout)
        #expect(help.stdout.contains("set SERVICE KEY [--accessible A]") && !help.stdout.contains("attest"), "\(help.stdout)")
        #expect(help.stdout.split(separator: "\n").count < 12, "\(help.stdout)")
        let credential = try cli(["credential", "--help"])
        for line in ["credential set UNIT ID", "credential get UNIT ID", "credential ls", "credential rm UNIT ID"] {
            #expect(credential.stdout.contains(line), "\(credential.stdout)")
        }
        #expect(!credential.stdout.contains("set SERVICE KEY"), "\(credential.stdout)")
        let sub = try cli(["attest", "verify", "--help"])
        #expect(sub.stdout.contains("attest verify ANSWER") && !sub.stdout.contains("attest challenge"), "\(sub.stdout)")
        let unknown = try cli(["help", "frobnicate"])
        #expect(unknown.status == 2 && unknown.stderr.hasPrefix("keychainctl: unknown command 'frobnicate'\n"), "\(unknown.stderr)")
    }

    @Test func aUsageErrorIsOneLineAndTheCommandsUsage() throws {
        let wrong = try cli(["set", "only-a-service"])
        #expect(wrong.status == 2)
        let lines = wrong.stderr.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.first == "keychainctl: set takes SERVICE KEY", "\(wrong.stderr)")
        #expect(wrong.stderr.contains("set SERVICE KEY [--accessible A]") && !wrong.stderr.contains("attest"), "\(wrong.stderr)")
        #expect(lines.count < 12, "\(wrong.stderr)")
        let option = try cli(["ls", "svc", "--frobnicate"])
        #expect(option.status == 2 && option.stderr.hasPrefix("keychainctl: unknown option --frobnicate"), "\(option.stderr)")
        #expect(option.stderr.contains("  ls SERVICE") && !option.stderr.contains("attest"), "\(option.stderr)")
        // --json: the error on stdout as JSON, as before.
        let json = try cli(["--json", "set", "only-a-service"])
        #expect(json.status == 2 && json.stderr.isEmpty, "\(json.stderr)")
        #expect(json.stdout == "{\"error\":{\"code\":\"INVALID_ARGUMENT\",\"message\":\"set takes SERVICE KEY\"}}\n", "\(json.stdout)")
    }

    @Test func anOptionTheCommandDoesNotTakeIsRefused() throws {
        let state = NSTemporaryDirectory() + "usage-state-" + UUID().uuidString
        defer { unlink(state) }
        let challenge = try cli(["attest", "challenge", "/nonexistent-request", "--state", state, "--ek-ca", "/ca.pem"])
        #expect(challenge.status == 2 && challenge.stderr.hasPrefix("keychainctl: attest challenge does not take --ek-ca\n"),
                "\(challenge.stderr)")
        #expect(challenge.stderr.contains("attest challenge REQUEST --state FILE"), "\(challenge.stderr)")
        let withHelp = try cli(["attest", "challenge", "--ek-ca", "/ca.pem", "--help"])
        #expect(withHelp.status == 2 && withHelp.stderr.hasPrefix("keychainctl: attest challenge does not take --ek-ca\n"))
        // attest verify takes it: its refusal is about the answer file, not the option.
        let verify = try cli(["attest", "verify", "/nonexistent-answer", "--state", state, "--ek-ca", "/ca.pem"])
        #expect(!verify.stderr.contains("does not take"), "\(verify.stderr)")
        for (args, option) in [(["ls", "svc", "--label", "L"], "--label"), (["get", "svc", "k", "--synchronizable"], "--synchronizable"),
                               (["status", "--passcode-stdin"], "--passcode-stdin"), (["unlock", "--touch", "thumb"], "--touch")] {
            let refused = try cli(args)
            #expect(refused.status == 2 && refused.stderr.contains("does not take \(option)"), "\(args): \(refused.stderr)")
        }
        let json = try cli(["--json", "attest", "challenge", "/r", "--state", state, "--ek-ca", "/ca.pem"])
        #expect(json.stdout.contains("\"code\":\"INVALID_ARGUMENT\"") && json.stdout.contains("does not take --ek-ca"), "\(json.stdout)")
    }

    /// The bash completion offers every command and subcommand of the usage page, and for each the
    /// options its usage names, each one the command takes.
    @Test func theBashCompletionMatchesTheUsage() throws {
        let completion = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("dist/bash-completion/keychainctl").path
        /// What the completion offers after `words` (the word being completed empty, or `--`).
        func offered(_ words: [String]) throws -> Set<String> {
            let line = (["keychainctl"] + words).map { "'\($0)'" }.joined(separator: " ")
            let script = "source '\(completion)'; COMP_WORDS=(\(line)); COMP_CWORD=\(words.count); _keychainctl; printf '%s\\n' \"${COMPREPLY[@]}\""
            let result = try run("/bin/bash", ["-O", "extglob", "-c", script])
            return Set(String(decoding: result.stdout, as: UTF8.self).split(separator: "\n").map(String.init))
        }
        let page = try cli(["help"]).stdout
        // The entries: lines of two spaces then a command word (the page's own indentation), up to
        // the two spaces before their description.
        let entries = page.split(separator: "\n").filter { $0.hasPrefix("  ") && !$0.hasPrefix("   ") && $0.dropFirst(2).first?.isLowercase == true }
            .map { String($0.dropFirst(2)).components(separatedBy: "  ")[0].split(separator: " ").map(String.init) }
        let commands = try offered([""])
        #expect(entries.count > 30)
        for words in entries {
            #expect(commands.contains(words[0]), "the completion does not offer \(words[0])")
            let sub = words.count > 1 && words[1].first?.isLowercase == true && !words[1].contains("|") ? [words[1]] : []
            if !sub.isEmpty { #expect(try offered([words[0], ""]).contains(sub[0]), "no \(words[0]) \(sub[0]) in the completion") }
            // The options its own lines name (not the section's note, which speaks of other commands);
            // a command word alone whose help is several subcommands' (boot-state) is checked by those.
            let lines = try cli(["help"] + [words[0]] + sub).stdout.split(separator: "\n").filter { $0.hasPrefix("  ") }
            if sub.isEmpty && lines.filter({ $0.hasPrefix("  \(words[0]) ") }).count > 1 { continue }
            let usage = lines.joined(separator: " ")
            let named = Set(usage.split(whereSeparator: { " []|()=…,.;:".contains($0) }).map(String.init)
                .filter { $0.hasPrefix("--") && $0.count > 2 && $0 != "--help" && !$0.hasPrefix("--…") })
            let options = try offered([words[0]] + sub + ["--"])
            for option in named where words[0] != "help" {
                #expect(options.contains(option), "\((words + []).prefix(2)): the completion does not offer \(option)")
            }
            // Each option offered is one the command takes: with --help nothing runs, and an option it
            // does not take is still refused (a value given as --name=x, a switch alone).
            let global: Set<String> = ["--store", "--tcti", "--json", "--direct", "--reader", "--pcrs", "--pkcs11-uri", "--owner-auth-file", "--help"]
            for option in options.subtracting(global) {
                var taken = try cli([words[0]] + sub + [option + "=x", "--help"])
                if taken.stderr.contains("takes no value") { taken = try cli([words[0]] + sub + [option, "--help"]) }
                #expect(taken.status == 0 && !taken.stderr.contains("does not take"), "\(words.prefix(2)): the completion offers \(option), refused")
            }
        }
    }
}
