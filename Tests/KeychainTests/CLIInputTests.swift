import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Hostile input to the real `keychainctl` binary: bytes that are not UTF-8, endless stdin, keys
/// that look like options, keys that carry terminal escapes.
@Suite("keychainctl input", .offThePool)
struct CLIInputTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    func cli(_ tpm: SoftwareTPM, _ args: [String], input: [UInt8] = []) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none"] + args, input: input)
    }

    /// Runs `script` in /bin/sh with `$K` the binary and `$S`/`$T` the store and TCTI: the shell
    /// makes argv and environment bytes that a Swift `String` cannot hold, and redirects stdin.
    func shell(_ tpm: SoftwareTPM, _ script: String) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run("/bin/sh", ["-c", script], environment: ["K": ctl, "S": tpm.directory + "/store", "T": tpm.tcti])
    }

    /// Two keys that differ only in bytes that are not UTF-8 decode to the same lossy String
    /// (U+FFFD): the second `set` overwrote the first. Both are refused, and nothing is stored.
    @Test func argumentsThatAreNotUTF8AreRefusedNotDecodedLossily() throws {
        let tpm = try SoftwareTPM()
        for byte in ["\\377", "\\376"] {
            let set = try shell(tpm, "printf v | \"$K\" --store \"$S\" --tcti \"$T\" --reader none set svc \"$(printf 'k\(byte)')\"")
            #expect(set.status == 2, "\(set.stderr)")
            #expect(set.stderr.contains("INVALID_ARGUMENT") && set.stderr.contains("not valid UTF-8"))
        }
        let service = try shell(tpm, "printf v | \"$K\" --store \"$S\" --tcti \"$T\" --reader none set \"$(printf 's\\300\\200')\" k")
        #expect(service.status == 2 && service.stderr.contains("INVALID_ARGUMENT"), "an overlong encoding of NUL")
        #expect(try cli(tpm, ["ls", "svc"]).stdout.isEmpty)
        #expect(try cli(tpm, ["has", "svc", "k\u{FFFD}"]).status == 1)
        // The environment the CLI reads is held to the same rule.
        let env = try shell(tpm, "KEYCHAIN_STORE=\"$(printf '/tmp/k\\377')\" \"$K\" --tcti \"$T\" --reader none ls svc")
        #expect(env.status == 2 && env.stderr.contains("KEYCHAIN_STORE") && env.stderr.contains("INVALID_ARGUMENT"), "\(env.stderr)")
    }

    /// `set` used to read all of stdin before checking the size: `/dev/zero` under a memory limit died
    /// of a signal. Now it stops after the largest value and says so, within a 512 MiB address space.
    @Test func anEndlessValueIsRefusedWithinAMemoryLimitNotKilled() throws {
        let tpm = try SoftwareTPM()
        #expect(try cli(tpm, ["set", "svc", "big"], input: [1]).status == 0)
        // `timeout` only guards the suite against a hang; a kill by it (124/137) fails the test.
        let zero = try shell(tpm, "exec timeout -s KILL 120 prlimit --as=536870912 \"$K\" --store \"$S\" --tcti \"$T\" --reader none set svc big < /dev/zero")
        #expect(zero.status == 2, "exit \(zero.status): \(zero.stderr)")
        #expect(zero.stderr.contains("INVALID_ARGUMENT") && zero.stderr.contains("\(Keychain.maxValueLength) bytes"))
        // The old value stays; one byte over the limit is refused, the limit itself is stored.
        #expect(try cli(tpm, ["get", "svc", "big"]).stdout == [1])
        let file = tpm.directory + "/value"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(count: Keychain.maxValueLength + 1)))
        let over = try shell(tpm, "exec \"$K\" --store \"$S\" --tcti \"$T\" --reader none set svc big < \(file)")
        #expect(over.status == 2 && over.stderr.contains("INVALID_ARGUMENT"))
        #expect(truncate(file, off_t(Keychain.maxValueLength)) == 0)
        #expect(try shell(tpm, "exec \"$K\" --store \"$S\" --tcti \"$T\" --reader none set svc big < \(file)").status == 0)
        #expect(try cli(tpm, ["get", "svc", "big"]).stdout.count == Keychain.maxValueLength)
    }

    /// `--` ends the options: a key that starts with `--` can be written, read and removed.
    @Test func aKeyThatLooksLikeAnOptionIsReachableAfterDoubleDash() throws {
        let tpm = try SoftwareTPM()
        #expect(try cli(tpm, ["set", "svc", "--x"], input: [1]).status == 2, "without --, it is an unknown option")
        #expect(try cli(tpm, ["set", "--label", "L", "svc", "--", "--x"], input: Array("dash".utf8)).status == 0)
        #expect(try cli(tpm, ["get", "svc", "--", "--x"]).stdout == Array("dash".utf8))
        #expect(try cli(tpm, ["has", "--", "svc", "--x"]).status == 0)
        #expect(String(decoding: try cli(tpm, ["ls", "svc"]).stdout, as: UTF8.self) == "--x\n")
        #expect(try cli(tpm, ["rm", "svc", "--", "--x"]).status == 0)
        #expect(try cli(tpm, ["has", "svc", "--", "--x"]).status == 1)
        // Options after `--` are operands, not options: `get` takes exactly SERVICE KEY.
        #expect(try cli(tpm, ["get", "--", "svc", "k", "--json"]).status == 2)
    }

    /// A key or label with terminal escapes and newlines is printed escaped: it cannot recolour the
    /// terminal, clear it, or forge a line of `ls` or `info` output.
    @Test func controlCharactersInKeysAndLabelsAreEscapedInTextOutput() throws {
        let tpm = try SoftwareTPM()
        let key = "a\u{1B}[31mred\nforged", label = "L\u{1B}]0;title\u{07}\u{9B}2J\u{202E}"
        #expect(try cli(tpm, ["set", "svc", key, "--label", label], input: [1]).status == 0)
        let ls = String(decoding: try cli(tpm, ["ls", "svc"]).stdout, as: UTF8.self)
        #expect(ls == "a\\x1b[31mred\\nforged\n")
        let info = String(decoding: try cli(tpm, ["info", "svc", key]).stdout, as: UTF8.self)
        #expect(info.contains("key: a\\x1b[31mred\\nforged\n"))
        #expect(info.contains("label: L\\x1b]0;title\\x07\\u{009b}2J\\u{202e}\n"))
        // Error messages that echo a key or a command.
        let missing = try cli(tpm, ["get", "svc", "b\u{1B}[2J\\"])
        #expect(missing.status == 1 && missing.stderr.contains("no item 'b\\x1b[2J\\\\'"))
        let unknown = try cli(tpm, ["\u{1B}[2Jcmd"])
        #expect(unknown.status == 2 && unknown.stderr.contains("unknown command '\\x1b[2Jcmd'"))
        for output in [ls, info, missing.stderr, unknown.stderr] {
            #expect(!output.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x9B })
        }
        // JSON keeps the exact key (JSON escapes it); the escaping is for text only.
        let json = try cli(tpm, ["--json", "ls", "svc"])
        #expect(try JSONSerialization.jsonObject(with: Data(json.stdout)) as? [String] == [key])
    }
}
