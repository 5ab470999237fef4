import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// The first hour at a terminal (issue 37 item 6): keychainctl run on script(1)'s pty, typed into as
/// a person would, and what it shows there.
@Suite("keychainctl at a terminal", .offThePool)
struct TerminalTests {
    let tpm: SoftwareTPM
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    init() throws { tpm = try SoftwareTPM() }

    /// The command line of keychainctl on this test's store, for a shell.
    func command(_ args: String) -> String {
        "'\(ctl)' --store '\(tpm.directory)/store' --tcti '\(tpm.tcti)' --reader none \(args)"
    }

    /// Runs `shellCommand` on script(1)'s pty and types `typed` once `prompt` shows: stdin, stdout and
    /// stderr are the terminal; what shows after the prompt is what the program let it echo.
    /// With `thenEnd`, the input ends once typed (script(1) passes that on as Ctrl-D).
    func typing(_ typed: String, after prompt: String, thenEnd: Bool = false, _ shellCommand: String,
                environment: [String: String] = [:]) throws -> (status: Int32, shown: String) {
        try runChild("/usr/bin/script", ["-qfec", shellCommand, "/dev/null"], typing: Array(typed.utf8), after: prompt,
                     thenEnd: thenEnd, environment: environment, deadline: 30)
    }

    func cli(_ args: [String], input: [UInt8] = []) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none"] + args, input: input)
    }

    // MARK: Secrets typed at a terminal

    @Test func passcodeSetAndUnlockAskOnTheTerminalWithoutEcho() throws {
        let set = try typing("2468\n2468\n", after: "New passcode: ", command("passcode set"))
        #expect(set.status == 0 && set.shown.contains("New passcode again: ") && set.shown.contains("passcode set"), "\(set.shown)")
        #expect(!set.shown.contains("2468"), "the terminal echoed the passcode: \(set.shown)")
        #expect(try cli(["lock"]).status == 0)
        let unlock = try typing("2468\n", after: "Passcode", command("unlock"))
        #expect(unlock.status == 0 && unlock.shown.contains("unlocked"), "\(unlock.shown)")
        #expect(!unlock.shown.contains("2468"), "the terminal echoed the passcode: \(unlock.shown)")
        #expect(try cli(["--json", "status"]).stdout.contains(Array("\"lockState\":\"unlocked\"".utf8)))
    }

    @Test func aNewPasscodeTypedDifferentlyTwiceChangesNothing() throws {
        let set = try typing("2468\n1357\n", after: "New passcode: ", command("passcode set"))
        #expect(set.status == 2 && set.shown.contains("INVALID_ARGUMENT") && set.shown.contains("differs"), "\(set.shown)")
        #expect(try cli(["--json", "status"]).stdout.contains(Array("\"passcodeSet\":false".utf8)))
    }

    @Test func aValueTypedAtTheTerminalIsNotEchoedAndLosesOneNewline() throws {
        let set = try typing("tty-secret\n", after: "Value of 'k' in 'svc'", thenEnd: true, command("set svc k"))
        #expect(set.status == 0, "\(set.shown)")
        #expect(!set.shown.contains("tty-secret"), "the terminal echoed the value: \(set.shown)")
        #expect(try cli(["get", "svc", "k"]).stdout == Array("tty-secret".utf8))
        let two = try typing("two\n\n", after: "Value of 'k2' in 'svc'", thenEnd: true, command("set svc k2"))
        #expect(two.status == 0 && !two.shown.contains("two"), "\(two.shown)")
        #expect(try cli(["get", "svc", "k2"]).stdout == Array("two\n".utf8), "only one newline is dropped")
        // A pipe's bytes are kept exactly, newline included.
        #expect(try cli(["set", "svc", "piped"], input: Array("v\n".utf8)).status == 0)
        #expect(try cli(["get", "svc", "piped"]).stdout == Array("v\n".utf8))
    }

    /// Through keychaind the front does `set` itself from a pipe; from a terminal it hands the
    /// command to the full tool, which asks.
    @Test func theFrontAsksForAValueTypedAtTheTerminalToo() throws {
        let daemon = try KeychainDaemon(tpm: tpm)
        let set = try typing("front-secret\n", after: "Value of 'k' in 'svc'", thenEnd: true, "'\(ctl)' set svc k",
                             environment: daemon.environment)
        #expect(set.status == 0 && !set.shown.contains("front-secret"), "\(set.shown)")
        let got = try run(ctl, ["get", "svc", "k"], environment: daemon.environment)
        #expect(got.stdout == Array("front-secret".utf8), "\(got.stderr)")
        #expect(try run(ctl, ["set", "svc", "piped"], input: Array("v\n".utf8), environment: daemon.environment).status == 0)
        #expect(try run(ctl, ["get", "svc", "piped"], environment: daemon.environment).stdout == Array("v\n".utf8))
    }

    @Test func echoComesBackWhenCtrlCEndsThePrompt() throws {
        // The shell survives the ^C (a handler, which exec resets for keychainctl) and asks the terminal.
        let asked = try typing("\u{03}", after: "Passcode", "trap : INT; " + command("unlock") + "; echo \"status $?\"; stty -a")
        #expect(asked.shown.contains("status 130"), "\(asked.shown)")
        #expect(asked.shown.contains(" echo ") && !asked.shown.contains(" -echo "), "echo left off: \(asked.shown)")
    }
}
