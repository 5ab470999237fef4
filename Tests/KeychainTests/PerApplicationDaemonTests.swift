import Foundation
import Glibc
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
@testable import KeychainWire
import Testing

/// Issue 41: through a real keychaind on swtpm, real processes in real system units' cgroups and
/// real bwrap sandboxes, as uid 1600 (`setpriv`): each application's items are its own, and an
/// access group is shared by the applications it names. Root makes the cgroups and sandboxes; as
/// another user the suite is skipped.
@Suite("keychaind: per-application items", .offThePool, .serialized,
       .enabled(if: geteuid() == 0, "making system units' cgroups and moving processes into them needs root"))
struct PerApplicationDaemonTests {
    static let uid: UInt32 = 1600

    /// The scope `flatpak run` puts an app in, under uid 1600's manager
    /// (`user.slice/user-1600.slice/user@1600.service/app.slice/app-flatpak-ID-N.scope`), removed at the end.
    final class FlatpakScope {
        let path: String

        init(_ appID: String) throws {
            let v1 = "/sys/fs/cgroup/systemd"
            let root = FileManager.default.fileExists(atPath: v1 + "/cgroup.procs") ? v1 : "/sys/fs/cgroup"
            let uid = PerApplicationDaemonTests.uid
            path = "\(root)/user.slice/user-\(uid).slice/user@\(uid).service/app.slice/app-flatpak-\(appID)-\(UInt16.random(in: 2...UInt16.max)).scope"
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }

        deinit { rmdir(path) }
    }

    let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
    /// The full tool, run by itself: in the sandbox keychainctl's front may not run it from the bound build folder.
    let keychainctlFull = buildDirectory.appendingPathComponent("keychainctl-full").path

    /// keychainctl as uid 1600, in `unit`'s cgroup (moved there before it runs) or not.
    func ctl(_ daemon: KeychainDaemon, _ args: [String], in unit: UnitCgroup? = nil, input: String = "",
             environment: [String: String] = [:]) throws -> (status: Int32, out: String, err: String) {
        var argv = ["/usr/bin/setpriv", "--reuid=\(Self.uid)", "--regid=\(Self.uid)", "--clear-groups", keychainctl] + args
        if let unit { argv = ["/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", unit.path + "/cgroup.procs"] + argv }
        let result = try run(argv[0], Array(argv.dropFirst()), input: Array(input.utf8),
                             environment: daemon.environment.merging(environment) { $1 })
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// keychainctl as uid 1600 in a bwrap sandbox whose `/.flatpak-info` names `appID`, as Flatpak
    /// makes one (a fresh root; the host's /usr, the build, the daemon's folder in /tmp bound in).
    func sandboxed(_ daemon: KeychainDaemon, _ appID: String, _ args: [String], input: String = "",
                   in scope: FlatpakScope? = nil, tool: String? = nil) throws -> (status: Int32, out: String, err: String) {
        let info = "\(daemon.directory)/\(appID).flatpak-info"
        try "[Application]\nname=\(appID)\n\n[Instance]\ninstance-id=1\n".write(toFile: info, atomically: true, encoding: .utf8)
        let build = buildDirectory.path
        let sandbox = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                       "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
                       "--ro-bind-try", "/opt", "/opt", "--ro-bind", build, build, "--bind", "/tmp", "/tmp",
                       "--proc", "/proc", "--dev", "/dev", "--ro-bind", info, "/.flatpak-info"]
        var argv = ["/usr/bin/bwrap"] + sandbox + ["/usr/bin/setpriv", "--reuid=\(Self.uid)", "--regid=\(Self.uid)", "--clear-groups",
                                                     tool ?? keychainctl] + args
        if let scope { argv = ["/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", scope.path + "/cgroup.procs"] + argv }
        let result = try run(argv[0], Array(argv.dropFirst()), input: Array(input.utf8), environment: daemon.environment)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    @Test func aUnitsItemsAreNotFoundListedOrOverwrittenByAnotherUnitOrItsUsersShell() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let a = try UnitCgroup("kc-test-a"), b = try UnitCgroup("kc-test-b")
        let stored = try ctl(daemon, ["set", "bank", "token"], in: a, input: "a's own")
        #expect(stored.status == 0, "\(stored)")
        #expect(try ctl(daemon, ["get", "bank", "token"], in: a).out == "a's own")

        #expect(try ctl(daemon, ["get", "bank", "token"], in: b).out.isEmpty, "b does not find a's item")
        #expect(try ctl(daemon, ["ls", "bank"], in: b).out.isEmpty, "b does not list a's item")
        #expect(try ctl(daemon, ["get", "bank", "token"]).out.isEmpty, "the user's shell does not find a's item")
        #expect(try ctl(daemon, ["ls", "bank"]).out.isEmpty, "the user's shell does not list a's item")
        let appID = String(a.name.dropLast(".service".count))
        #expect(try ctl(daemon, ["get", appID, "token"], environment: ["KEYCHAIN_APP_ID": appID]).out.isEmpty,
                "a host process naming a's application gains nothing")

