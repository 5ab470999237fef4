import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Testing

/// keychaind with other Unix users: each runs the built `keychainctl` under `setpriv` (we run as
/// root), so the daemon sees a real other uid through SO_PEERCRED.
@Suite("keychaind: users, access groups, the device", .offThePool)
struct DaemonUserTests {
    static let nobody: UInt32 = 65534
    static let other: UInt32 = 65533

    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM()
        daemon = try KeychainDaemon(tpm: tpm, reader: tpm.directory + "/reader")
    }

    /// keychainctl through the daemon, as root or as `uid` (with `gid`, and supplementary `groups`).
    func ctl(_ args: [String], input: String = "", uid: UInt32? = nil, gid: UInt32? = nil,
             groups: [UInt32] = []) throws -> (status: Int32, out: String, err: String) {
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = if let uid {
            try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(gid ?? uid)",
                                         groups.isEmpty ? "--clear-groups" : "--groups=" + groups.map(String.init).joined(separator: ",")]
                    + [keychainctl] + args, input: Array(input.utf8), environment: daemon.environment)
        } else {
            try run(keychainctl, args, input: Array(input.utf8), environment: daemon.environment)
        }
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    @Test func oneUidsItemsAreInvisibleToAnother() throws {
        #expect(try ctl(["set", "mail", "token"], input: "root's").status == 0)
        // The other user's view of the same service and key: nothing, and its own writes stay its own.
        #expect(try ctl(["get", "mail", "token"], uid: Self.nobody).status == 1)
        #expect(try ctl(["has", "mail", "token"], uid: Self.nobody).status == 1)
        #expect(try ctl(["ls", "mail"], uid: Self.nobody).out.isEmpty)
        #expect(try ctl(["rm", "mail", "token"], uid: Self.nobody).status == 1, "nobody has no such item to remove")
        #expect(try ctl(["clear", "mail"], uid: Self.nobody).status == 0)
        #expect(try ctl(["set", "mail", "token"], input: "nobody's", uid: Self.nobody).status == 0)
        #expect(try ctl(["get", "mail", "token"], uid: Self.nobody).out == "nobody's")
        #expect(try ctl(["get", "mail", "token"]).out == "root's")
        #expect(try ctl(["info", "mail", "token"], uid: Self.nobody).out.contains("service: mail"))
    }

    /// The uid is the kernel's: a request that names another uid, in any field, still reads the
    /// caller's own items (the test sends it as `nobody` with python3, byte by byte).
    @Test func aUidInTheRequestIsNotBelieved() throws {
        #expect(try ctl(["set", "mail", "token"], input: "root's").status == 0)
        let script = rawWireClient + """
            # getItem (2): options, key, then fields a forged client might add: a uid of 0 under every other tag.
            body = bytes([V, 2]) + field(1, options('mail')) + field(2, b'token')
            body += b''.join(field(tag, struct.pack('>Q', 0)) for tag in range(60, 256))
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            sys.stdout.write(request(s, body).hex())
            """
        let result = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups",
                                                  "/usr/bin/python3", "-c", script, daemon.socket])
        let reply = String(decoding: result.stdout, as: UTF8.self)
        #expect(result.status == 0, "\(result.stderr)")
        // An ok reply (0x80) with no value: nobody has no item there.
        #expect(reply == String(format: "%02x80", Wire.version), "reply \(reply)")
        #expect(!reply.contains(Array("root's".utf8).map { String(format: "%02x", $0) }.joined()))
    }

    @Test func anAccessGroupIsSharedByItsMembersAndNoOneElse() throws {
        let nobodyName = try #require(getpwuid(Self.nobody)).pointee.pw_name.map { String(cString: $0) } ?? "nobody"
        try daemon.setGroup("team", ["user \(nobodyName)", "gid 4242", "# comments and blank lines are fine", ""])
        // A member by user name writes, a member by primary gid and one by a supplementary gid read.
        #expect(try ctl(["set", "--access-group", "team", "vpn", "psk"], input: "shared", uid: Self.nobody).status == 0)
        #expect(try ctl(["get", "--access-group", "team", "vpn", "psk"], uid: Self.other, gid: 4242).out == "shared")
        #expect(try ctl(["get", "--access-group", "team", "vpn", "psk"], uid: Self.other, gid: Self.other, groups: [4242]).out == "shared")
        // Not a member: refused with the group's own code, even for root (root is not in every group).
        let outsider = try ctl(["get", "--access-group", "team", "vpn", "psk"], uid: Self.other)
        #expect(outsider.status == 3 && outsider.err.contains("ACCESS_DENIED"), "\(outsider.err)")
        #expect(try ctl(["get", "--access-group", "team", "vpn", "psk"]).err.contains("ACCESS_DENIED"))
        #expect(try ctl(["set", "--access-group", "team", "vpn", "psk"], input: "x", uid: Self.other).err.contains("ACCESS_DENIED"))
        #expect(try ctl(["ls", "--access-group", "team", "vpn"], uid: Self.other).err.contains("ACCESS_DENIED"))
        // The group's items are not the member's own.
        #expect(try ctl(["get", "vpn", "psk"], uid: Self.nobody).status == 1)
        // No such group: refused the same way.
        #expect(try ctl(["get", "--access-group", "nosuch", "vpn", "psk"], uid: Self.nobody).err.contains("ACCESS_DENIED"))
    }

    /// A group file another user could edit would let them in: it is not used at all.
    @Test func aGroupFileOthersCanWriteIsIgnored() throws {
        try daemon.setGroup("team", ["uid \(Self.nobody)"], mode: 0o666)
        let result = try ctl(["set", "--access-group", "team", "vpn", "psk"], input: "x", uid: Self.nobody)
        #expect(result.err.contains("ACCESS_DENIED"), "\(result.err)")
    }

    @Test func onlyRootOrTheAdminGroupChangeTheDevice() throws {
        for (args, input) in [(["passcode", "set"], "2468\n"), (["reader", "enroll", "thumb"], ""), (["init"], ""),
                              (["passcode", "reset-tries"], "")] {
            let result = try ctl(args, input: input, uid: Self.nobody)
            #expect(result.status == 3 && result.err.contains("ACCESS_DENIED"), "\(args): \(result.err)")
        }
        #expect(try ctl(["passcode", "set"], input: "2468\n").status == 0)
        #expect(try ctl(["passcode", "change"], input: "2468\n1357\n", uid: Self.nobody).err.contains("ACCESS_DENIED"))
        #expect(try ctl(["passcode", "remove"], input: "2468\n", uid: Self.nobody).err.contains("ACCESS_DENIED"))
        // Anyone may unlock with the passcode (locking is root's or admin's: below).
        #expect(try ctl(["lock"]).status == 0)
        #expect(try ctl(["unlock"], input: "0000\n", uid: Self.nobody).err.contains("AUTHENTICATION_FAILED"))
        #expect(try ctl(["unlock"], input: "2468\n", uid: Self.nobody).status == 0)
        // A member of `admin` may change it.
        try daemon.setGroup("admin", ["uid \(Self.other)"])
        #expect(try ctl(["passcode", "change"], input: "2468\n1357\n", uid: Self.other).status == 0)
        #expect(try ctl(["reader", "enroll", "thumb"], input: "1357\n", uid: Self.other).status == 0)
        #expect(try ctl(["reader", "enroll", "index"], input: "1357\n", uid: Self.nobody).err.contains("ACCESS_DENIED"))
    }

    /// Locking locks the device for every user, and the fingers' names are the owner's: another user
    /// can do neither (the device stays unlocked, no name is printed); it still unlocks with the
    /// passcode and learns which biometry there is and what its items could use. Root and a member
    /// of `admin` can lock and list.
    @Test func onlyRootOrTheAdminGroupLockTheDeviceOrListTheFingers() async throws {
        #expect(try ctl(["passcode", "set"], input: "2468\n").status == 0)
        #expect(try ctl(["reader", "enroll", "thumb-of-alice"], input: "2468\n").status == 0)
        let device = KeychainDevice(configuration: daemon.configuration())

        let lock = try ctl(["lock"], uid: Self.nobody)
        #expect(lock.status == 3 && lock.err.contains("ACCESS_DENIED: Only root or a member of the access group 'admin' may lock the device")
                && lock.err.contains("uid \(Self.nobody) is neither"), "\(lock.err)")
        #expect(try await device.status().lockState == .unlocked, "another user locked the device")
        let list = try ctl(["reader", "list"], uid: Self.nobody)
        #expect(list.status == 3 && list.err.contains("ACCESS_DENIED: Only root or a member of the access group 'admin' may list the "
                                                      + "enrolled fingers' names"), "\(list.err)")
        #expect(!list.out.contains("thumb-of-alice") && !list.err.contains("thumb-of-alice"))
        // Still open to everyone: which biometry there is, what an item could use, unlock with the passcode.
        let types = try ctl(["biometry-types"], uid: Self.nobody)
        #expect(types.status == 0 && types.out.contains("fingerprint"), "\(types.err)")
        #expect(try ctl(["can-use", "biometryAny"], uid: Self.nobody).status == 0)
        #expect(try ctl(["lock"]).status == 0)
        #expect(try ctl(["unlock"], input: "2468\n", uid: Self.nobody).status == 0)
        #expect(try await device.status().lockState == .unlocked)

        // Root and admin may.
        #expect(try ctl(["reader", "list"]).out == "thumb-of-alice\n")
        try daemon.setGroup("admin", ["uid \(Self.other)"])
        #expect(try ctl(["reader", "list"], uid: Self.other).out == "thumb-of-alice\n")
        #expect(try ctl(["lock"], uid: Self.other).status == 0)
        #expect(try await device.status().lockState == .locked)
    }

    /// One user's idle connections cannot take every slot: nobody (python3 on the socket) opens as
    /// many connections as the daemon allows in all; it gets a quarter, and root is still served.
    /// Before, the daemon closed root's connection at accept for as long as nobody's stayed open.
    @Test func oneUsersIdleConnectionsDoNotFillTheDaemon() throws {
        let tpm = try SoftwareTPM()
        let small = try KeychainDaemon(tpm: tpm, arguments: ["--max-connections", "40"])
        let nobody = try IdleConnections(socket: small.socket, count: 40, uid: Self.nobody)
        defer { nobody.release() }
        #expect(nobody.held == 10, "nobody holds \(nobody.held.map(String.init) ?? "?") connections")
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = try run(keychainctl, ["set", "svc", "k"], input: Array("v".utf8), environment: small.environment)
        #expect(result.status == 0, "root refused while nobody's connections stay open: \(result.stderr)")
        #expect(try run(keychainctl, ["get", "svc", "k"], environment: small.environment).stdout == Array("v".utf8))
        // nobody's next call is refused, in words: the service is unavailable, not an internal error.
        for tool in ["keychainctl", "keychainctl-full"] {
            let refused = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups",
                                                       buildDirectory.appendingPathComponent(tool).path, "get", "svc", "k"],
                                  environment: small.environment)
            #expect(refused.status == 3 && refused.stderr.contains("HARDWARE_UNAVAILABLE"), "\(tool): \(refused.stderr)")
        }
    }

    /// A passcode item of an access group, read with the passcode by one member inside its
    /// authValidity window: another member (who never gave the passcode) is asked, not served from
    /// the first one's window. Each uid's own items keep their window.
    @Test func oneMembersPromptOpensNoWindowForAnother() throws {
        #expect(try ctl(["passcode", "set"], input: "2468\n").status == 0)
        try daemon.setGroup("team", ["uid \(Self.nobody)", "uid \(Self.other)"])
        let item = ["--access-group", "team", "shared", "k"]
        #expect(try ctl(["set"] + item + ["--access-control", "passcode", "--auth-validity", "300"], input: "secret",
                        uid: Self.other).status == 0)
        let first = try ctl(["get"] + item + ["--passcode-stdin"], input: "2468\n", uid: Self.other)
        #expect(first.status == 0 && first.out == "secret", "\(first.err)")
        let other = try ctl(["get"] + item, uid: Self.nobody)
        #expect(other.status == 3 && other.err.contains("INTERACTION_NOT_ALLOWED") && other.out.isEmpty,
                "another member read without the passcode: \(other.out) \(other.err)")
        #expect(try ctl(["get"] + item + ["--passcode-stdin"], input: "2468\n", uid: Self.nobody).out == "secret")
        // A uid's own passcode item: its window holds across its processes.
        #expect(try ctl(["set", "own", "k", "--access-control", "passcode", "--auth-validity", "300"], input: "mine",
                        uid: Self.other).status == 0)
        #expect(try ctl(["get", "own", "k", "--passcode-stdin"], input: "2468\n", uid: Self.other).out == "mine")
        #expect(try ctl(["get", "own", "k"], uid: Self.other).out == "mine")
    }

    /// Every device request kind of the protocol, sent as another user by a client we did not write
    /// (python3 on the socket, each with a passcode, a new passcode and a finger): only the open ones
    /// are answered, every other is ACCESS_DENIED. The TPM command count was open: another user could
    /// read how many TPM commands everyone's calls cost (who reads protected items, and when) and
    /// reset it under root's measurement.
    @Test func aForeignClientAsAnotherUserReachesOnlyTheOpenDeviceCalls() throws {
        #expect(try ctl(["passcode", "set"], input: "2468\n").status == 0)
        let open: Set<Int> = [24 /* biometryTypes */, 25 /* canUse */, 27 /* status */, 29 /* tokenStatus */, 30 /* unlock */]
        let script = rawWireClient + """
            for kind in range(20, 40):
                body = bytes([V, kind]) + field(5, b'passcode') + field(11, b'thumb') + field(12, b'0000') + field(13, b'1357')
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
                reply = request(s, body); s.close()
                code = b''
                if reply[1] == 0x81 and reply[2] == 30: code = reply[7:7 + struct.unpack('>I', reply[3:7])[0]]
                print(kind, reply[1], code.decode())
            """
        let result = try run("/usr/bin/setpriv", ["--reuid=\(Self.nobody)", "--regid=\(Self.nobody)", "--clear-groups",
                                                  "/usr/bin/python3", "-c", script, daemon.socket])
        let lines = String(decoding: result.stdout, as: UTF8.self).split(separator: "\n").map { $0.split(separator: " ") }
        #expect(result.status == 0 && lines.count == 20, "\(result.stderr)")
        for line in lines where line.count >= 2 {
            let kind = Int(line[0]) ?? 0, code = line.count > 2 ? String(line[2]) : ""
            if kind >= 38 {
                #expect(code == "INVALID_ARGUMENT", "kind \(kind): \(line)")
            } else if open.contains(kind) {
                #expect(code != "ACCESS_DENIED", "kind \(kind) is open to everyone: \(line)")
            } else {
                #expect(code == "ACCESS_DENIED", "kind \(kind) answered another user: \(line)")
            }
        }
        // Nothing changed: the passcode is root's, the device unlocked.
        #expect(try ctl(["unlock"], input: "2468\n").status == 0)
        #expect(try ctl(["status"]).out.contains("lock: unlocked"))
    }
}

