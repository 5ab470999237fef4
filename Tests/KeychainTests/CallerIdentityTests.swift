import Foundation
import Glibc
@testable import Keychain
@testable import KeychainEngine
import KeychainBasics
@testable import KeychainDaemon
import KeychainTestThreads
import KeychainWire
import Testing

/// Issue 41: what /proc says about a peer, read without root, and where a confined application's
/// items go in the store.
@Suite("caller identity (no TPM)", .offThePool)
struct CallerIdentityTests {
    @Test func aSystemUnitIsTheFirstServiceUnderSlicesOnly() {
        let cases: [(String, String?)] = [
            ("0::/system.slice/nginx.service\n", "nginx.service"),
            ("0::/system.slice/a.service/b.service\n", "a.service"),  // Delegate= sub-cgroups name nothing
            ("0::/foo.slice/bar.slice/db.service/payload\n", "db.service"),
            ("0::/machine.slice/systemd-nspawn@x.service/payload\n", "systemd-nspawn@x.service"),
            ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/a.service\n", nil),
            ("0::/user.slice/user-1000.slice/session-2.scope\n", nil),
            ("0::/system.slice/user@1000.service/x.service\n", nil),
            ("0::/init.scope\n", nil),
            ("0::/\n", nil),
            ("0::/a.service\n", "a.service"),
            ("0::/system.slice/.service\n", nil),
            ("0::/system.slice/sess.scope/a.service\n", nil),
            ("0::/../../system.slice/a.service\n", nil),
            ("0::/system.slice//a.service\n", nil),
            ("0::/system.slice/a b.service\n", nil),
            ("0::system.slice/a.service\n", nil),
            // cgroup v1: name=systemd is the systemd hierarchy, whatever the unified line says.
            ("9:name=systemd:/system.slice/kc-a.service\n0::/\n", "kc-a.service"),
            ("0::/system.slice/kc-a.service\n9:name=systemd:/user.slice/user-1.slice/session-1.scope\n", nil),
            ("4:memory:/system.slice/a.service\n", nil),
        ]
        for (cgroup, unit) in cases {
            #expect(CallerIdentity.systemUnit(cgroup: cgroup) == unit, "\(cgroup)")
        }
        #expect(CallerIdentity.systemUnit(cgroup: "0::/" + String(repeating: "a", count: 248) + ".service") == nil)
    }

