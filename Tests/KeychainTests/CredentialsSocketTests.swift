import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// keychaind's credentials socket (`--credentials-socket`, 0666 so that user managers reach it) attacked
/// as the keychain socket was (issue 38 items 1–4): it is a door of the same connection server, so one
/// uid holds at most its quarter of the daemon's descriptors and threads, a connection whose thread
/// cannot start is refused and closed at once, and what a caller chose (its address) or does (a
/// fetch a millisecond) cannot forge or flood keychaind's log. keychaind runs on a real swtpm, the
/// callers are other uids through `setpriv`.
@Suite("keychaind: the credentials socket's limits and log", .offThePool)
struct CredentialsSocketTests {
    static let attacker: UInt32 = 65534
    static let other: UInt32 = 65533
    /// keychaind's uid in the task-limit test, run by no other test.
    static let threadLimitedUser: uid_t = 65528

    static var keychainctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    /// python3 as `uid` (root when nil) running `script` after the fetch helper: `fetch(unit, id)` connects
    /// to the credentials socket (argv[1]) from systemd's address `\0<hex>/unit/<unit>/<id>` and reads
    /// to the end, as a service manager's LoadCredential= does; what it read (None on a reset).
    func python(_ script: String, uid: UInt32?, _ args: [String]) throws -> ChildResult {
        let helper = """
            import os, socket, sys, time, select
            def fetch(unit, cid, raw=None):
                s = socket.socket(socket.AF_UNIX)
                s.bind(b'\\0' + (raw if raw is not None else ('%x/unit/%s/%s' % (int.from_bytes(os.urandom(8), 'big') | 1, unit, cid)).encode()))
                s.connect(sys.argv[1]); s.shutdown(socket.SHUT_WR)
                out = b''
                while True:
                    try: chunk = s.recv(1 << 20)
                    except ConnectionResetError: return None
                    if not chunk: break
                    out += chunk
                s.close()
                return out

            """
        let argv = ["/usr/bin/python3", "-c", helper + script] + args
        if let uid {
            return try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + argv)
        }
        return try run(argv[0], Array(argv.dropFirst()))
    }

    /// keychainctl through `daemon` as `uid`.
    func ctl(_ daemon: KeychainDaemon, _ args: [String], input: [UInt8] = [], uid: UInt32) throws -> ChildResult {
        try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", Self.keychainctl] + args,
                input: input, environment: daemon.environment)
    }

    func log(_ daemon: KeychainDaemon) -> [UInt8] {
        Array(FileManager.default.contents(atPath: daemon.directory + "/keychaind.log") ?? Data())
    }

    /// Descriptors and threads of process `pid` now.
    func resources(_ pid: pid_t) -> (descriptors: Int, threads: Int) {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let threads = status.split(separator: "\n").first { $0.hasPrefix("Threads:") }
            .flatMap { Int($0.dropFirst("Threads:".count).trimmingCharacters(in: .whitespaces)) } ?? -1
        return (descriptors, threads)
    }

    /// Before, the credentials socket had no limit: a uid that connected and never read held a thread and
    /// a descriptor per connection while keychaind wrote its 1 MiB refusal (2 s a send), and 400 such
    /// connections under RLIMIT_NOFILE 300 left keychaind at 299 descriptors, another uid's `get` failing
    /// with errno 24. Now the socket is a door of the keychain socket's server: the uid holds its quarter
    /// of the connections (59 of 236 under 300 descriptors), each for at most the refusal's 2 s, the rest
    /// are refused at accept, and another uid's reads go on meanwhile.
    @Test func aUidHoldingCredentialsConnectionsTakesOnlyItsQuarterOfTheDaemon() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, processLimits: ["--nofile=300"], credentialsSocket: true)
        #expect(try ctl(daemon, ["set", "svc", "k"], input: Array("v".utf8), uid: Self.other).status == 0)
        let idle = resources(daemon.processIdentifier)

        // The attacker keeps 400 connections open for 12 s, never reading, and opens another for each
        // one keychaind closes.
        let attack = """
            import select, socket, sys, time
            socks, until, said = set(), time.monotonic() + 12, False
            while time.monotonic() < until:
                while len(socks) < 400:
                    s = socket.socket(socket.AF_UNIX); s.setblocking(False)
                    try: s.connect(sys.argv[1])
                    except BlockingIOError: pass
                    except OSError: s.close(); break
                    socks.add(s)
                if not said: print('holding', flush=True); said = True
                poller, by = select.poll(), {}
                for s in socks: poller.register(s, select.POLLHUP); by[s.fileno()] = s
                for fd, event in poller.poll(20):
                    if event & (select.POLLHUP | select.POLLERR): by[fd].close(); socks.discard(by[fd])
            """
        let out = Pipe()
        let attacker = Process()
        attacker.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        attacker.arguments = ["--reuid=\(Self.attacker)", "--regid=\(Self.attacker)", "--clear-groups", "/usr/bin/python3", "-c", attack,
                              daemon.credentialsSocket]
        attacker.standardOutput = out
        try attacker.run()
        defer { attacker.terminate() }
        _ = try read(out.fileHandleForReading, until: "the attacker's 400 connections") { String(decoding: $0, as: UTF8.self).contains("holding") }

        // Meanwhile: another uid's reads, and keychaind's descriptors and threads sampled.
        var most = (descriptors: 0, threads: 0)
        var reads: [ChildResult] = []
        while attacker.isRunning {
            let now = resources(daemon.processIdentifier)
            most = (max(most.descriptors, now.descriptors), max(most.threads, now.threads))
            if reads.count < 3 { reads.append(try ctl(daemon, ["get", "svc", "k"], uid: Self.other)) }
            usleep(100_000)
        }
        for read in reads {
            #expect(read.status == 0 && read.stdout == Array("v".utf8), "another uid's get under the attack: \(read.status) \(read.stderr)")
        }
        // 59 connections of the attacker's at most, a descriptor and a thread each, beside the idle daemon's.
        #expect(most.descriptors <= idle.descriptors + 59 + 8, "keychaind held \(most.descriptors) descriptors (idle: \(idle))")
        #expect(most.threads <= idle.threads + 59 + 8, "keychaind ran \(most.threads) threads (idle: \(idle))")
        let said = String(decoding: log(daemon), as: UTF8.self)
        #expect(said.contains("credentials socket: refused a connection of uid \(Self.attacker)") && said.contains("a quarter of --max-connections"),
                "\(said.suffix(2000))")
    }

    /// Before, a credentials connection whose thread could not start was refused on the accept loop,
    /// which waited up to 2 s a send for the client to read the 1 MiB refusal (and before that, with
    /// Foundation's Thread, it was never closed): 80 connections under RLIMIT_NPROC kept the loop and the
    /// credentials socket's callers waiting for minutes. Now each is refused without waiting and closed
    /// at once, and once threads can start a unit's credential is served.
    @Test func aCredentialsConnectionWhoseThreadCannotStartIsClosedAtOnce() throws {
        let tpm = try SoftwareTPM()
        // A uid of its own: its task count must be this daemon's and the filler's alone (DaemonResourceTests.daemonUser).
        let daemon = try KeychainDaemon(tpm: tpm, user: Self.threadLimitedUser, processLimits: ["--nproc=64"],
                                        credentialsSocket: true)
        #expect(try run(Self.keychainctl, ["credential", "set", "db.service", "password"], input: Array("s3cret".utf8),
                        environment: daemon.environment).status == 0)
        let (filler, hold, refill) = try DaemonResourceTests().fillTasksKept(of: Self.threadLimitedUser, to: 65)
        try refill()  // after the `credential set`'s connection thread has ended

        // 80 connections that never read: when does keychaind close each?
        let burst = try python("""
            socks = []
            for i in range(80):
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.shutdown(socket.SHUT_WR); socks.append(s)
            start, open_ = time.monotonic(), set(socks)
            while open_ and time.monotonic() - start < 10:
                poller, by = select.poll(), {}
                for s in open_: poller.register(s, select.POLLHUP); by[s.fileno()] = s
                for fd, event in poller.poll(100): open_.discard(by[fd])
            print(80 - len(open_), flush=True)
            """, uid: nil, [daemon.credentialsSocket])
        let closed = Int(String(decoding: burst.stdout, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(closed == 80, "closed by keychaind within 10 s: \(closed.map(String.init) ?? burst.stderr) of 80")
        let said = String(decoding: log(daemon), as: UTF8.self)
        #expect(said.contains("credentials socket: refused a connection of uid 0") && said.contains("cannot start a thread"), "\(said.suffix(2000))")

        try hold.fileHandleForWriting.close()
        filler.waitUntilExit()
        let served = try python("print(fetch('db.service', 'password'))", uid: nil, [daemon.credentialsSocket])
        #expect(String(decoding: served.stdout, as: UTF8.self) == "b's3cret'\n", "\(served.stderr)")
    }

    /// Before, the unit and ID from a caller's abstract address were logged raw: uid 65534 bound an
    /// address whose unit held a newline, a NUL and an escape sequence, and keychaind's log showed a forged
    /// line "keychaind: unit db.service (system manager) credential db-password: served to pid 1" as its
    /// own. Now each field from the caller is escaped (`\xNN`, as systemd escapes unit names) and the line
    /// stays one line, with no control byte in the log.
    @Test func aCallersAddressCannotForgeALogLine() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, credentialsSocket: true)
        let forged = "keychaind: unit db.service (system manager) credential db-password: served to pid 1"
        let fetched = try python("""
            got = fetch(None, None, raw=b'a/unit/x\\0y\\n\(forged)\\x1b[2K\\n/k')
            print('refused' if got is None or len(got) > 1 << 20 else 'served %d' % len(got))
            """, uid: Self.attacker, [daemon.credentialsSocket])
        #expect(String(decoding: fetched.stdout, as: UTF8.self) == "refused\n", "\(fetched.stderr)")
        let bytes = log(daemon)
        #expect(!bytes.contains(0) && !bytes.contains(0x1B), "a NUL or an escape in the log")
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\n")
        #expect(!lines.contains { $0.hasPrefix(forged) }, "a forged line: \(lines)")
        #expect(lines.contains { $0.contains("unit x\\x00y\\x0akeychaind:\\x20unit\\x20db.service") && $0.contains("\\x1b[2K\\x0a") },
                "the refusal's line: \(lines)")
    }

    /// Before, one uid fetching its own `--user` credentials wrote a log line a fetch (259,680 lines in
    /// 15 s): journald's rate limit then drops the lines that matter. Now a uid's lines beyond 20 a minute
    /// are counted, not written, and another uid's still are.
    @Test func oneUidsFetchesCannotFloodTheLog() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, credentialsSocket: true)
        for (id, value) in [("a", "alpha"), ("b", "beta")] {
            let stored = try ctl(daemon, ["credential", "set", "--user", "demo.service", id], input: Array(value.utf8), uid: Self.attacker)
            #expect(stored.status == 0, "\(stored.stderr)")
        }
        // Two credentials in turn: no two lines alike in a row.
        let fetched = try python("""
            served = sum(fetch('demo.service', 'ab'[i % 2]) == [b'alpha', b'beta'][i % 2] for i in range(400))
            print(served)
            """, uid: Self.attacker, [daemon.credentialsSocket])
        #expect(String(decoding: fetched.stdout, as: UTF8.self) == "400\n", "\(fetched.stderr)")
        // Another uid's refusal and the system manager's are written after the flood.
        _ = try python("fetch('demo.service', 'a')", uid: Self.other, [daemon.credentialsSocket])
        _ = try python("fetch('db.service', 'password')", uid: nil, [daemon.credentialsSocket])

        let lines = String(decoding: log(daemon), as: UTF8.self).split(separator: "\n")
        let flood = lines.filter { $0.contains("(user manager of uid \(Self.attacker))") }
        #expect(flood.count == 20, "the attacker's lines: \(flood.count)")
        #expect(lines.contains { $0.contains("(user manager of uid \(Self.other)) credential a: no such credential") }, "\(lines.suffix(5))")
        #expect(lines.contains { $0.contains("unit db.service (system manager) credential password: no such credential") }, "\(lines.suffix(5))")
    }
}