/// keychaind against clients that misbehave and against its own death.
@Suite("keychaind: faults", .offThePool)
struct DaemonFaultTests {
    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM()
        daemon = try KeychainDaemon(tpm: tpm, arguments: ["--stall-timeout", "1"])
    }

    func raw() throws -> Int32 {
        switch WireSocket.connect(path: daemon.socket) {
        case .success(let fd): return fd
        case .failure(let error): throw error
        }
    }

    /// A well-behaved caller still served.
    func served(_ storage: Keychain) async throws {
        try await storage.setItem("probe", "ok")
        #expect(try await storage.getItem("probe") == "ok")
    }

    /// The daemon keeps its engine, so reads after the first are warm for every caller and every
    /// new storage value: no TPM command at all.
    @Test func warmReadsThroughTheDaemonSendNoTPMCommand() async throws {
        let configuration = daemon.configuration()
        try await createKeychain(.init(service: "svc"), configuration: configuration).setItem("k", "v")
        #expect(try await createKeychain(.init(service: "svc"), configuration: configuration).getItem("k") == "v")
        let device = KeychainDevice(configuration: configuration)
        // The control: a cold read costs TPM commands, and the daemon counts them.
        await device.dropCaches()
        _ = await device.takeTPMCommandCount()
        #expect(try await createKeychain(.init(service: "svc"), configuration: configuration).getItem("k") == "v")
        #expect(await device.takeTPMCommandCount() > 0)
        for _ in 0..<50 {
            #expect(try await createKeychain(.init(service: "svc"), configuration: configuration).getItem("k") == "v")
        }
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        #expect(try run(keychainctl, ["get", "svc", "k"], environment: daemon.environment).stdout == Array("v".utf8))
        #expect(await device.takeTPMCommandCount() == 0)
    }

    @Test func garbageAnOversizedFrameAndAnotherVersionAreRefusedAndOthersServed() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        for junk: [UInt8] in [[0, 0, 0, 5, 9, 9, 9, 9, 9], [0xFF, 0xFF, 0xFF, 0xFF], [0, 0, 0, 4, 2, 1, 0, 0],
                              [0, 0, 0, 7, 1, 2, 1, 0, 0, 0, 200]] {
            let fd = try raw()
            defer { close(fd) }
            _ = junk.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            // A clear refusal, then the connection ends.
            let reply = try WireSocket.receive(fd, idle: 30, stall: 30)
            #expect(reply.kind == 0x81)
            #expect(try reply.string(30) == "INVALID_ARGUMENT")
            #expect(throws: WireError(.closed, "")) { try WireSocket.receive(fd, idle: 30, stall: 30) }
            try await served(storage)
        }
    }

    @Test func aClientThatStallsMidFrameIsCutOffAndOthersAreServed() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        let fd = try raw()
        defer { close(fd) }
        _ = [UInt8](arrayLiteral: 0, 0).withUnsafeBytes { send(fd, $0.baseAddress, 2, Int32(MSG_NOSIGNAL)) }
        try await served(storage)
        // --stall-timeout 1: the daemon closes it (we wait for the close, never for time).
        #expect(throws: WireError(.closed, "")) { try WireSocket.receive(fd, idle: 60, stall: 60) }
    }

    /// A frame's 4-byte header announcing the largest message, then nothing: the daemon spends on it
    /// only what arrived. It allocated the whole 16 MiB at the header, so a user's few hundred such
    /// connections (4 bytes each) took gigabytes and the daemon's memory for everyone.
    @Test func aHeaderAloneCostsTheDaemonNoMemoryAhead() async throws {
        let tpm = try SoftwareTPM()
        let patient = try KeychainDaemon(tpm: tpm, arguments: ["--stall-timeout", "60"])
        func resident() -> Int {
            let status = (try? String(contentsOfFile: "/proc/\(patient.processIdentifier)/status", encoding: .utf8)) ?? ""
            let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
            return (Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0) * 1024
        }
        let storage = try createKeychain(.init(service: "svc"), configuration: patient.configuration())
        try await storage.setItem("k", "v")
        let before = resident()
        var stalled: [Int32] = []
        defer { stalled.forEach { close($0) } }
        for _ in 0..<64 {
            guard case .success(let fd) = WireSocket.connect(path: patient.socket) else { Issue.record("connect"); return }
            let header: [UInt8] = [UInt8(Wire.maxMessage >> 24), UInt8(Wire.maxMessage >> 16 & 0xff), UInt8(Wire.maxMessage >> 8 & 0xff),
                                   UInt8(Wire.maxMessage & 0xff)]
            #expect(header.withUnsafeBytes { send(fd, $0.baseAddress, 4, Int32(MSG_NOSIGNAL)) } == 4)
            stalled.append(fd)
        }
        // Others are served meanwhile; then the daemon's memory is watched for two seconds (a
        // bounded look, not a timing: it stops early once past the old cost).
        #expect(try await storage.getItem("k") == "v")
        var peak = resident()
        for _ in 0..<100 where peak - before < 512 << 20 {
            usleep(20_000)
            peak = max(peak, resident())
        }
        #expect(peak - before < 128 << 20, "64 headers cost the daemon \((peak - before) >> 20) MiB")
        #expect(try await storage.getItem("k") == "v")
    }

    @Test func aThousandIdleConnectionsDoNotKeepOthersOut() async throws {
        var files = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
        if files.rlim_cur < 4096 { files.rlim_cur = min(files.rlim_max, 4096); setrlimit(Int32(RLIMIT_NOFILE.rawValue), &files) }
        var idle: [Int32] = []
        defer { idle.forEach { close($0) } }
        for _ in 0..<1000 { idle.append(try raw()) }
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        try await served(storage)
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        #expect(try run(keychainctl, ["get", "svc", "probe"], environment: daemon.environment).stdout == Array("ok".utf8))
    }

    /// A client that goes away while the daemon waits for its prompt's answer: the read ends, no TPM
    /// session is left (swtpm has three slots: four abandoned reads would exhaust them), others read.
    @Test func clientsKilledMidRequestLeaveNothingBehind() async throws {
        let answers = ScriptedAuthenticator()
        let configuration = daemon.configuration(authenticator: answers)
        try await KeychainDevice(configuration: configuration).setPasscode(bytes("2468"))
        let storage = try createKeychain(.init(service: "svc", accessControl: .passcode), configuration: configuration)
        try await storage.setItem("k", "v")
        for _ in 0..<4 {
            let fd = try raw()
            var request = WireMessage(kind: 2)
            request.add(WireTag.options, WireStorageOptions(service: "svc", accessControl: "passcode").encoded())
            request.add(2, "k")
            request.add(10, UInt64(3))
            try WireSocket.send(fd, request)
            let prompt = try WireSocket.receive(fd, idle: 60, stall: 60)
            #expect(prompt.kind == 0x82, "the daemon asks the client")
            close(fd)
        }
        // Mid-write too: a 4 MiB value, cut after half of it.
        let fd = try raw()
        let header: [UInt8] = [0, 0x40, 0, 0x40]
        _ = header.withUnsafeBytes { send(fd, $0.baseAddress, 4, Int32(MSG_NOSIGNAL)) }
        let half = [UInt8](repeating: 7, count: 2 << 20)
        _ = half.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        close(fd)
        answers.push(.passcode(bytes("2468")))
        #expect(try await storage.getItem("k") == "v")
        #expect(try await createKeychain(.init(service: "plain"), configuration: configuration).getItem("none") == nil)
    }

    /// The daemon killed after each TPM command of a write (the library's crash hook): the caller
    /// gets a clear error, not a hang; the daemon started again on the same socket (as socket
    /// activation does) finds the store whole: the item is there with its value or absent, never
    /// half-written, and the earlier item reads.
    @Test func aDaemonKilledMidWriteLeavesTheStoreWholeAndComesBackOnItsSocket() async throws {
        let configuration = daemon.configuration()
        let base = try createKeychain(.init(service: "base", accessible: .always), configuration: configuration)
        try await base.setItem("k", "before")
        var aborted = 0
        for after in 1...40 {
            daemon.kill()
            try daemon.start(environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(after)"])
            let storage = try createKeychain(.init(service: "s\(after)", accessible: .whenUnlockedThisDeviceOnly),
                                             configuration: configuration)
            do {
                try await storage.setItem("k", "value \(after)")
                break  // the write needs fewer TPM commands than this: every cut point was tried
            } catch {
                #expect(error.code == .hardwareUnavailable, "\(error)")
                #expect(error.message.contains("stopped during the call"), "\(error)")
                aborted += 1
            }
            _ = daemon.waitForExit()
            try daemon.start()
            let value = try await storage.getItem("k")
            #expect(value == nil || value == "value \(after)", "cut after \(after) commands: \(value ?? "nil")")
            try await storage.setItem("k", "again")
            #expect(try await storage.getItem("k") == "again")
            #expect(try await base.getItem("k") == "before")
        }
        #expect(aborted > 0, "the write sent TPM commands, and the daemon was cut after each")
    }

    /// The daemon killed after each TPM command of a passcode change: the next daemon on the socket
    /// has the old passcode or the new one (exactly one opens the device) and the passcode item
    /// still opens with it; the caller heard "stopped during the call", not a hang.
    @Test func aDaemonKilledMidPasscodeChangeLeavesTheOldOrTheNew() async throws {
        let answers = ScriptedAuthenticator()
        let configuration = daemon.configuration(authenticator: answers)
        let device = KeychainDevice(configuration: configuration)
        try await device.setPasscode(bytes("2468"))
        let storage = try createKeychain(.init(service: "pc", accessControl: .passcode), configuration: configuration)
        try await storage.setItem("k", "v")
        var aborted = 0
        for after in 1...80 {
            daemon.kill()
            try daemon.start(environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(after)"])
            var completed = false
            do {
                try await device.changePasscode(from: bytes("2468"), to: bytes("1357"))
                completed = true
                daemon.kill()
            } catch {
                #expect(error.code == .hardwareUnavailable && error.message.contains("stopped during the call"), "\(error)")
                aborted += 1
                _ = daemon.waitForExit()
            }
            try daemon.start()
            try await device.resetPasscodeTries()
            let old = (try? await device.unlock(passcode: bytes("2468"))) != nil
            let new = (try? await device.unlock(passcode: bytes("1357"))) != nil
            #expect(old != new, "cut after \(after) commands: the old passcode opens \(old), the new one \(new)")
            #expect(try await device.status().passcodeSet)
            answers.push(.passcode(bytes(new ? "1357" : "2468")))
            #expect(try await storage.getItem("k") == "v", "cut after \(after) commands")
            if completed { break }
            if new { try await device.changePasscode(from: bytes("1357"), to: bytes("2468")) }
        }
        #expect(aborted > 0, "the change sent TPM commands, and the daemon was cut after each")
    }

    /// `systemctl stop` sends SIGTERM: the daemon ends by it (a watchdog's SIGKILL after 60 s would
    /// show as another status, so the test cannot hang), and the next daemon finds the item.
    @Test func sigtermEndsTheDaemonAndLosesNothing() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        try await storage.setItem("k", "v")
        let pid = daemon.processIdentifier
        let watchdog = DispatchWorkItem { kill(pid, SIGKILL) }
        DispatchQueue.global().asyncAfter(deadline: .now() + 60, execute: watchdog)
        kill(pid, SIGTERM)
        let status = daemon.waitForExit()
        watchdog.cancel()
        #expect(status == 128 + SIGTERM, "exit status \(String(describing: status))")
        try daemon.start()
        #expect(try await storage.getItem("k") == "v")
    }

    /// Socket activation: a caller that connects while no daemon runs waits in the socket's queue and
    /// is served by the next one; with no socket at all the caller hears the service is not running.
    @Test func aCallerWaitsForTheNextDaemonOnTheSameSocketAndHearsWhenThereIsNone() async throws {
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        try await storage.setItem("k", "v")
        daemon.kill()
        let fd = try raw()
        defer { close(fd) }
        var request = WireMessage(kind: 2)
        request.add(WireTag.options, WireStorageOptions(service: "svc").encoded())
        request.add(2, "k")
        try WireSocket.send(fd, request)
        try daemon.start()
        let reply = try WireSocket.receive(fd, idle: 60, stall: 60)
        #expect(reply.kind == 0x80 && reply.bytes(20) == Array("v".utf8))

        let gone = try createKeychain(.init(service: "svc"), configuration: .daemon(socket: daemon.directory + "/none.sock"))
        do {
            _ = try await gone.getItem("k")
            Issue.record("a read without a service succeeded")
        } catch {
            #expect(error.code == .hardwareUnavailable)
            #expect(error.message.contains("not running"), "\(error)")
        }
    }
}

