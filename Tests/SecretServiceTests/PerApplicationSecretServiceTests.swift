import Foundation
import Glibc
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 41 item 4: the Secret Service per application, on a private bus with real clients (secret-tool,
/// python3 secretstorage, libsecret through gi): two bwrap sandboxes whose `/.flatpak-info` names
/// `org.example.A` and `org.example.B` (as Flatpak makes one), a process in a system unit's cgroup, and
/// the host each see only their own items, by any path. Root makes the sandboxes and the cgroup; as
/// another user the suite is skipped (CI runs it as root).
@Suite("Secret Service: per-application items", .serialized, .offThePool,
       .enabled(if: geteuid() == 0, "bwrap sandboxes with a /.flatpak-info and system units' cgroups are made as root"),
       .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/bwrap"), "bwrap is not installed (apt install bubblewrap)"))
struct PerApplicationSecretServiceTests {
    init() throws {
        try PrivateBus.require(PrivateBus.secretTool, "libsecret-tools")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
    }

    /// bwrap's argv up to the program: a sandbox whose `/.flatpak-info` names `appID` (a fresh root: the
    /// host's /usr, /etc and /tmp, where the bus listens, bound in).
    func sandbox(_ bus: PrivateBus, _ appID: String) throws -> [String] {
        let info = "\(bus.directory)/\(appID).flatpak-info"
        try "[Application]\nname=\(appID)\n\n[Instance]\ninstance-id=1\n".write(toFile: info, atomically: true, encoding: .utf8)
        return ["/usr/bin/bwrap", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--ro-bind", "/etc", "/etc",
                "--bind", "/tmp", "/tmp", "--proc", "/proc", "--dev", "/dev", "--ro-bind", info, "/.flatpak-info",
                "--unshare-pid", "--die-with-parent"]
    }

    /// `program` in `appID`'s sandbox, as a client of `bus`.
    func sandboxed(_ bus: PrivateBus, _ appID: String, _ program: String, _ args: [String], input: [UInt8] = [])
        throws -> (status: Int32, out: String, err: String) {
        let argv = try sandbox(bus, appID) + [program] + args
        let result = try run(argv[0], Array(argv.dropFirst()), input: input, environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address])
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// `program` moved into `unit`'s cgroup before it runs, as a client of `bus`.
    func inUnit(_ bus: PrivateBus, _ unit: UnitCgroup, _ program: String, _ args: [String], input: [UInt8] = [])
        throws -> (status: Int32, out: String, err: String) {
        let argv = ["-c", "echo $$ > \"$0\" && exec \"$@\"", unit.path + "/cgroup.procs", program] + args
        let result = try run("/bin/sh", argv, input: input, environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address])
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    func host(_ bus: PrivateBus, _ program: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:])
        throws -> (status: Int32, out: String, err: String) {
        let result = try bus.run(program, args, input: input, environment: environment)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// libsecret through gi (as a GNOME app calls it): stores `argv[2]` under `{kind: argv[1], who: argv[2]}`, then
    /// prints every label its search of `{kind}` finds and the secret its lookup finds.
    static let libsecretScript = """
        import sys, gi
        gi.require_version('Secret', '1')
        from gi.repository import Secret
        schema = Secret.Schema.new('org.example.Kind', Secret.SchemaFlags.DONT_MATCH_NAME,
                                   {'kind': Secret.SchemaAttributeType.STRING, 'who': Secret.SchemaAttributeType.STRING})
        kind, who = sys.argv[1], sys.argv[2]
        assert Secret.password_store_sync(schema, {'kind': kind, 'who': who}, Secret.COLLECTION_DEFAULT, who, who + "'s secret", None)
        found = Secret.password_search_sync(schema, {'kind': kind}, Secret.SearchFlags.ALL | Secret.SearchFlags.UNLOCK, None)
        print(sorted(item.get_label() for item in found))
        print(Secret.password_lookup_sync(schema, {'kind': kind}, None))
        """

    /// Every label `secret-tool search --all kind KIND` shows.
    func labels(_ output: (status: Int32, out: String, err: String)) -> [String] {
        output.out.split(separator: "\n").filter { $0.hasPrefix("label = ") }.map { String($0.dropFirst("label = ".count)) }.sorted()
    }

    @Test(arguments: [false, true])
    func twoSandboxedAppsAUnitAndTheHostEachSeeStoreReplaceAndDeleteOnlyTheirOwnItems(throughKeychaind: Bool) throws {
        let tpm = try SoftwareTPM()
        let keychaind = throughKeychaind ? try KeychainDaemon(tpm: tpm) : nil
        let socket: ((String, String) -> [String])? = keychaind.map { daemon in { _, _ in ["--socket", daemon.socket] } }
        let bus = try PrivateBus(tpm: tpm, providerArguments: socket)
        let tool = PrivateBus.secretTool
        #expect(try host(bus, tool, ["store", "--label=host", "kind", "shared", "who", "host"], input: Array("host's secret".utf8)).status == 0)
        let a = try sandboxed(bus, "org.example.A", tool, ["store", "--label=A", "kind", "shared", "who", "A"], input: Array("A's secret".utf8))
        #expect(a.status == 0, "\(a.err)\n\(bus.log)")
        let b = try sandboxed(bus, "org.example.B", PrivateBus.python3, ["-c", Self.libsecretScript, "shared", "B"])
        #expect(b.status == 0, "\(b.err)\n\(bus.log)")
        #expect(b.out == "['B']\nB's secret\n", "B (libsecret) finds its own item only")
        let unit = try UnitCgroup("kc-ss-test")
        #expect(try inUnit(bus, unit, tool, ["store", "--label=unit", "kind", "shared", "who", "unit"], input: Array("unit's secret".utf8)).status == 0)

        let search = ["search", "--all", "kind", "shared"]
        #expect(labels(try host(bus, tool, search)) == ["host"], "the host sees its own item only")
        #expect(labels(try sandboxed(bus, "org.example.A", tool, search)) == ["A"], "A sees its own item only")
        #expect(labels(try sandboxed(bus, "org.example.B", tool, search)) == ["B"], "B sees its own item only")
        #expect(labels(try inUnit(bus, unit, tool, search)) == ["unit"], "the unit sees its own item only")
        #expect(try host(bus, tool, ["lookup", "kind", "shared"]).out == "host's secret")
        #expect(try sandboxed(bus, "org.example.A", tool, ["lookup", "kind", "shared"]).out == "A's secret")
        #expect(try inUnit(bus, unit, tool, ["lookup", "kind", "shared"]).out == "unit's secret")

        // A replaces its own item (same attributes) and deletes it; nobody else's moves.
        #expect(try sandboxed(bus, "org.example.A", tool, ["store", "--label=A2", "kind", "shared", "who", "A"], input: Array("A's new".utf8)).status == 0)
        #expect(labels(try sandboxed(bus, "org.example.A", tool, search)) == ["A2"])
        #expect(try sandboxed(bus, "org.example.A", tool, ["clear", "kind", "shared"]).status == 0)
        #expect(labels(try sandboxed(bus, "org.example.A", tool, search)).isEmpty)
        _ = try host(bus, tool, ["clear", "kind", "shared", "who", "A"])  // finds nothing: its status says so
        #expect(try host(bus, tool, ["lookup", "kind", "shared"]).out == "host's secret", "A's clear and the host's clear of A left the host's item")
        #expect(labels(try sandboxed(bus, "org.example.B", tool, search)) == ["B"], "and B's")
        #expect(labels(try inUnit(bus, unit, tool, search)) == ["unit"], "and the unit's")
        // The host's item is where it always was: the host's login collection (keychaind: the uid's own storage).
        if let keychaind {
            let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
            let listed = try run(keychainctl, ["ls", "org.freedesktop.secrets/login"], environment: keychaind.environment)
            #expect(String(decoding: listed.stdout, as: UTF8.self).split(separator: "\n").count == 1, "\(listed.stderr)")
        }
    }

    /// What A stored, read back by the host and by B through every path but a search: the collection's
    /// `Items`, `SearchItems` of nothing (every item), the item's path guessed (its properties,
    /// `GetSecrets`, `Delete`), `ReadAlias("default")`.
    static let foreignPathsScript = """
        import sys, json, secretstorage
        from secretstorage.util import DBusAddressWrapper, open_session
        from jeepney.wrappers import DBusErrorResponse
        conn = secretstorage.dbus_init()
        path = sys.argv[1]
        service = DBusAddressWrapper('/org/freedesktop/secrets', 'org.freedesktop.Secret.Service', conn)
        session = open_session(conn)
        out = {'items': [i.item_path for i in secretstorage.get_default_collection(conn).get_all_items()],
               'everything': [i.item_path for i in secretstorage.search_items(conn, {})],
               'alias': service.call('ReadAlias', 's', 'default')[0],
               'secrets': list(service.call('GetSecrets', 'aoo', [path], session.object_path)[0].keys())}
        item = DBusAddressWrapper(path, 'org.freedesktop.Secret.Item', conn)
        for name, call in [('label', lambda: DBusAddressWrapper(path, 'org.freedesktop.DBus.Properties', conn).call('Get', 'ss', 'org.freedesktop.Secret.Item', 'Label')),
                           ('delete', lambda: item.call('Delete', ''))]:
            try:
                call()
                out[name] = 'answered'
            except Exception as e:  # secretstorage wraps NoSuchObject as ItemNotFoundException
                cause = e if isinstance(e, DBusErrorResponse) else e.__cause__
                out[name] = cause.name if isinstance(cause, DBusErrorResponse) else repr(e)
        print(json.dumps(out))
        """

    struct Seen: Decodable {
        var items: [String]
        var everything: [String]
        var alias: String
        var secrets: [String]
        var label: String
        var delete: String
    }

    @Test func noPathReachesAnotherApplicationsItemNorAnAppTheHosts() throws {
        let bus = try PrivateBus()
        let made = try sandboxed(bus, "org.example.A", PrivateBus.python3, ["-c", """
            import secretstorage
            conn = secretstorage.dbus_init()
            print(secretstorage.get_default_collection(conn).create_item('A', {'kind': 'a'}, b"A's secret").item_path)
            """])
        #expect(made.status == 0, "\(made.err)\n\(bus.log)")
        let path = made.out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(path.hasPrefix("/org/freedesktop/secrets/collection/login/"), "\(path)")
        let hostItem = try host(bus, PrivateBus.python3, ["-c", """
            import secretstorage
            conn = secretstorage.dbus_init()
            print(secretstorage.get_default_collection(conn).create_item('host', {'kind': 'h'}, b"host's secret").item_path)
            """]).out.trimmingCharacters(in: .whitespacesAndNewlines)

        for (who, seen) in [("the host", try host(bus, PrivateBus.python3, ["-c", Self.foreignPathsScript, path])),
                            ("B", try sandboxed(bus, "org.example.B", PrivateBus.python3, ["-c", Self.foreignPathsScript, path]))] {
            #expect(seen.status == 0, "\(who): \(seen.err)")
            let decoded = try JSONDecoder().decode(Seen.self, from: Data(seen.out.utf8))
            #expect(!decoded.items.contains(path) && !decoded.everything.contains(path), "\(who) does not list A's item: \(decoded)")
            #expect(decoded.alias == "/org/freedesktop/secrets/collection/login", "\(who)'s default is its own login collection")
            #expect(decoded.secrets.isEmpty, "\(who)'s GetSecrets of A's path gets nothing")
            #expect(decoded.label == "org.freedesktop.Secret.Error.NoSuchObject", "\(who) reads no property of A's item")
            #expect(decoded.delete == "org.freedesktop.Secret.Error.NoSuchObject", "\(who) cannot delete A's item")
        }
        let appSeen = try sandboxed(bus, "org.example.A", PrivateBus.python3, ["-c", Self.foreignPathsScript, hostItem])
        let decoded = try JSONDecoder().decode(Seen.self, from: Data(appSeen.out.utf8))
        #expect(decoded.items == [path] && decoded.everything == [path], "A lists its own item only: \(decoded)")
        #expect(decoded.secrets.isEmpty && decoded.delete == "org.freedesktop.Secret.Error.NoSuchObject", "A reaches nothing of the host's")
        #expect(try sandboxed(bus, "org.example.A", PrivateBus.secretTool, ["lookup", "kind", "a"]).out == "A's secret", "A's item is still there")
        #expect(try host(bus, PrivateBus.secretTool, ["lookup", "kind", "h"]).out == "host's secret")
    }

    /// A host connection that listens to every signal of the provider (after a call of its own) hears of
    /// the host's new item and not of A's: signals go to their application's connections only.
    @Test func theHostHearsNoSignalOfAnAppsItems() throws {
        let bus = try PrivateBus()
        #expect(try host(bus, PrivateBus.secretTool, ["store", "--label=first", "kind", "first"], input: Array("v".utf8)).status == 0)
        let storeA = try sandbox(bus, "org.example.A") + [PrivateBus.secretTool, "store", "--label=A", "kind", "a"]
        let storeHost = [PrivateBus.secretTool, "store", "--label=host", "kind", "h"]
        let heard = try host(bus, PrivateBus.python3, ["-c", """
            import sys, json, subprocess
            from jeepney import DBusAddress, MatchRule, MessageType, new_method_call
            from jeepney.bus_messages import message_bus
            from jeepney.io.blocking import open_dbus_connection, Proxy
            conn = open_dbus_connection('SESSION')
            rule = MatchRule(type='signal', path_namespace='/org/freedesktop/secrets')
            with conn.filter(rule, bufsize=1000) as heard:
                Proxy(message_bus, conn).AddMatch(rule)
                service = DBusAddress('/org/freedesktop/secrets', bus_name='org.freedesktop.secrets', interface='org.freedesktop.Secret.Service')
                conn.send_and_get_reply(new_method_call(service, 'ReadAlias', 's', ('default',)))
                for argv, value in [(json.loads(sys.argv[1]), b"A's secret"), (json.loads(sys.argv[2]), b"host's secret")]:
                    assert subprocess.run(argv, input=value).returncode == 0
                signals = []
                try:
                    while True:
                        signals.append(conn.recv_until_filtered(heard, timeout=1))
                except TimeoutError:
                    pass
                print(json.dumps([m.header.fields.get(3) for m in signals if m.header.message_type == MessageType.signal]))
            """, String(decoding: try JSONEncoder().encode(storeA), as: UTF8.self),
            String(decoding: try JSONEncoder().encode(storeHost), as: UTF8.self)])
        #expect(heard.status == 0, "\(heard.err)")
        let members = try JSONDecoder().decode([String].self, from: Data(heard.out.utf8))
        #expect(members.filter { $0 == "ItemCreated" }.count == 1, "the host's item only: \(members)")
    }

    @Test func aHostProcessNamingAnAppOrWritingAFlatpakInfoOfItsOwnGainsNothing() throws {
        let bus = try PrivateBus()
        #expect(try sandboxed(bus, "org.example.A", PrivateBus.secretTool, ["store", "--label=A", "kind", "a"], input: Array("A's secret".utf8)).status == 0)
        // A .flatpak-info where a host process can write one (its directory, its HOME): not its root, which it cannot write.
        let own = bus.directory + "/forger"
        try FileManager.default.createDirectory(atPath: own, withIntermediateDirectories: true)
        try "[Application]\nname=org.example.A\n".write(toFile: own + "/.flatpak-info", atomically: true, encoding: .utf8)
        let forged = try runChild("/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", own, PrivateBus.secretTool, "search", "--all", "kind", "a"],
                                  environment: ["DBUS_SESSION_BUS_ADDRESS": bus.address, "KEYCHAIN_APP_ID": "org.example.A", "HOME": own,
                                                "FLATPAK_ID": "org.example.A"])
        #expect(forged.status == 0 || forged.status == 1, "\(forged.stderr)")
        #expect(!String(decoding: forged.stdout, as: UTF8.self).contains("label = A"), "the host process does not see A's item")
        #expect(try host(bus, PrivateBus.secretTool, ["lookup", "kind", "a"], environment: ["KEYCHAIN_APP_ID": "org.example.A"]).status != 0)
    }

    /// A client whose first call reaches the provider only after it exited (the provider held with
    /// SIGSTOP until the client is reaped) names nobody: its call is refused, not served as the host's.
    @Test func aSenderThatExitsRightAfterItsCallNamesNobody() throws {
        let bus = try PrivateBus()
        #expect(try host(bus, PrivateBus.secretTool, ["store", "--label=h", "kind", "h"], input: Array("v".utf8)).status == 0)
        let provider = try #require(bus.providerPIDs().first)
        kill(provider, SIGSTOP)
        let sent = try host(bus, PrivateBus.python3, ["-c", """
            from jeepney import new_method_call, DBusAddress
            from jeepney.io.blocking import open_dbus_connection
            conn = open_dbus_connection('SESSION')
            service = DBusAddress('/org/freedesktop/secrets', bus_name='org.freedesktop.secrets', interface='org.freedesktop.Secret.Service')
            conn.send(new_method_call(service, 'CreateCollection', 'a{sv}s', ({'org.freedesktop.Secret.Collection.Label': ('s', 'ghost')}, '')))
            conn.close()
            """])
        kill(provider, SIGCONT)
        #expect(sent.status == 0, "\(sent.err)")
        let labels = try host(bus, PrivateBus.python3, ["-c", """
            import secretstorage
            print(sorted(c.get_label() for c in secretstorage.get_all_collections(secretstorage.dbus_init())))
            """])
        #expect(labels.status == 0, "\(labels.err)")
        #expect(!labels.out.contains("ghost"), "the call of a sender gone before it was told was not served as the host's: \(labels.out)")
        #expect(labels.out.contains("Login"), "\(labels.out)")
    }

    /// One identity look-up per connection, not per call: a client's 300 `GetSecrets` cross the bus with
    /// one `GetConnectionCredentials` from the provider (counted in a capture of the whole bus); the
    /// time of the 300 is printed (docs/performance.md).
    @Test func aClientsIdentityIsLookedUpOncePerConnectionNotPerCall() throws {
        let bus = try PrivateBus()
        #expect(try host(bus, PrivateBus.secretTool, ["store", "--label=m", "kind", "m"], input: Array("measured".utf8)).status == 0)
        var out = ""
        let capture = try bus.captured {
            out = try bus.python("""
                import time, secretstorage
                from secretstorage.util import DBusAddressWrapper, open_session
                conn = secretstorage.dbus_init()
                service = DBusAddressWrapper('/org/freedesktop/secrets', 'org.freedesktop.Secret.Service', conn)
                session = open_session(conn)
                [item] = secretstorage.search_items(conn, {'kind': 'm'})
                start = time.monotonic()
                for _ in range(300):
                    assert len(service.call('GetSecrets', 'aoo', [item.item_path], session.object_path)[0]) == 1
                print(f'{(time.monotonic() - start) / 300 * 1e6:.0f}')
                """)
        }
        let lookUps = capture.ranges(of: Data("GetConnectionCredentials".utf8)).count
        #expect(lookUps == 1, "one look-up for the client's connection, got \(lookUps)")
        print("PerApplicationSecretServiceTests: GetSecrets of one warm item, \(out.trimmingCharacters(in: .whitespacesAndNewlines)) µs a call; \(lookUps) identity look-up for 300 calls")
    }

    /// At most `--max-applications` applications' providers are kept: one whose last connection left holding
    /// nothing in memory is let go (its items stay in the store), one holding a session-collection item is kept,
    /// and a new application past the limit while each kept one holds something is refused `LimitsExceeded`,
    /// then served once one of them ends.
    @Test func theApplicationsServedAtOnceAreBoundedAndAnIdleOneIsLetGo() throws {
        let bus = try PrivateBus(providerArguments: { tcti, store in ["--store", store, "--tcti", tcti, "--max-applications", "2"] })
        func store(_ app: String, _ kind: String, collection: String? = nil) throws -> (status: Int32, out: String, err: String) {
            try sandboxed(bus, app, PrivateBus.secretTool, ["store", "--label=\(kind)"] + (collection.map { ["--collection=\($0)"] } ?? []) + ["kind", kind],
                          input: Array("\(kind)'s secret".utf8))
        }
        #expect(try store("org.example.A", "a").status == 0)
        #expect(try store("org.example.B", "b", collection: "session").status == 0)
        // A's provider was let go when A left (B's holds its session item): C is served, and so is A again, from the store.
        let third = try store("org.example.C", "c")
        #expect(third.status == 0, "an idle application's provider is let go for a new one: \(third.err)")
        #expect(try sandboxed(bus, "org.example.A", PrivateBus.secretTool, ["lookup", "kind", "a"]).out == "a's secret")
        #expect(try sandboxed(bus, "org.example.B", PrivateBus.secretTool, ["lookup", "kind", "b"]).out == "b's secret",
                "B's provider, holding its session item, was kept")

        // D keeps a connection (and a session) open: with B's, two providers hold something, and E is refused.
        let holder = Process()
        let argv = try sandbox(bus, "org.example.D") + [PrivateBus.python3, "-c", """
            import sys, secretstorage
            conn = secretstorage.dbus_init()
            secretstorage.get_default_collection(conn).create_item('d', {'kind': 'd'}, b"d's secret")
            print('ready', flush=True)
            sys.stdin.read()
            """]
        holder.executableURL = URL(fileURLWithPath: argv[0])
        holder.arguments = Array(argv.dropFirst())
        holder.environment = ["DBUS_SESSION_BUS_ADDRESS": bus.address, "PATH": "/usr/bin:/bin"]
        let (input, output) = (Pipe(), Pipe())
        holder.standardInput = input
        holder.standardOutput = output
        try holder.run()
        defer { if holder.isRunning { holder.terminate() } }
        let ready = String(decoding: output.fileHandleForReading.readData(ofLength: 6), as: UTF8.self)
        #expect(ready == "ready\n", "D did not start: \(bus.log)")
        let refused = try store("org.example.E", "e")
        #expect(refused.status != 0, "a third application past the limit is refused while both kept ones hold something")
        #expect(refused.err.contains("at most 2 applications"), "\(refused.err)")
        try input.fileHandleForWriting.close()
        holder.waitUntilExit()
        #expect(holder.terminationStatus == 0)
        let served = try store("org.example.E", "e")
        #expect(served.status == 0, "E is served once D has left: \(served.err)")
        #expect(try sandboxed(bus, "org.example.D", PrivateBus.secretTool, ["lookup", "kind", "d"]).out == "d's secret")
    }
}
