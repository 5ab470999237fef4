import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// keychaind's per-user limits (issue 22): one uid cannot fill the store, keep its space after a
/// `clear`, or put its backlog ahead of another user's calls. keychaind runs as root (the tests do),
/// the clients as other uids through `setpriv`, on a real swtpm.
@Suite("keychaind: per-user limits", .offThePool)
struct DaemonLimitTests {
    static let nobody: UInt32 = 65534
    static let other: UInt32 = 65533

    /// keychainctl through `daemon`, as root or as `uid`.
    func ctl(_ daemon: KeychainDaemon, _ args: [String], input: [UInt8] = [], uid: UInt32? = nil) throws
        -> (status: Int32, out: String, err: String)
    {
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = if let uid {
            try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", keychainctl] + args,
                    input: input, environment: daemon.environment)
        } else {
            try run(keychainctl, args, input: input, environment: daemon.environment)
        }
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// The store's files on disk: keychain.db and its write-ahead log.
    func storeBytes(_ daemon: KeychainDaemon) -> Int {
        ["keychain.db", "keychain.db-wal"].reduce(0) { sum, name in
            let size = (try? FileManager.default.attributesOfItem(atPath: daemon.store + "/" + name)[.size] as? Int) ?? 0
            return sum + size
        }
    }

    /// Before, one uid could write without limit (16 MiB values under endless keys and services)
    /// until the store's filesystem was full for everyone. Each uid's items now stop at the
    /// daemon's quota with QUOTA_EXCEEDED, saying which limit and how to raise it; nothing of the
    /// refused write is stored, another uid's writes go on, and space given back is usable again.
    @Test func aUidsWritesStopAtItsQuotaAndOthersWriteOn() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--quota-items", "5", "--quota-bytes", "64K"])
        for index in 1...5 {
            #expect(try ctl(daemon, ["set", "svc\(index)", "k"], input: Array("value".utf8), uid: Self.nobody).status == 0)
        }
        let refused = try ctl(daemon, ["set", "svc6", "k"], input: Array("value".utf8), uid: Self.nobody)
        #expect(refused.status == 3 && refused.err.contains("QUOTA_EXCEEDED") && refused.err.contains("quota of 5 items")
                && refused.err.contains("keychaind --quota-items") && refused.err.contains("uid \(Self.nobody)"),
                "the sixth item: \(refused.status) \(refused.err)")
        #expect(!refused.err.contains("uid:"), "the message names the daemon's namespace: \(refused.err)")
        #expect(try ctl(daemon, ["has", "svc6", "k"], uid: Self.nobody).status == 1, "a refused write left an item")
        // Replacing an item adds none: allowed at the item limit.
        #expect(try ctl(daemon, ["set", "svc1", "k"], input: Array("newer".utf8), uid: Self.nobody).status == 0)
        // Bytes: a 70 KiB value does not fit in 64 KiB, whatever the item count.
        #expect(try ctl(daemon, ["rm", "svc5", "k"], uid: Self.nobody).status == 0)
        let large = try ctl(daemon, ["set", "big", "k"], input: [UInt8](repeating: 0x61, count: 70 << 10), uid: Self.nobody)
        #expect(large.status == 3 && large.err.contains("QUOTA_EXCEEDED") && large.err.contains("quota of 64.0 KiB")
                && large.err.contains("--quota-bytes"), "\(large.err)")
        #expect(try ctl(daemon, ["has", "big", "k"], uid: Self.nobody).status == 1)
        // Another uid has its own quota; the freed slot is nobody's again.
        for index in 1...5 {
            #expect(try ctl(daemon, ["set", "svc\(index)", "k"], input: Array("v".utf8), uid: Self.other).status == 0)
        }
        #expect(try ctl(daemon, ["set", "svc6", "k"], input: Array("value".utf8), uid: Self.nobody).status == 0)
        #expect(try ctl(daemon, ["get", "svc1", "k"], uid: Self.nobody).out == "newer")
    }

    /// systemd credentials count against a quota as items do: the system manager's (stored by root) and
    /// each user manager's (stored by that user) are namespaces of their own, apart from the storer's items.
    @Test func credentialsStopAtTheirQuotaWithAMessageThatNamesTheFix() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--quota-items", "3", "--quota-bytes", "64K"])
        for index in 1...3 {
            #expect(try ctl(daemon, ["credential", "set", "unit\(index).service", "token"], input: Array("v".utf8)).status == 0)
        }
        let refused = try ctl(daemon, ["credential", "set", "unit4.service", "token"], input: Array("v".utf8))
        #expect(refused.status == 3 && refused.err.contains("QUOTA_EXCEEDED: The system manager's systemd credentials would hold more "
                                                            + "than the keychain service's quota of 3 items with item 'token'")
                && refused.err.contains("keychainctl credential ls UNIT, credential rm UNIT ID") && refused.err.contains("--quota-items"),
                "the fourth credential: \(refused.status) \(refused.err)")
        #expect(try ctl(daemon, ["credential", "ls", "unit4.service"]).out.isEmpty, "a refused credential was stored")
        let large = try ctl(daemon, ["credential", "set", "unit1.service", "token"], input: [UInt8](repeating: 0x61, count: 70 << 10))
        #expect(large.status == 3 && large.err.contains("quota of 64.0 KiB"), "\(large.err)")
        #expect(try ctl(daemon, ["credential", "get", "unit1.service", "token"]).out == "v", "the refused write replaced the value")
        // Root's own items and a user's own units' credentials are other namespaces, each with its quota.
        #expect(try ctl(daemon, ["set", "mail", "k"], input: Array("v".utf8)).status == 0)
        for index in 1...3 {
            #expect(try ctl(daemon, ["credential", "set", "--user", "app\(index).service", "token"], input: Array("v".utf8),
                            uid: Self.nobody).status == 0)
        }
        let user = try ctl(daemon, ["credential", "set", "--user", "app4.service", "token"], input: Array("v".utf8), uid: Self.nobody)
        #expect(user.status == 3 && user.err.contains("The user manager of uid \(Self.nobody)'s systemd credentials would hold more")
                && user.err.contains("credential rm --user UNIT ID"), "\(user.err)")
        #expect(try ctl(daemon, ["credential", "rm", "unit3.service", "token"]).status == 0)
        #expect(try ctl(daemon, ["credential", "set", "unit4.service", "token"], input: Array("v".utf8)).status == 0, "space given back")
    }

    /// Before, a connection over the per-uid or the total connection limit was closed at accept
    /// without a word: the client could only report a closed connection, as if the daemon had
    /// crashed. Now it gets one error frame first: HARDWARE_UNAVAILABLE (the service, not the call,
    /// is unavailable), naming the limit, the uid's count and what to do, read by a raw client that
    /// sends nothing and by both keychainctl tools as another uid; root and the others are served.
    @Test func aConnectionOverTheLimitsIsToldWhichLimitAndWhatToDo() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--max-connections", "4"])  // 1 per uid
        #expect(try ctl(daemon, ["set", "svc", "k"], input: Array("v".utf8)).status == 0)
        let nobody = try IdleConnections(socket: daemon.socket, count: 1, uid: Self.nobody)
        defer { nobody.release() }
        #expect(nobody.held == 1, "nobody holds \(nobody.held.map(String.init) ?? "?") connections")
        let perUser = "keychaind serves at most 1 connection of one uid at once (a quarter of --max-connections 4) and uid \(Self.nobody) has 1 open"
        // A raw client that sends nothing reads the refusal: an error frame, then the end.
        let raw = rawWireClient + """
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            reply = read(s, struct.unpack('>I', read(s, 4))[0])
            f = fields(reply)
            print(reply[1] == 0x81, f['30'], f['31'], s.recv(1) == b'', sep='\\n')
            """
        let said = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/usr/bin/python3", "-c",
                                                raw, daemon.socket])
        let lines = String(decoding: said.stdout, as: UTF8.self).split(separator: "\n").map(String.init)
        #expect(said.status == 0 && lines.count == 4 && lines[0] == "True" && lines[1] == "HARDWARE_UNAVAILABLE" && lines[3] == "True",
                "the raw client: \(lines) \(said.stderr)")
        #expect(lines.count > 2 && lines[2].hasPrefix(perUser) && lines[2].contains("nothing was done")
                && lines[2].contains("Close connections that user's programs hold idle and retry") && lines[2].contains("raise --max-connections"),
                "\(lines)")
        for tool in ["keychainctl", "keychainctl-full"] {
            let refused = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups",
                                                       buildDirectory.appendingPathComponent(tool).path, "get", "svc", "k"],
                                  environment: daemon.environment)
            #expect(refused.status == 3 && refused.stderr.contains("HARDWARE_UNAVAILABLE") && refused.stderr.contains(perUser),
                    "\(tool): \(refused.stderr)")
        }
        // Root has its own quarter.
        let served = try ctl(daemon, ["get", "svc", "k"])
        #expect(served.status == 0 && served.out == "v", "root while nobody holds its connection: \(served.err)")
        // Three more uids hold the other three connections: root's is refused for the total, in words.
        let others = try [Self.other, 65532, 65530].map { try IdleConnections(socket: daemon.socket, count: 1, uid: $0) }
        defer { for holder in others { holder.release() } }
        #expect(others.allSatisfy { $0.held == 1 }, "each uid holds one connection: \(others.map(\.held))")
        let full = try ctl(daemon, ["get", "svc", "k"])
        #expect(full.status == 3 && full.err.contains("HARDWARE_UNAVAILABLE")
                && full.err.contains("keychaind serves at most 4 connections at once (--max-connections) and all are open: nothing was done")
                && full.err.contains("Retry once some have closed"), "root with every connection held: \(full.err)")
    }

    /// Before, the database never shrank: a uid's 16 MiB values stayed on disk after `clear` (5.7 MB,
    /// 150 MB, then 260 MB after the clear: freed pages and the zeroed pages' log). Now freed pages
    /// go back to the filesystem (incremental vacuum, a checkpoint, a bounded log).
    @Test func aClearGivesTheSpaceBack() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        #expect(try ctl(daemon, ["set", "small", "k"], input: Array("v".utf8), uid: Self.other).status == 0)
        let empty = storeBytes(daemon)
        let value = [UInt8](repeating: 0x5A, count: 1 << 20)
        for index in 0..<12 {
            #expect(try ctl(daemon, ["set", "bulk", "k\(index)"], input: value, uid: Self.nobody).status == 0)
        }
        let full = storeBytes(daemon)
        #expect(full > 12 << 20, "12 MiB written: \(full) bytes on disk")
        #expect(try ctl(daemon, ["clear", "bulk"], uid: Self.nobody).status == 0)
        let cleared = storeBytes(daemon)
        print("store on disk: \(empty) bytes, \(full) with 12 MiB of values, \(cleared) after the clear")
        #expect(cleared < empty + (2 << 20), "after the clear the store still takes \(cleared) bytes (\(empty) before)")
        // Removing items one by one gives it back too, and what is left reads.
        for index in 0..<6 {
            #expect(try ctl(daemon, ["set", "bulk", "k\(index)"], input: value, uid: Self.nobody).status == 0)
        }
        for index in 0..<6 { #expect(try ctl(daemon, ["rm", "bulk", "k\(index)"], uid: Self.nobody).status == 0) }
        let removed = storeBytes(daemon)
        #expect(removed < empty + (2 << 20), "after the removals the store takes \(removed) bytes")
        #expect(try ctl(daemon, ["get", "small", "k"], uid: Self.other).out == "v")
    }

    /// A store made before incremental vacuum (auto_vacuum NONE, as every earlier store) is rebuilt
    /// once when it is opened, items kept, and gives space back from then on.
    @Test func anEarlierStoreIsMigratedToGiveSpaceBack() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        do {
            let daemon = try KeychainDaemon(tpm: tpm, store: store)
            #expect(try ctl(daemon, ["set", "svc", "k"], input: Array("kept".utf8)).status == 0)
            _ = daemon.kill()
        }
        // As the previous version left it: no auto_vacuum.
        let downgrade = try run("/usr/bin/sqlite3", [store + "/keychain.db", "PRAGMA auto_vacuum=NONE; VACUUM; PRAGMA auto_vacuum;"])
        #expect(String(decoding: downgrade.stdout, as: UTF8.self).hasPrefix("0"), "\(downgrade.stderr)")
        let daemon = try KeychainDaemon(tpm: tpm, store: store)
        #expect(try ctl(daemon, ["get", "svc", "k"]).out == "kept")
        let mode = try run("/usr/bin/sqlite3", [store + "/keychain.db", "PRAGMA auto_vacuum;"])
        #expect(String(decoding: mode.stdout, as: UTF8.self).hasPrefix("2"), "auto_vacuum after opening: \(mode.stdout)")
    }

    /// One uid's flood of cold writes (32 connections, each a write to a new service: a TPM Create
    /// each) used to put its whole backlog ahead of another user's warm read: the engine ran calls
    /// in arrival order. Now each uid has one call in the engine at a time, so the read waits for
    /// at most about one of the flood's writes. Measured as the number of the flood's writes that
    /// complete while one read is in flight (no wall time asserted); the latencies are printed.
    @Test func oneUidsFloodOfColdWritesDoesNotQueueAheadOfAnothersReads() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        #expect(try ctl(daemon, ["set", "mine", "k"], input: Array("v".utf8), uid: Self.other).status == 0)
        let flood = rawWireClient + """
            done, lock, stop = [], threading.Lock(), threading.Event()
            def writer(n):
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
                i = 0
                while not stop.is_set():
                    body = bytes([V, 1]) + field(1, options('flood-%d-%d' % (n, i))) + field(2, b'k') + field(3, b'x' * 64)
                    request(s, body)
                    with lock:
                        done.append(time.monotonic())
                        os.write(progress, b'.')
                    i += 1
            progress = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND)
            threads = [threading.Thread(target=writer, args=(n,), daemon=True) for n in range(32)]
            for t in threads: t.start()
            sys.stdin.read()
            stop.set()
            with lock: print(' '.join('%.6f' % t for t in done))
            os._exit(0)
            """
        let reads = rawWireClient + """
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            body = bytes([V, 2]) + field(1, options('mine')) + field(2, b'k')
            # Reads while the flood is under way, until 20 reads saw at least 60 of its writes complete
            # (counted in the progress file, one byte a write): a machine's load sets how long that takes.
            while os.path.getsize(sys.argv[2]) < 5: time.sleep(0.05)
            first = os.path.getsize(sys.argv[2])
            reads = 0
            while reads < 20 or (os.path.getsize(sys.argv[2]) - first < 60 and reads < 600):
                reads += 1
                start = time.monotonic()
                reply = request(s, body)
                assert reply[1] == 0x80, reply
                print('%.6f %.6f' % (start, time.monotonic()), flush=True)
                time.sleep(0.1)
            """
        // The flood's progress, one byte per completed write: written by the flooding uid, read by the other.
        let progress = tpm.directory + "-flood-progress"
        #expect(FileManager.default.createFile(atPath: progress, contents: nil, attributes: [.posixPermissions: 0o666]))
        chmod(progress, 0o666)
        defer { unlink(progress) }
        let held = Pipe(), floodOut = Pipe()
        let python = Process()
        python.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        python.arguments = ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups", "/usr/bin/python3", "-c", flood,
                            daemon.socket, progress]
        python.standardInput = held
        python.standardOutput = floodOut
        try python.run()
        let victim = try run("/usr/bin/setpriv", ["--reuid=\(Self.other)", "--regid=\(Self.other)", "--clear-groups",
                                                  "/usr/bin/python3", "-c", reads, daemon.socket, progress])
        try held.fileHandleForWriting.close()
        let completions = String(decoding: try read(floodOut.fileHandleForReading, until: "the flooding uid's writes to end"), as: UTF8.self)
            .split(whereSeparator: \.isWhitespace).compactMap { Double($0) }
        try waitForExit(python, "the flooding uid's python")
        let windows = String(decoding: victim.stdout, as: UTF8.self).split(separator: "\n").map {
            $0.split(separator: " ").compactMap { Double($0) }
        }.filter { $0.count == 2 }
        #expect(victim.status == 0 && windows.count >= 20, "\(victim.stderr)")
        let during = windows.map { window in completions.filter { $0 > window[0] && $0 < window[1] }.count }.sorted()
        let latencies = windows.map { ($0[1] - $0[0]) * 1000 }.sorted()
        let floodSeconds = (completions.last ?? 0) - (completions.first ?? 0)
        print("flood: \(completions.count) cold writes in \(String(format: "%.1f", floodSeconds)) s; other uid's read: "
              + "p50 \(String(format: "%.1f", latencies[latencies.count / 2])) ms, max \(String(format: "%.1f", latencies.last ?? 0)) ms; "
              + "flood writes completed during a read: \(during)")
        #expect(completions.count >= 65, "the flood made too few writes to test anything: \(completions.count)")
        #expect(during[during.count / 2] <= 3, "the flood's writes ran ahead of the read: \(during)")
    }

    /// Before, the reader's failure count was the device's: another uid's five wrong touches on its
    /// own item put the reader in LOCKOUT for everyone, root included. Now each uid's count is its
    /// own: the seed's "lockout after 5 failures" holds per user, and the others still read.
    @Test func fiveWrongTouchesLockTheReaderForThatUidOnly() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, reader: tpm.directory + "/reader")
        #expect(try ctl(daemon, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try ctl(daemon, ["reader", "enroll", "thumb"], input: Array("2468\n".utf8)).status == 0)
        for (uid, service) in [(nil, "rootbio"), (Self.nobody, "nbio"), (Self.other, "obio")] as [(UInt32?, String)] {
            let set = try ctl(daemon, ["set", service, "k", "--access-control", "biometryAny"], input: Array("\(service)'s".utf8), uid: uid)
            #expect(set.status == 0, "\(set.err)")
        }
        var answers: [String] = []
        for guess in 1...5 { answers.append(try ctl(daemon, ["get", "nbio", "k", "--touch", "guess\(guess)"], uid: Self.nobody).err) }
        #expect(answers.dropLast().allSatisfy { $0.contains("AUTHENTICATION_FAILED") } && answers.last!.contains("LOCKOUT"),
                "nobody's five wrong touches: \(answers)")
        // nobody is locked out, even with the enrolled finger, until it gives the passcode.
        #expect(try ctl(daemon, ["get", "nbio", "k", "--touch", "thumb"], uid: Self.nobody).err.contains("LOCKOUT"))
        let root = try ctl(daemon, ["get", "rootbio", "k", "--touch", "thumb"])
        #expect(root.status == 0 && root.out == "rootbio's", "root after nobody's lockout: \(root.err)")
        #expect(try ctl(daemon, ["get", "obio", "k", "--touch", "thumb"], uid: Self.other).out == "obio's")
    }

    /// Before, any uid could spend the TPM's passcode tries through `unlock` (its PIN index refuses
    /// the passcode after 10 wrong ones, for everyone, until the owner resets it). Now a uid that is
    /// neither root nor admin gives at most 3 wrong passcodes, by `unlock` or by a passcode item's
    /// read, and all such uids together at most the TPM's limit less 2: the device's owner always
    /// keeps tries, and `passcode reset-tries` gives every budget back.
    @Test func noOtherUidCanSpendTheTPMsPasscodeTries() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let wrong = Array("0000\n".utf8), right = Array("2468\n".utf8)
        #expect(try ctl(daemon, ["passcode", "set"], input: right).status == 0)
        var answers: [String] = []
        for _ in 1...12 { answers.append(try ctl(daemon, ["unlock"], input: wrong, uid: Self.nobody).err) }
        #expect(answers.prefix(3).allSatisfy { $0.contains("AUTHENTICATION_FAILED") }, "\(answers)")
        #expect(answers.dropFirst(3).allSatisfy { $0.contains("LOCKOUT") && $0.contains("uid \(Self.nobody) gave 3 wrong passcodes") },
                "\(answers)")
        // Spent means spent: the right passcode is not tried either (the TPM would not give the try back).
        #expect(try ctl(daemon, ["unlock"], input: right, uid: Self.nobody).err.contains("LOCKOUT"))
        // A passcode item's read is the same budget.
        #expect(try ctl(daemon, ["set", "own", "k", "--access-control", "passcode"], input: Array("mine".utf8), uid: Self.other).status == 0)
        for _ in 1...3 {
            #expect(try ctl(daemon, ["get", "own", "k", "--passcode-stdin"], input: wrong, uid: Self.other).err.contains("AUTHENTICATION_FAILED"))
        }
        let fourth = try ctl(daemon, ["get", "own", "k", "--passcode-stdin"], input: right, uid: Self.other)
        #expect(fourth.status == 3 && fourth.err.contains("LOCKOUT"), "\(fourth.err)")
        // Together: 3 + 3, then a third uid's 2 reach the pool of 10 - 2.
        let third: UInt32 = 65532
        for _ in 1...2 { #expect(try ctl(daemon, ["unlock"], input: wrong, uid: third).err.contains("AUTHENTICATION_FAILED")) }
        let pool = try ctl(daemon, ["unlock"], input: wrong, uid: third)
        #expect(pool.err.contains("LOCKOUT") && pool.err.contains("Users other than root"), "\(pool.err)")
        // The owner still unlocks: 8 of the TPM's 10 tries were spent.
        #expect(try ctl(daemon, ["lock"]).status == 0)
        let owner = try ctl(daemon, ["unlock"], input: right)
        #expect(owner.status == 0, "root's unlock after the others' wrong passcodes: \(owner.err)")
        #expect(try ctl(daemon, ["passcode", "reset-tries"]).status == 0)
        #expect(try ctl(daemon, ["unlock"], input: right, uid: Self.nobody).status == 0)
        #expect(try ctl(daemon, ["get", "own", "k", "--passcode-stdin"], input: right, uid: Self.other).out == "mine")
    }
}