/// dist/systemd: the units systemd itself accepts, with the hardening the service relies on.
@Suite("keychaind: systemd units", .offThePool)
struct SystemdUnitTests {
    static var units: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("dist/systemd")
    }

    @Test func theServiceRunsHardenedAsItsOwnUserInTheTSSGroup() throws {
        let service = try String(contentsOf: Self.units.appendingPathComponent("keychaind.service"), encoding: .utf8)
        for line in ["User=keychaind", "SupplementaryGroups=tss", "ProtectSystem=strict", "PrivateNetwork=yes", "DevicePolicy=closed",
                     "DeviceAllow=/dev/tpmrm0 rw", "NoNewPrivileges=yes", "StateDirectory=keychain", "CapabilityBoundingSet=", "AmbientCapabilities=",
                     "RestrictAddressFamilies=AF_UNIX", "InaccessiblePaths=/sys", "ProtectProc=default", "ProcSubset=pid"] {
            #expect(service.split(separator: "\n").contains(Substring(line)), "keychaind.service lacks \(line)")
        }
        let socket = try String(contentsOf: Self.units.appendingPathComponent("keychaind.socket"), encoding: .utf8)
        #expect(socket.contains("ListenStream=\(KeychainConfiguration.systemSocket)"))
    }

    @Test func systemdAnalyzeVerifiesTheUnits() throws {
        guard let analyze = Processes.findExecutable("systemd-analyze") else {
            print("SystemdUnitTests: systemd-analyze is not installed; the units were not verified")
            return
        }
        // The service names the installed binary: verify a copy that names the built one.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychaind-units-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let built = buildDirectory.appendingPathComponent("keychaind").path
        let service = try String(contentsOf: Self.units.appendingPathComponent("keychaind.service"), encoding: .utf8)
            .replacingOccurrences(of: "/usr/sbin/keychaind", with: built)
        try service.write(to: directory.appendingPathComponent("keychaind.service"), atomically: true, encoding: .utf8)
        try FileManager.default.copyItem(at: Self.units.appendingPathComponent("keychaind.socket"),
                                         to: directory.appendingPathComponent("keychaind.socket"))
        let result = try run(analyze, ["verify", directory.appendingPathComponent("keychaind.socket").path,
                                       directory.appendingPathComponent("keychaind.service").path])
        #expect(result.status == 0, "\(result.stderr)")
        // An unknown or misspelt setting is only a warning to systemd: none is allowed here.
        #expect(!result.stderr.contains("keychaind."), "\(result.stderr)")
    }
}