        #expect(try ctl(daemon, ["set", "bank", "token"], in: b, input: "b's").status == 0)
        #expect(try ctl(daemon, ["set", "bank", "token"], input: "the shell's").status == 0)
        #expect(try ctl(daemon, ["rm", "bank", "token"], in: b).status == 0)
        #expect(try ctl(daemon, ["get", "bank", "token"], in: a).out == "a's own", "neither overwrote nor removed a's item")
        #expect(try ctl(daemon, ["get", "bank", "token"]).out == "the shell's", "the shell keeps its uid's items")
    }

    /// A client we did not write (python3 in unit a, as uid 1600) stores with its default service,
    /// having resolved it as `forged` (what `KEYCHAIN_APP_ID` would give): the item is under a's
    /// unit name, from the kernel, in a's own items.
    @Test func aUnitsDefaultServiceIsItsUnitNameNotWhatItsClientSays() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let a = try UnitCgroup("kc-test-a")
        var options = KeychainOptions(service: "forged").wire
        options.serviceIsDefault = true
        var request = WireMessage(kind: WireOp.setItem.rawValue)
        request.add(WireTag.options, options.encoded())
        request.add(WireTag.key, "token")
        request.add(WireTag.value, Array("by default".utf8))
        let frame = request.framed().map { String(format: "%02x", $0) }.joined()
        let script = """
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            s.sendall(bytes.fromhex(sys.argv[2]))
            s.settimeout(30)
            sys.stdout.write(s.recv(65536).hex())
            """
        let sent = try run("/bin/sh", ["-c", "echo $$ > \"$0\" && exec \"$@\"", a.path + "/cgroup.procs", "/usr/bin/setpriv",
                                       "--reuid=\(Self.uid)", "--regid=\(Self.uid)", "--clear-groups", "/usr/bin/python3", "-c", script,
                                       daemon.socket, frame])
        #expect(sent.status == 0, "\(sent.stderr)")
        let unitName = String(a.name.dropLast(".service".count))
        #expect(try ctl(daemon, ["get", unitName, "token"], in: a).out == "by default")
        #expect(try ctl(daemon, ["get", "forged", "token"], in: a).out.isEmpty)
        #expect(try ctl(daemon, ["get", unitName, "token"]).out.isEmpty, "not the uid's")
    }

    /// An application's items count toward its uid's quota: sandboxes with new app ids (which a
    /// user can make at will) gain no room.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap"), "bwrap is not installed (apt install bubblewrap)"))
    func anApplicationsItemsCountTowardItsUidsQuota() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, arguments: ["--quota-items", "2"])
        let a = try UnitCgroup("kc-test-a")
        #expect(try ctl(daemon, ["set", "bank", "one"], input: "1").status == 0)
        #expect(try ctl(daemon, ["set", "bank", "two"], in: a, input: "2").status == 0)
        let refused = try ctl(daemon, ["set", "bank", "three"], in: a, input: "3")
        #expect(refused.status != 0 && refused.err.contains("QUOTA_EXCEEDED") && refused.err.contains("uid \(Self.uid)"), "\(refused)")
        #expect(try sandboxed(daemon, "org.example.New", ["set", "bank", "three"], input: "3").status != 0)
    }

    @Test func aUnitInASharedGroupReadsItsItemsAndOneNotInItCannot() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let a = try UnitCgroup("kc-test-a"), b = try UnitCgroup("kc-test-b")
        // The uid's line lets its unconfined programs in, never another of its applications.
        try daemon.setGroup("shared", ["unit \(a.name)", "uid \(Self.uid)"])
        #expect(try ctl(daemon, ["set", "--access-group", "shared", "vpn", "key"], in: a, input: "shared secret").status == 0)
        #expect(try ctl(daemon, ["get", "--access-group", "shared", "vpn", "key"]).out == "shared secret")
        let refused = try ctl(daemon, ["get", "--access-group", "shared", "vpn", "key"], in: b)
        #expect(refused.status != 0 && refused.out.isEmpty && refused.err.contains("ACCESS_DENIED"), "\(refused)")
        #expect(refused.err.contains("'unit \(b.name)'"), "the message names the line to add: \(refused.err)")

        try daemon.setGroup("shared", ["unit \(a.name)", "unit \(b.name)"])
        #expect(try ctl(daemon, ["get", "--access-group", "shared", "vpn", "key"], in: b).out == "shared secret")
    }

    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap"), "bwrap is not installed (apt install bubblewrap)"))
    func sandboxedAppsEachSeeOnlyTheirOwnItems() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        #expect(try sandboxed(daemon, "org.example.A", ["set", "bank", "token"], input: "A's").status == 0)
        #expect(try sandboxed(daemon, "org.example.A", ["get", "bank", "token"]).out == "A's")
        #expect(try sandboxed(daemon, "org.example.B", ["get", "bank", "token"]).out.isEmpty)
        #expect(try sandboxed(daemon, "org.example.B", ["ls", "bank"]).out.isEmpty)
        #expect(try sandboxed(daemon, "org.example.B", ["set", "bank", "token"], input: "B's").status == 0)
        #expect(try sandboxed(daemon, "org.example.A", ["get", "bank", "token"]).out == "A's")
        #expect(try sandboxed(daemon, "org.example.B", ["get", "bank", "token"]).out == "B's")
        #expect(try ctl(daemon, ["get", "bank", "token"]).out.isEmpty, "the user's shell sees neither")
        #expect(try ctl(daemon, ["get", "org.example.A", "token"], environment: ["KEYCHAIN_APP_ID": "org.example.A"]).out.isEmpty)
    }

    /// keychaind as the shipped unit runs it: its own user, no capability, so the kernel keeps it out
    /// of its clients' roots (`/proc/PID/root`). What every user may read still tells their
    /// applications: a unit by its cgroup; a Flatpak sandbox by the `/.flatpak-info` mounted in its
    /// mount table and its app by the scope `flatpak run` makes; a sandbox without that scope is
    /// refused, not served as its uid's unconfined caller. The uid's shell is served as before.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap"), "bwrap is not installed (apt install bubblewrap)"))
    func keychaindWithoutCapabilitiesTellsUnitsAndFlatpakAppsAndRefusesAnUnnamedSandbox() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, user: DaemonResourceTests.unlimitedDaemonUser)
        #expect(try ctl(daemon, ["set", "bank", "token"], input: "the shell's").status == 0)
        #expect(try ctl(daemon, ["get", "bank", "token"]).out == "the shell's", "the uid's shell is served")

        let a = try UnitCgroup("kc-test-a")
        #expect(try ctl(daemon, ["set", "bank", "token"], in: a, input: "a's own").status == 0)
        #expect(try ctl(daemon, ["get", "bank", "token"], in: a).out == "a's own")
        #expect(try ctl(daemon, ["get", "bank", "token"]).out == "the shell's", "the unit's item is its own")

        let scopeA = try FlatpakScope("org.example.A"), otherA = try FlatpakScope("org.example.A")
        let stored = try sandboxed(daemon, "org.example.A", ["set", "bank", "token"], input: "A's", in: scopeA)
        #expect(stored.status == 0, "\(stored)")
        #expect(try sandboxed(daemon, "org.example.A", ["get", "bank", "token"], in: otherA).out == "A's", "A's next run finds A's item")
        #expect(try ctl(daemon, ["get", "bank", "token"]).out == "the shell's", "the shell does not see A's item")

        let unnamed = try sandboxed(daemon, "org.example.A", ["get", "bank", "token"])
        #expect(unnamed.status != 0 && unnamed.out.isEmpty, "a sandbox keychaind cannot name is not served: \(unnamed)")
        #expect(unnamed.err.contains("ACCESS_DENIED") && unnamed.err.contains("app-flatpak-ID-N.scope"), "\(unnamed.err)")
    }

    /// A sandbox of an administrator's is not the administrator, nor its user's manager: uid 1600, in
    /// `admin`, sets a system unit's credential and its own manager's from its shell; its Flatpak
    /// app can do neither (nor read them), and gets `ACCESS_DENIED`.
    @Test(.enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap"), "bwrap is not installed (apt install bubblewrap)"))
    func aSandboxedAppIsNeitherItsUsersAdminNorItsUsersManager() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        try daemon.setGroup("admin", ["uid \(Self.uid)"])
        #expect(try ctl(daemon, ["credential", "set", "db.service", "password"], input: "system's").status == 0, "admin sets a system unit's")
        #expect(try ctl(daemon, ["credential", "set", "--user", "app.service", "token"], input: "user's").status == 0, "its own manager's")
        for args in [["credential", "set", "db.service", "password"], ["credential", "set", "--user", "app.service", "token"]] {
            let refused = try sandboxed(daemon, "org.example.A", args, input: "forged", tool: keychainctlFull)
            #expect(refused.status != 0 && refused.err.contains("ACCESS_DENIED"), "\(args): \(refused.err)")
        }
        for args in [["credential", "get", "db.service", "password"], ["credential", "get", "--user", "app.service", "token"]] {
            let refused = try sandboxed(daemon, "org.example.A", args, tool: keychainctlFull)
            #expect(refused.status != 0 && refused.out.isEmpty && refused.err.contains("ACCESS_DENIED"), "\(args): \(refused)")
        }
        #expect(try ctl(daemon, ["credential", "get", "db.service", "password"]).out == "system's", "nothing was overwritten")
        #expect(try ctl(daemon, ["credential", "get", "--user", "app.service", "token"]).out == "user's")
    }

    /// A process in unit a connects and exits at once (reaped), leaving the socket to its child;
    /// keychaind, stopped meanwhile, accepts it after: it cannot tell the application of a process
    /// that is gone, and refuses the connection rather than serve it as its uid's unconfined caller.
    @Test func aPeerThatExitsRightAfterConnectingIsRefusedNotServedUnconfined() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let a = try UnitCgroup("kc-test-a")
        #expect(try ctl(daemon, ["ls", "warm-up"]).status == 0)
        var request = WireMessage(kind: WireOp.hasItem.rawValue)
        request.add(WireTag.options, KeychainOptions(service: "bank").wire.encoded())
        request.add(WireTag.key, "token")
        let frame = request.framed().map { String(format: "%02x", $0) }.joined()
        let script = """
            import os, socket, sys, time
            daemon, path, frame = int(sys.argv[1]), sys.argv[2], bytes.fromhex(sys.argv[3])
            middle = os.fork()
            if middle == 0:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(path)
                parent = os.getpid()
                if os.fork() == 0:
                    while True:
                        try:
                            os.kill(parent, 0)
                            time.sleep(0.01)
                        except ProcessLookupError:
                            break
                    os.kill(daemon, 18)
                    try:
                        s.sendall(frame)
                    except (BrokenPipeError, ConnectionResetError):
                        pass  # refused at accept: its reply waits in the socket
                    s.settimeout(30)
                    sys.stdout.write(s.recv(65536).hex())
                    sys.stdout.flush()
                os._exit(0)
            os.waitpid(middle, 0)
            """
        let pid = daemon.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        let result = try run("/bin/sh", ["-c", "echo $$ > \"$0\" && exec \"$@\"", a.path + "/cgroup.procs",
                                         "/usr/bin/python3", "-c", script, String(pid), daemon.socket, frame])
        kill(pid, SIGCONT)
        let reply = [UInt8](hex: String(decoding: result.stdout, as: UTF8.self)) ?? []
        let said = String(decoding: reply, as: UTF8.self)
        #expect(said.contains("ACCESS_DENIED") && said.contains("exited before keychaind"), "\(said) \(result.stderr)")
        #expect(try ctl(daemon, ["ls", "bank"]).status == 0, "keychaind serves others after")
    }
}

extension [UInt8] {
    fileprivate init?(hex: String) {
        guard hex.count.isMultiple(of: 2) else { return nil }
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        self = bytes
    }
}
