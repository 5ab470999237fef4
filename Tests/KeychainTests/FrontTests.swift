import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// keychainctl's front (Sources/keychainctl, no Foundation) against the full tool (keychainctl-full)
/// over one keychaind: every command the front does itself gives the same stdout, stderr and exit
/// code, byte for byte, as a user other than root (SO_PEERCRED) and as root.
@Suite("keychainctl's front", .offThePool)
struct FrontTests {
    static let nobody: UInt32 = 65534
    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM()
        daemon = try KeychainDaemon(tpm: tpm, reader: tpm.directory + "/reader")
    }

    typealias Outcome = (status: Int32, out: [UInt8], err: String)

    /// `tool` (keychainctl or keychainctl-full, from the build) as `uid`.
    func invoke(_ tool: String, _ args: [String], input: [UInt8] = [], uid: UInt32 = Self.nobody,
                environment: [String: String]? = nil) throws -> Outcome {
        let path = buildDirectory.appendingPathComponent(tool).path
        let result = try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", path] + args,
                             input: input, environment: environment ?? daemon.environment)
        return (result.status, result.stdout, result.stderr)
    }

    /// Runs the front, then the full tool, with the same arguments, input and environment; `between`
    /// puts the state back between the two (for writes). Returns the front's outcome.
    @discardableResult
    func same(_ args: [String], input: String = "", uid: UInt32 = Self.nobody, environment: [String: String]? = nil,
              between: () throws -> Void = {}, sourceLocation: SourceLocation = #_sourceLocation) throws -> Outcome {
        let front = try invoke("keychainctl", args, input: Array(input.utf8), uid: uid, environment: environment)
        try between()
        let full = try invoke("keychainctl-full", args, input: Array(input.utf8), uid: uid, environment: environment)
        #expect(front.status == full.status, "\(args): exit \(front.status) vs \(full.status)", sourceLocation: sourceLocation)
        #expect(front.out == full.out, "\(args): stdout \(front.out) vs \(full.out)", sourceLocation: sourceLocation)
        #expect(front.err == full.err, "\(args): stderr\n\(front.err)\nvs\n\(full.err)", sourceLocation: sourceLocation)
        return front
    }

    /// A passcode (biometric items need one) and the finger "thumb" on the daemon's reader.
    func enrollThumb() throws {
        #expect(try invoke("keychainctl", ["passcode", "set"], input: Array("2468\n".utf8), uid: 0).status == 0)
        #expect(try invoke("keychainctl", ["reader", "enroll", "thumb"], input: Array("2468\n".utf8), uid: 0).status == 0)
    }

    @Test func everyItemCommandOfTheFrontMatchesTheFullTool() throws {
        let set = { (key: String, value: String) throws in
            #expect(try invoke("keychainctl-full", ["set", "mail", key], input: Array(value.utf8)).status == 0)
        }
        // set, over the same item twice (a replace), then both tools read what the front wrote.
        #expect(try same(["set", "mail", "token"], input: "v\u{0}1\n").status == 0)
        #expect(try same(["get", "mail", "token"]).out == Array("v\u{0}1\n".utf8))
        try same(["set", "--label", "L", "--accessible", "always", "--synchronizable", "mail", "labelled"], input: "x")
        try enrollThumb()
        try same(["set", "mail", "guarded", "--access-control=biometryAny", "--accessible", "whenUnlocked"], input: "y")
        // Keys a terminal would act on are escaped in messages and listings, as the full tool does.
        for key in ["a\"b/é\n", "\u{1b}[31mred", "back\\slash", "\u{202e}rtl", "\u{85}c1", "tab\there"] { try set(key, "k") }
        let listed = try same(["ls", "mail"])
        #expect(String(decoding: listed.out, as: UTF8.self).contains("\\x1b[31mred\n"))
        try same(["ls", "empty-service"])
        try same(["has", "mail", "token"])
        #expect(try same(["has", "mail", "none"]).status == 1)
        let missing = try same(["get", "mail", "\u{1b}]0;title\u{7}", "--", ])
        #expect(missing.status == 1 && missing.err.contains("\\x1b]0;title\\x07"))
        try same(["get", "--", "mail", "--key-that-looks-like-an-option"])
        // rm of a present item (put back between the two), of a missing one.
        #expect(try same(["rm", "mail", "tab\there"], between: { try set("tab\there", "k") }).status == 0)
        #expect(try same(["rm", "mail", "tab\there"]).status == 1)
        // clear of a service with items (one put back between the two), of an empty one.
        let refill = { () throws in _ = try invoke("keychainctl-full", ["set", "other", "k"], input: Array("v".utf8)) }
        try refill()
        #expect(try same(["clear", "other"], between: refill).status == 0)
        try same(["clear", "other"])
        #expect(try invoke("keychainctl-full", ["ls", "other"]).out.isEmpty)
        // Errors of the daemon: INVALID_ARGUMENT (exit 2), an item behind a prompt with no one to ask.
        #expect(try same(["get", "mail", ""]).status == 2)
        #expect(try same(["set", "mail", ""], input: "x").status == 2)
        #expect(try same(["set", "mail", String(repeating: "k", count: 5000)], input: "x").status == 2)
        let prompt = try same(["get", "mail", "guarded"])
        #expect(prompt.status == 3 && prompt.err.contains("INTERACTION_NOT_ALLOWED"), "\(prompt.err)")
        // Root does not see nobody's items.
        #expect(try same(["get", "mail", "token"], uid: 0).status == 1)
    }

    @Test func accessGroupsAndAMissingDaemonMatchTheFullTool() throws {
        try daemon.setGroup("team", ["uid \(Self.nobody)"])
        try same(["set", "--access-group", "team", "vpn", "psk"], input: "shared")
        #expect(try same(["get", "--access-group", "team", "vpn", "psk"]).out == Array("shared".utf8))
        try same(["ls", "--access-group=team", "vpn"])
        for args in [["get", "--access-group", "team", "vpn", "psk"], ["set", "--access-group", "team", "vpn", "x"],
                     ["has", "--access-group", "nosuch", "vpn", "psk"], ["rm", "--access-group", "team", "vpn", "psk"],
                     ["ls", "--access-group", "team", "vpn"]] {
            let denied = try same(args, uid: 0)
            #expect(denied.status == 3 && denied.err.contains("ACCESS_DENIED"), "\(args): \(denied.err)")
        }
        // No daemon at KEYCHAIN_SOCKET: HARDWARE_UNAVAILABLE, for reads and for a write after its input.
        let gone = ["KEYCHAIN_SOCKET": daemon.directory + "/none.sock"]
        for args in [["get", "mail", "token"], ["has", "mail", "token"], ["rm", "mail", "token"], ["ls", "mail"], ["set", "mail", "k"],
                     ["clear", "mail"]] {
            let result = try same(args, input: "v", environment: gone)
            #expect(result.status == 3 && result.err.contains("HARDWARE_UNAVAILABLE: The keychain service is not running"))
        }
        // A listener that is not a uid trusted to serve the keychain (nobody's, for root): refused by
        // both before anything is sent (WireSocket.connect's SO_PEERCRED check), in the same words.
        let impostor = try ImpostorTests.Impostor()
        for args in [["get", "mail", "token"], ["set", "mail", "k"], ["ls", "--json", "mail"]] {
            let refused = try same(args, input: "v", uid: 0, environment: ["KEYCHAIN_SOCKET": impostor.socket])
            #expect(refused.status == 3 && (refused.err + String(decoding: refused.out, as: UTF8.self)).contains("is not trusted"))
        }
        #expect(!(try impostor.finish()).contains("frame"))
        // A value over 16 MiB is refused before any connection, by both.
        let huge = String(repeating: "v", count: (16 << 20) + 1)
        #expect(try same(["set", "mail", "big"], input: huge, environment: gone).status == 2)
    }

    /// --json as the full tool writes it (Foundation's JSONEncoder, sorted keys): results, not found,
    /// and errors, which go to stdout as JSON whenever an argument is "--json", even an operand.
    @Test func jsonMatchesTheFullTool() throws {
        let odd = ["a\"b/c\\d", "\u{1}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1f}\u{7f}", "é😀\u{202e}\u{85}", "--json"]
        for key in odd { #expect(try invoke("keychainctl-full", ["set", "mail", "--", key], input: Array("v".utf8)).status == 0) }
        let refill = { () throws in _ = try invoke("keychainctl-full", ["set", "mail", "token"], input: Array("v".utf8)) }
        #expect(try same(["set", "--json", "mail", "token"], input: "v").out == Array("{\"stored\":true}\n".utf8))
        #expect(try same(["ls", "mail", "--json"]).out.first == UInt8(ascii: "["))
        try same(["ls", "--json", "nothing-here"])
        #expect(try same(["get", "--json", "mail", "token"]).out == Array("v".utf8))
        for key in odd + ["missing"] {
            try same(["get", "--json", "mail", "--", key + "x"])
            try same(["has", "--json", "mail", "--", key])
        }
        // A key "--json" after "--": a value, not JSON (the full tool's switch is not set).
        #expect(try same(["get", "mail", "--", "--json"]).out == Array("v".utf8))
        try same(["rm", "--json", "mail", "token"], between: refill)
        try same(["rm", "--json", "mail", "token"])
        try same(["clear", "--json", "mail"], between: refill)
        let invalid = try same(["get", "--json", "mail", ""])
        #expect(invalid.status == 2 && invalid.err.isEmpty && String(decoding: invalid.out, as: UTF8.self).hasPrefix("{\"error\":{\"code\":\"INVALID_ARGUMENT\""))
        let denied = try same(["has", "--access-group", "nosuch", "--", "mail", "--json"])
        #expect(denied.status == 3 && String(decoding: denied.out, as: UTF8.self).contains("ACCESS_DENIED"))
        let gone = try same(["ls", "--json", "mail"], environment: ["KEYCHAIN_SOCKET": daemon.directory + "/none.sock"])
        #expect(String(decoding: gone.out, as: UTF8.self).hasPrefix("{\"error\":{\"cause\":\"errno 2\",\"code\":\"HARDWARE_UNAVAILABLE\""))
    }

    /// A read behind a prompt with an answer on the command line: the front hands it to the full
    /// tool, which asks again and answers it (the value comes out once, right).
    @Test func aPromptIsAnsweredByTheFullTool() throws {
        try enrollThumb()
        #expect(try invoke("keychainctl", ["set", "mail", "bio", "--access-control", "biometryAny"], input: Array("fp".utf8)).status == 0)
        #expect(try same(["get", "mail", "bio", "--touch", "thumb"]).out == Array("fp".utf8))
        let wrong = try same(["get", "mail", "bio", "--touch", "index"])
        #expect(wrong.status == 3 && wrong.err.contains("AUTHENTICATION_FAILED"), "\(wrong.err)")
        try same(["get", "mail", "bio", "--touch", "cancel"])
        // On a terminal (script(1) gives both a pty): the full tool's prompt, answered there, for a
        // guarded item; an open item is the front's alone, with no prompt.
        func onTerminal(_ tool: String, _ key: String) throws -> [UInt8] {
            let path = buildDirectory.appendingPathComponent(tool).path
            return try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/usr/bin/script",
                                                "-qec", "'\(path)' get mail \(key)", "/dev/null"],
                           input: Array("thumb\n".utf8), environment: daemon.environment).stdout
        }
        let asked = try onTerminal("keychainctl", "bio")
        #expect(asked == (try onTerminal("keychainctl-full", "bio")))
        #expect(String(decoding: asked, as: UTF8.self).contains("Authenticate to read 'bio'") && asked.suffix(2) == Array("fp".utf8))
        #expect(try invoke("keychainctl", ["set", "mail", "open"], input: Array("o".utf8)).status == 0)
        let open = String(decoding: try onTerminal("keychainctl", "open"), as: UTF8.self)
        #expect(open.replacingOccurrences(of: "thumb\r\n", with: "") == "o", "\(open)")  // the terminal echoes the input it got
    }

    // MARK: Handing over, and where the full tool is found

    /// A folder holding a copy of the front and, unless `withFullTool` is false, a stand-in
    /// keychainctl-full that records its arguments, its stdin and one variable of its environment.
    func frontAlone(withFullTool: Bool = true) throws -> String {
        let folder = tpm.directory + "/front-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        // Written by a child: a descriptor open for writing in this process, inherited by a parallel
        // test's fork, would make exec fail with ETXTBSY.
        #expect(try run("/bin/cp", [buildDirectory.appendingPathComponent("keychainctl").path, folder + "/keychainctl"]).status == 0)
        if withFullTool { try plantRecorder(folder + "/keychainctl-full", record: folder + "/ran") }
        return folder
    }

    func plantRecorder(_ path: String, record: String) throws {
        let script = "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > '\(record).args'\ncat > '\(record).stdin'\n"
            + "printf '%s' \"$PROBE\" > '\(record).env'\nexit 42\n"
        #expect(try run("/bin/sh", ["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh", path], input: Array(script.utf8)).status == 0)
    }

    func recorded(_ record: String) -> (args: [String], stdin: String, env: String)? {
        guard let args = try? String(contentsOfFile: record + ".args", encoding: .utf8) else { return nil }
        return (args.split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init),
                (try? String(contentsOfFile: record + ".stdin", encoding: .utf8)) ?? "", (try? String(contentsOfFile: record + ".env", encoding: .utf8)) ?? "")
    }

    @Test func whatTheFrontDoesNotDoGoesToTheFullToolUnchanged() throws {
        let folder = try frontAlone()
        let env = daemon.environment.merging(["PROBE": "kept"]) { $1 }
        for args in [["status"], ["--json", "can-use", "passcode"], ["get", "mail", "token", "--auth-validity", "5"],
                     ["get", "mail", "token", "--passcode-stdin"], ["--direct", "get", "mail", "token"], ["--help"],
                     ["set", "mail", "k", "--accessible", "sometimes"], ["get", "mail"], ["ls", "mail", "--unknown"],
                     ["set", "--key-storage", "strongbox", "mail", "k"], ["info", "mail", "k"], ["get", "", "k"],
                     ["get", String(repeating: "s", count: 257), "k"], ["get", "--access-group=", "mail", "k"]] {
            try? FileManager.default.removeItem(atPath: folder + "/ran.args")
            let result = try run(folder + "/keychainctl", args, input: Array("stdin left alone\n".utf8), environment: env)
            #expect(result.status == 42, "\(args): \(result.stderr)")
            let seen = try #require(recorded(folder + "/ran"), "\(args)")
            #expect(seen.args == [folder + "/keychainctl-full"] + args)
            #expect(seen.stdin == "stdin left alone\n" && seen.env == "kept", "\(args)")
        }
        // A handled command in direct mode (no socket named, KEYCHAIN_STORE set) is the full tool's too.
        try? FileManager.default.removeItem(atPath: folder + "/ran.args")
        #expect(try run(folder + "/keychainctl", ["get", "mail", "token"], environment: ["KEYCHAIN_SOCKET": "", "KEYCHAIN_STORE": folder]).status == 42)
        #expect(recorded(folder + "/ran") != nil)
        // An argument that is not UTF-8 (the full tool names it): through python3, bytes as they are.
        try? FileManager.default.removeItem(atPath: folder + "/ran.args")
        let script = "import os,sys; os.execv(sys.argv[1], [sys.argv[1], 'get', b'\\xff'.decode('utf-8', 'surrogateescape'), 'k'])"
        #expect(try run("/usr/bin/python3", ["-c", script, folder + "/keychainctl"], environment: env).status == 42)
        #expect(FileManager.default.fileExists(atPath: folder + "/ran.args"))
        // KEYCHAIN_SOCKET twice in the environment (execve takes any list): getenv reads the first,
        // the full tool the last; the front hands over rather than ask another daemon than it would.
        try? FileManager.default.removeItem(atPath: folder + "/ran.args")
        let twice = """
            import ctypes, sys
            libc = ctypes.CDLL(None)
            path = sys.argv[1].encode()
            argv = (ctypes.c_char_p * 5)(path, b'get', b'mail', b'token', None)
            env = (ctypes.c_char_p * 4)(b'KEYCHAIN_SOCKET=/nonexistent/keychaind.sock', b'KEYCHAIN_SOCKET=' + sys.argv[2].encode(),
                                        b'PROBE=kept', None)
            libc.execve(path, argv, env)
            """
        let doubled = try run("/usr/bin/python3", ["-c", twice, folder + "/keychainctl", daemon.socket])
        #expect(doubled.status == 42, "\(doubled.stderr)")
        #expect(recorded(folder + "/ran")?.args == [folder + "/keychainctl-full", "get", "mail", "token"])
    }

    /// A read that meets a prompt while the full tool could answer it (here --touch) is handed over
    /// with its arguments and stdin, with an answer (--touch) or without (the system's prompts).
    @Test func aReadThatMeetsAPromptIsHandedOver() throws {
        try enrollThumb()
        #expect(try invoke("keychainctl-full", ["set", "mail", "guarded", "--access-control", "biometryAny"], input: Array("y".utf8), uid: 0).status == 0)
        let folder = try frontAlone()
        let handed = try run(folder + "/keychainctl", ["get", "mail", "guarded", "--touch", "thumb"], input: Array("in".utf8),
                             environment: daemon.environment)
        #expect(handed.status == 42 && recorded(folder + "/ran")?.args == [folder + "/keychainctl-full", "get", "mail", "guarded", "--touch", "thumb"])
        #expect(recorded(folder + "/ran")?.stdin == "in")
        try FileManager.default.removeItem(atPath: folder + "/ran.args")
        // Without one too: the full tool asks through the prompts can-use counts, or says why none can.
        let asked = try run(folder + "/keychainctl", ["get", "mail", "guarded"], environment: daemon.environment)
        #expect(asked.status == 42 && recorded(folder + "/ran")?.args == [folder + "/keychainctl-full", "get", "mail", "guarded"])
        try FileManager.default.removeItem(atPath: folder + "/ran.args")
        // A read the front answers itself never runs the full tool.
        #expect(try invoke("keychainctl-full", ["set", "mail", "open"], input: Array("o".utf8), uid: 0).status == 0)
        let served = try run(folder + "/keychainctl", ["get", "mail", "open", "--touch", "thumb"], environment: daemon.environment)
        #expect(served.status == 0 && served.stdout == Array("o".utf8) && recorded(folder + "/ran") == nil)
    }

    /// The full tool is the one next to the front's own executable (/proc/self/exe): not one named by
    /// argv[0], found on PATH or in the working directory, or next to a symbolic link to the front.
    @Test func theFullToolIsOnlyTheOneBesideTheFrontItself() throws {
        let folder = try frontAlone()
        let attacker = tpm.directory + "/attacker-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: attacker, withIntermediateDirectories: true)
        try plantRecorder(attacker + "/keychainctl-full", record: attacker + "/ran")
        try FileManager.default.createSymbolicLink(atPath: attacker + "/keychainctl", withDestinationPath: folder + "/keychainctl")
        // Through the link, with argv[0] naming the attacker's folder, PATH and the working directory its.
        let script = "cd \"$1\" && PATH=\"$1\" exec -a \"$1/keychainctl\" \"$1/keychainctl\" status"
        let result = try run("/bin/bash", ["-c", script, "bash", attacker])
        #expect(result.status == 42, "\(result.stderr)")
        #expect(recorded(attacker + "/ran") == nil, "the attacker's keychainctl-full ran")
        #expect(recorded(folder + "/ran") != nil)
        // Without a full tool beside it: a clear error, exit 3, nothing else run.
        let alone = try frontAlone(withFullTool: false)
        let missing = try run(alone + "/keychainctl", ["status"], environment: ["PATH": attacker])
        #expect(missing.status == 3 && missing.stderr.contains("cannot run \(alone)/keychainctl-full (errno 2"), "\(missing.stderr)")
        #expect(recorded(attacker + "/ran") == nil)
    }

    /// The Debian package's layout: no keychainctl-full beside the front, the multi-call executable that holds it
    /// instead. The front runs it as keychainctl-full (argv[0]), under the same ownership rules.
    @Test func withoutKeychainctlFullTheFrontRunsKeychainMulticallBesideItAsTheFullTool() throws {
        let folder = try frontAlone(withFullTool: false)
        #expect(try run("/bin/cp", [buildDirectory.appendingPathComponent("keychain-multicall").path, folder + "/keychain-multicall"]).status == 0)
        let help = try run(folder + "/keychainctl", ["help"])
        #expect(help.status == 0 && help.stdout.starts(with: Array("usage: keychainctl".utf8)), "\(help.stderr)")
        // Another user's (or everyone's) multi-call file is refused as keychainctl-full is.
        #expect(chmod(folder + "/keychain-multicall", 0o777) == 0)
        let refused = try run(folder + "/keychainctl", ["help"])
        #expect(refused.status == 3 && refused.stderr.contains("refusing to run \(folder)/keychain-multicall"), "\(refused.stderr)")
    }

    /// Root runs the front from a folder everyone may add files to (sticky, like /tmp): another user
    /// plants keychainctl-full beside it. The front refuses a full tool that is not root's or the
    /// caller's, that others can write, or that is a symbolic link, and runs its own user's.
    @Test func aFullToolAnotherUserPlantedIsNotRun() throws {
        let folder = "/tmp/keychainctl-sticky-" + UUID().uuidString.prefix(8)
        #expect(mkdir(folder, 0o755) == 0 && chmod(folder, 0o1777) == 0)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        #expect(try run("/bin/cp", [buildDirectory.appendingPathComponent("keychainctl").path, folder + "/keychainctl"]).status == 0)
        let planted = folder + "/keychainctl-full"
        let plant = "printf '#!/bin/sh\\ntouch \"$0.ran\"\\nexit 42\\n' > \"$1\" && chmod 755 \"$1\""
        #expect(try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/bin/sh", "-c", plant,
                                             "sh", planted]).status == 0)
        let refused = try run(folder + "/keychainctl", ["status"])
        #expect(refused.status == 3 && refused.stderr.contains("refusing to run \(planted)") && refused.stderr.contains("uid 65534's"),
                "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: planted + ".ran"), "root ran nobody's program")
        // Nobody's own run of nobody's file is nobody's business: it runs.
        #expect(try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", folder + "/keychainctl",
                                             "status"]).status == 42)
        #expect(unlink(planted + ".ran") == 0 && unlink(planted) == 0)
        // Root's file that everyone can write, and a symbolic link: refused too.
        try plantRecorder(planted, record: folder + "/ran")
        #expect(chmod(planted, 0o777) == 0)
        #expect(try run(folder + "/keychainctl", ["status"]).stderr.contains("refusing to run"))
        #expect(unlink(planted) == 0 && symlink("/bin/true", planted) == 0)
        #expect(try run(folder + "/keychainctl", ["status"]).stderr.contains("refusing to run"))
        #expect(recorded(folder + "/ran") == nil)
    }
}