    /// A mount table is read line by line from its file, not refused past 64 KiB as before: 6,000
    /// mounts (about 600 KiB) before the sandbox's `/.flatpak-info`, a line of 200 KiB of options after
    /// its mount point; refused only where the mount point cannot be told (a line longer than
    /// `MountTable.maxLineBytes` before it ends, more than `maxLines` lines).
    @Test func aLargeMountTableIsReadLineByLineAndBoundedPerLineAndInCount() throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("mountinfo-\(UUID().uuidString)").path
        defer { unlink(file) }
        func mounts(_ text: String) throws(KeychainError) -> Bool {
            _ = FileManager.default.createFile(atPath: file, contents: Data(text.utf8))
            return try CallerIdentity.mountsFlatpakInfo(path: file, pid: 1)
        }
        let many = (0..<6000).map { "\(100 + $0) 68 0:40 / /run/host/mount-number-\($0)-of-a-large-table rw,nosuid - tmpfs tmpfs rw\n" }.joined()
        #expect(many.utf8.count > 500_000)
        let info = "79 68 0:40 /bindfile//deleted /.flatpak-info ro - tmpfs tmpfs rw\n"
        #expect(try mounts(many + info), "the sandbox's mount after 6,000 others is found")
        #expect(try !mounts(many), "no such mount in a large table: not a sandbox, and not refused")
        let longOptions = "80 68 0:40 / /srv ro - tmpfs tmpfs " + String(repeating: "o", count: 200_000) + "\n"
        #expect(try mounts(longOptions + info), "a line long past its mount point is cut, the next line read")
        #expect(try mounts(String(info.dropLast())), "a last line without a newline")
        let longRoot = "81 68 0:40 /" + String(repeating: "r", count: MountTable.maxLineBytes) + " /.flatpak-info ro - tmpfs tmpfs rw\n"
        #expect(throws: KeychainError.self, "a mount point past the line bound cannot be told: refused") { try mounts(longRoot) }
        let tooMany = String(repeating: "22 27 0:21 / /proc rw - proc proc rw\n", count: MountTable.maxLines + 1)
        #expect(throws: KeychainError.self, "more lines than the kernel's default fs.mount-max: refused") { try mounts(tooMany) }
    }

    /// What keychaind's own user may read of another user's process: a Flatpak sandbox's mount of its
    /// `/.flatpak-info` (this line is bwrap's `--ro-bind-data`, read from another uid), and the app's scope.
    @Test func aSandboxIsToldByItsMountTableAndItsAppByItsFlatpakScope() throws {
        let sandbox = """
            68 67 0:40 / / rw,nosuid,nodev,relatime - tmpfs tmpfs rw,uid=65534,gid=65534
            79 68 0:40 /bindfile2TSCba//deleted /.flatpak-info ro,nosuid,nodev,relatime - tmpfs tmpfs rw,uid=65534,gid=65534
            """
        #expect(try MountTable.mountsFlatpakInfo(sandbox))
        #expect(try !MountTable.mountsFlatpakInfo("22 27 0:21 / /proc rw,relatime - proc proc rw\n"))
        #expect(try !MountTable.mountsFlatpakInfo("79 68 0:40 /.flatpak-info /srv/.flatpak-info ro - tmpfs tmpfs rw\n"),
                "the file's source path is not where it is mounted")
        #expect(try !MountTable.mountsFlatpakInfo("79 68 0:40 / /.flatpak-info\\040x ro - tmpfs tmpfs rw\n"))

        let scope = "1:name=systemd:/user.slice/user-1600.slice/user@1600.service/app.slice/app-flatpak-org.example.A-4242.scope\n"
        #expect(CallerIdentity.flatpakScope(cgroup: scope) == "org.example.A")
        #expect(CallerIdentity.flatpakScope(cgroup: #"0::/user.slice/user-1600.slice/user@1600.service/app.slice/app-flatpak-org.gnome.Foo\x2dbar-7.scope"#)
                == "org.gnome.Foo-bar", "flatpak escapes the id as a unit name: '-' is \\x2d")
        #expect(CallerIdentity.flatpakScope(cgroup: #"0::/user.slice/app-flatpak-org.gnome.Foo\x2-7.scope"#) == nil, "a malformed escape")
        #expect(CallerIdentity.flatpakScope(cgroup: "0::/user.slice/app-flatpak-org.example.A.scope") == nil, "no pid after the id")
        #expect(CallerIdentity.flatpakScope(cgroup: "0::/user.slice/app-flatpak-org.example.A-12x.scope") == nil)
        #expect(CallerIdentity.flatpakScope(cgroup: "0::/user.slice/app-flatpak-example-12.scope") == nil, "not a valid app id")
        #expect(CallerIdentity.flatpakScope(cgroup: "0::/user.slice/app-gnome-org.example.A-12.scope") == nil, "not flatpak's")
    }

    @Test func aFlatpakInfoNamesOneValidAppID() {
        let cases: [(String, String?)] = [
            ("[Application]\nname=org.example.A\nruntime=runtime/x\n\n[Instance]\ninstance-id=1\n", "org.example.A"),
            ("# comment\n[Application]\n  name = org.example.B\n", "org.example.B"),
            ("[Application]\nname=org.example.A\n[Runtime]\nname=org.example.Platform\n", "org.example.Platform"),
            ("[Instance]\nname=org.example.A\n", nil),
            ("[Application]\nname=org.example.A\nname=org.example.B\n", nil),
            ("[Application]\nname=example.A\n", nil),
            ("[Application]\nname=org.1example.A\n", nil),
            ("[Application]\nname=org.ex-ample.A\n", nil),
            ("[Application]\nname=org.example.my-app\n", "org.example.my-app"),
            ("[Application]\nname=org..A\n", nil),
            ("[Application]\nname=org.example.A/../b\n", nil),
            ("[Application\nname=org.example.A\n", nil),
            ("", nil),
        ]
        for (info, id) in cases {
            #expect(CallerIdentity.flatpakApplication(info: info) == id, "\(info)")
        }
        #expect(CallerIdentity.isFlatpakAppID("org.example." + String(repeating: "a", count: 243)))  // 255 bytes
        #expect(!CallerIdentity.isFlatpakAppID("org.example." + String(repeating: "a", count: 244)))
    }

    @Test func aPidfdsPidIsItsFdinfoLine() {
        #expect(CallerIdentity.pid(fdinfo: "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1055\nPid:\t4242\nNSpid:\t4242\n") == 4242)
        #expect(CallerIdentity.pid(fdinfo: "pos:\t0\nPid:\t-1\n") == -1)
        #expect(CallerIdentity.pid(fdinfo: "pos:\t0\n") == nil)
    }

    /// This test process, the peer of its own socketpair, is told through its pidfd as its cgroup
    /// says (no unit here, or the runner's unit under systemd), without a refusal. An exited peer's
    /// refusal needs real processes: `PerApplicationDaemonTests`.
    @Test func aLivePeerIsToldAsItsCgroupSays() throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        let identity = try CallerIdentity.ofPeer(socket: fds[0], uid: getuid(), pid: getpid())
        let own = try String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8)
        #expect(identity.application == CallerIdentity.systemUnit(cgroup: own).map(ConfinedApplication.unit))
    }

    @Test func anApplicationsStoreNamesParseBackAndNoOtherScopeSpellsThem() throws {
        let scopes: [ItemScope] = [.application(1600, .unit("kc-a.service")), .application(0, .flatpak("org.example.A")),
                                   .application(1600, .unit("a:b@c.service"))]
        for scope in scopes {
            for service in ["bank", "a/b", "uid:1/x"] {
                let name = try scope.storeName(service)
                let parsed = try #require(ItemScope.parse(name))
                #expect(parsed.0 == scope && parsed.1 == service, "\(name)")
                #expect(name.hasPrefix("app:"))
                #expect(throws: KeychainError(.invalidArgument)) { try ItemScope.process.storeName(name) }
                #expect(ItemNames.storedServiceProblem(name) == nil)
            }
        }
        // A uid's, a group's or the credentials' names never begin as an application's.
        for other in [ItemScope.user(1600), .group("app"), .credentials(.system), .credentials(.user(1600))] {
            #expect(!(try other.storeName("app:1600:unit:kc-a.service/bank")).hasPrefix("app:"))
        }
        for plain in ["app:", "app:x:unit:a.service/b", "app:1:unit:a/b", "app:1:flatpak:example.A/b", "app:1:unit:a.service",
                      "app:1:snap:a/b", "app::unit:a.service/b"] {
            #expect(ItemScope.parse(plain) == nil, "\(plain)")
        }
        #expect(ItemScope.application(1600, .unit("kc-a.service")).storePrefix == "app:1600:unit:kc-a.service/")
        #expect(ItemScope.user(1600).quotaPrefixes == ["uid:1600/", "app:1600:"])
        #expect(quotaScope(of: "app:1600:flatpak:org.example.A/bank") == .user(1600))
    }

    /// A confined application's default service is its own id, whatever its client sent; its scope is
    /// its own; an unconfined caller keeps the service its client sent, in its uid's scope.
    @Test func aConfinedCallersDefaultServiceIsItsApplicationFromTheKernel() async throws {
        let backing = RecordingService()
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        let unit = Peer(pid: 1, uid: 1600, gid: 1600, groups: [], application: .unit("kc-a.service"))
        let flatpak = Peer(pid: 1, uid: 1600, gid: 1600, groups: [], application: .flatpak("org.example.A"))
        let shell = Peer(pid: 1, uid: 1600, gid: 1600, groups: [])
        for (peer, isDefault) in [(unit, true), (unit, false), (flatpak, true), (shell, true)] {
            var fields = KeychainOptions(service: "forged.by.KEYCHAIN_APP_ID").wire
            fields.serviceIsDefault = isDefault
            var request = WireMessage(kind: WireOp.hasItem.rawValue)
            request.add(WireTag.options, fields.encoded())
            request.add(WireTag.key, "k")
            let reply = await handler.respond(to: try WireMessage.decode(request.encoded()), from: peer, options: Connection().options,
                                              authenticator: { _ in fatalError("no prompt in these tests") })
            #expect(reply.kind == WireKind.ok)
        }
        let unitScope = ItemScope.application(1600, .unit("kc-a.service")), appScope = ItemScope.application(1600, .flatpak("org.example.A"))
        #expect(backing.calls.withLock { $0.map { [$0.scope, $0.service] as [AnyHashable?] } } == [
            [unitScope, "kc-a"], [unitScope, "forged.by.KEYCHAIN_APP_ID"], [appScope, "org.example.A"],
            [ItemScope.user(1600), "forged.by.KEYCHAIN_APP_ID"],
        ])
    }

    /// A group file lists applications beside uids and gids: a confined application is a member by
    /// its own entry only (not by its uid), an unconfined caller by its uid or gids only.
    @Test func aGroupNamesApplicationsAndAConfinedOneIsAMemberOnlyByName() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("kc-groups-\(getpid())").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/shared.conf"
        try Data("unit kc-a.service\napp org.example.A\nuid 1600\n".utf8).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o644)
        let groups = AccessGroups(directory: directory)
        let member = { (application: ConfinedApplication?) in
            try groups.isMember(Peer(pid: 1, uid: 1600, gid: 1600, groups: [], application: application), of: "shared")
        }
        #expect(try member(.unit("kc-a.service")))
        #expect(try member(.flatpak("org.example.A")))
        #expect(try member(nil))
        #expect(try !member(.unit("kc-b.service")))
        #expect(try !member(.flatpak("org.example.B")))
        #expect(try !groups.isMember(Peer(pid: 1, uid: 1700, gid: 1700, groups: []), of: "shared"))
        for bad in ["unit kc-a", "app example.A", "unit user@1000.service/x", "app org.example.A extra"] {
            try Data((bad + "\n").utf8).write(to: URL(fileURLWithPath: path))
            #expect(try !member(nil), "a file with '\(bad)' is ignored whole")
        }
    }
}
