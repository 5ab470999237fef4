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

    @Test func aWrongPasscodeSaysHowManyTriesAreLeft() throws {
        #expect(try cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        for left in ["9 tries left", "8 tries left"] {
            let wrong = try cli(["unlock"], input: Array("1111\n".utf8))
            #expect(wrong.status == 3 && wrong.stderr.contains("AUTHENTICATION_FAILED") && wrong.stderr.contains(left), "\(wrong.stderr)")
        }
        #expect(try cli(["unlock"], input: Array("2468\n".utf8)).status == 0)
        // The TPM zeroes its count at a passcode it accepts, and so does the message.
        let again = try cli(["--json", "unlock"], input: Array("1111\n".utf8))
        #expect(String(decoding: again.stdout, as: UTF8.self).contains("9 tries left"), "\(again.stderr)")
        #expect(try cli(["unlock"], input: Array("2468\n".utf8)).status == 0)
        // passcode change and remove count alike.
        let change = try cli(["passcode", "change"], input: Array("1111\n1357\n".utf8))
        #expect(change.status == 3 && change.stderr.contains("Wrong passcode") && change.stderr.contains("9 tries left"), "\(change.stderr)")
        let remove = try cli(["passcode", "remove"], input: Array("1111\n".utf8))
        #expect(remove.status == 3 && remove.stderr.contains("Wrong passcode") && remove.stderr.contains("8 tries left"), "\(remove.stderr)")
        #expect(try cli(["unlock"], input: Array("2468\n".utf8)).status == 0)
        // Through keychaind, whose store counts too.
        let daemon = try KeychainDaemon(tpm: tpm)
        let through = try run(ctl, ["unlock"], input: Array("1111\n".utf8), environment: daemon.environment)
        #expect(through.status == 3 && through.stderr.contains("AUTHENTICATION_FAILED") && through.stderr.contains("9 tries left"),
                "\(through.stderr)")
    }

    @Test func echoComesBackWhenCtrlCEndsThePrompt() throws {
        // The shell survives the ^C (a handler, which exec resets for keychainctl) and asks the terminal.
        let asked = try typing("\u{03}", after: "Passcode", "trap : INT; " + command("unlock") + "; echo \"status $?\"; stty -a")
        #expect(asked.shown.contains("status 130"), "\(asked.shown)")
        #expect(asked.shown.contains(" echo ") && !asked.shown.contains(" -echo "), "echo left off: \(asked.shown)")
    }

    /// Issue 39 item 3: on a slow discrete chip `init` keeps the TPM busy past a second (the profile's
    /// latencies alone add up to more). At a terminal a line a second says what it is doing and how far; on
    /// a pipe nothing is added to what a script reads.
    @Test func aLongInitOnASlowChipShowsItsProgressAtATerminalOnly() throws {
        let slow = try SoftwareTPM(profile: .slowDiscrete)
        let direct = ["--store", slow.directory + "/store", "--tcti", slow.tcti, "--reader", "none", "init", "--allow-empty-owner-auth"]
        let shown = try runChild("/usr/bin/script", ["-qfec", ([ctl] + direct).map { "'\($0)'" }.joined(separator: " "), "/dev/null"])
        let text = String(decoding: shown.stdout, as: UTF8.self)
        #expect(shown.status == 0 && text.contains("initialized: "), "\(text)")
        let lines = text.split(whereSeparator: \.isNewline).map(String.init)
        #expect(lines.contains { $0.hasPrefix("keychainctl init: ") && $0.contains(" TPM commands in ") }, "no progress line: \(text)")
        #expect(lines.contains { $0.hasPrefix("initialized: ") }, "\(text)")
        let piped = try run(ctl, direct)
        #expect(piped.status == 0 && !piped.stderr.contains("TPM commands"), "\(piped.stderr)")
    }
}

@Suite("get and can-use agree", .offThePool)
struct PromptAgreementTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    /// Runs `get` in the background with no terminal and answers the ask-password file it writes in
    /// `runtime`/systemd/ask-password with the passcode, as a password agent does.
    static let answeringScript = """
        "$K" "$@" get svc k < /dev/null > "$R/out" 2> "$R/err" &
        pid=$!
        python3 -c '
        import configparser, os, socket, sys, time
        d = sys.argv[1]
        for _ in range(300):
            asks = [f for f in os.listdir(d) if f.startswith("ask.")]
            if asks: break
            time.sleep(0.1)
        else: sys.exit(0)
        c = configparser.ConfigParser(); c.read(os.path.join(d, asks[0]))
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"+2468", c["Ask"]["Socket"])
        ' "$R/systemd/ask-password"
        wait $pid
        """

    @Test func getAsksThePasswordAgentsCanUseCounts() throws {
        let tpm = try SoftwareTPM()
        let runtime = tpm.directory + "/runtime"
        try FileManager.default.createDirectory(atPath: runtime + "/systemd/ask-password", withIntermediateDirectories: true)
        let noDesktop = ["XDG_RUNTIME_DIR": runtime, "DISPLAY": "", "WAYLAND_DISPLAY": "", "DBUS_SESSION_BUS_ADDRESS": ""]
        let direct = ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none"]
        #expect(try run(ctl, direct + ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try run(ctl, direct + ["set", "svc", "k", "--access-control", "passcode"], input: Array("v".utf8)).status == 0)
        let canUse = try run(ctl, direct + ["can-use", "passcode"], environment: noDesktop)
        #expect(String(decoding: canUse.stdout, as: UTF8.self) == "available: true\n", "\(canUse.stderr)")
        func answered(_ args: [String], _ environment: [String: String]) throws -> (status: Int32, out: String, err: String) {
            let result = try run("/bin/sh", ["-c", Self.answeringScript, "sh"] + args,
                                 environment: noDesktop.merging(environment) { $1 }.merging(["K": ctl, "R": runtime]) { $1 })
            let out = (try? String(contentsOfFile: runtime + "/out", encoding: .utf8)) ?? ""
            let err = (try? String(contentsOfFile: runtime + "/err", encoding: .utf8)) ?? ""
            return (result.status, out, err)
        }
        let got = try answered(direct, [:])
        #expect(got.status == 0 && got.out == "v", "\(got.err)")
        // Through keychaind's front, which hands the prompt to the full tool.
        let daemon = try KeychainDaemon(tpm: tpm, store: tpm.directory + "/store")
        #expect(try run(ctl, ["set", "svc", "k", "--access-control", "passcode"], input: Array("v".utf8),
                        environment: daemon.environment).status == 0)  // the caller's own items, through keychaind
        let front = try answered([], daemon.environment)
        #expect(front.status == 0 && front.out == "v", "\(front.status) \(front.out) \(front.err)")
        // With no agent either, both say no.
        try FileManager.default.removeItem(atPath: runtime + "/systemd/ask-password")
        let none = try run(ctl, direct + ["can-use", "passcode"], environment: noDesktop)
        #expect(String(decoding: none.stdout, as: UTF8.self).hasPrefix("available: false"), "\(none.stderr)")
        let refused = try run(ctl, direct + ["get", "svc", "k"], environment: noDesktop)
        #expect(refused.status == 3 && refused.stderr.contains("INTERACTION_NOT_ALLOWED"), "\(refused.stderr)")
    }
}
