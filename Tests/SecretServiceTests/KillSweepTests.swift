import Foundation
import Keychain
import KeychainTestThreads
import Testing

#if DEBUG
/// The provider killed during `CreateItem`, `SetSecret` and `Delete`, at every point: after each TPM
/// command (`KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS`) and after each store write, committed or not
/// (`KEYCHAIN_TEST_ABORT_AFTER_STORE_WRITES`); the hooks end the process as `kill -9` would, no
/// cleanup. Afterwards the item is whole or absent (old or new, for SetSecret), and the next call
/// brings a provider back by D-Bus activation from the private bus's service directory (ours only).
/// Debug builds only (the hooks are compiled out of release builds).
@Suite(.serialized, .offThePool) struct KillSweepTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        bus = try PrivateBus()
        // The store made (its first start writes the provider's records): every start after it is the same.
        try prepare("first")
    }

    /// Secrets of 64 KiB, so a half-written one could not pass for either; `tag` names the item.
    static let helpers = """
        import hashlib, sys
        def secret(kind, tag):
            return hashlib.sha256((kind + tag).encode()).digest() * 2048
        def attributes(tag):
            return {'sweep': tag, 'xdg:schema': 'org.example.Sweep'}

        """

    /// Makes the item `tag` (its old secret) through a provider the bus activates.
    func prepare(_ tag: String) throws {
        let out = try bus.python(Self.helpers + """
            import secretstorage
            conn = secretstorage.dbus_init()
            collection = secretstorage.get_default_collection(conn)
            collection.create_item('L-' + sys.argv[1], attributes(sys.argv[1]), secret('old', sys.argv[1]))
            print('ok')
            """, [tag])
        #expect(out == "ok\n")
    }

    /// The operation, on the provider that owns the name (raw calls: the reply, or the error the bus sends
    /// when the provider dies before replying).
    func operate(_ operation: String, _ tag: String) throws -> String {
        try bus.python(RawCallTests.prelude + Self.helpers + """
            op, tag = sys.argv[1], sys.argv[2]
            login = BASE + '/collection/login'
            _, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
            if op == 'create':
                props = {'org.freedesktop.Secret.Item.Label': ('s', 'L-' + tag),
                         'org.freedesktop.Secret.Item.Attributes': ('a{ss}', attributes(tag))}
                got = call(login, COL, 'CreateItem', 'a{sv}(oayays)b',
                           (props, (session, b'', secret('new', tag), 'application/octet-stream'), False))
            else:
                [item] = call(login, COL, 'SearchItems', 'a{ss}', (attributes(tag),))[0]
                if op == 'set':
                    got = call(item, ITEM, 'SetSecret', '(oayays)', ((session, b'', secret('new', tag), 'application/octet-stream'),))
                else:
                    got = call(item, ITEM, 'Delete')
            print('error ' + got[1] if got and got[0] == 'error' else 'replied')
            """, [operation, tag])
    }

    /// What the item `tag` is now, through a provider the bus activates: `absent`, `old` or `new`
    /// (whole: label, attributes and all 64 KiB of the secret), else the test fails.
    func state(_ tag: String) throws -> String {
        try bus.python(Self.helpers + """
            import secretstorage
            tag = sys.argv[1]
            conn = secretstorage.dbus_init()
            items = list(secretstorage.get_default_collection(conn).search_items(attributes(tag)))
            assert len(items) <= 1, items
            if not items:
                print('absent')
            else:
                [item] = items
                assert item.get_label() == 'L-' + tag, item.get_label()
                assert item.get_attributes() == attributes(tag), item.get_attributes()
                value = item.get_secret()
                kinds = [kind for kind in ('old', 'new') if value == secret(kind, tag)]
                assert len(kinds) == 1, ('a torn secret', len(value))
                print(kinds[0])
            """, [tag]).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Stops the providers the bus started (the software TPM serves one connection at a time).
    func stopActivated() throws {
        let pids = bus.providerPIDs()
        for pid in pids { kill(pid, SIGTERM) }
        try waitUntil("the providers \(pids) to exit on SIGTERM") { !pids.contains(where: { kill($0, 0) == 0 }) }
    }

    /// A provider started by the test with `hook=n`: nil when it died before owning the name (the crash
    /// point was in its start), else its pid and its stdout's read end.
    func startProvider(hook: String, _ n: Int) throws -> pid_t? {
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address
        environment[hook] = String(n)
        let out = Pipe()
        let pid = try #require(Processes.spawn(PrivateBus.provider, [PrivateBus.provider, "--store", bus.store, "--tcti", bus.tpm.tcti],
                                               environment: environment, stdout: out.fileHandleForWriting.fileDescriptor))
        try out.fileHandleForWriting.close()
        // The line it prints when it owns the name, or end of file when it dies first.
        let said: Data
        do {
            said = try read(out.fileHandleForReading, until: "the provider (\(hook)=\(n)) to own its name or die") {
                String(decoding: $0, as: UTF8.self).contains("owns org.freedesktop.secrets")
            }
        } catch {
            kill(pid, SIGKILL)
            _ = Processes.wait(pid)
            throw error
        }
        let line = String(decoding: said, as: UTF8.self)
        try out.fileHandleForReading.close()
        if line.contains("owns org.freedesktop.secrets") { return pid }
        #expect(Processes.wait(pid) == 134, "the provider died in its start without reaching the crash point")
        return nil
    }

    /// The exit status of `pid` if it ends within `seconds`.
    func exitStatus(_ pid: pid_t, within seconds: Double) -> Int32? {
        var status: Int32 = 0
        for _ in 0..<Int(seconds * 100) {
            if waitpid(pid, &status, WNOHANG) == pid { return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F) }
            usleep(10_000)
        }
        return nil
    }

    /// Sweeps one operation through every crash point of one hook; the number of points inside the operation.
    func sweep(_ operation: String, hook: String) throws -> Int {
        var crashes = 0
        for n in 1...400 {
            let tag = "\(operation)-\(hook.contains("TPM") ? "tpm" : "store")-\(n)"
            if operation != "create" { try prepare(tag) }
            try stopActivated()
            guard let provider = try startProvider(hook: hook, n) else { continue }
            let reply = try operate(operation, tag)
            if let status = exitStatus(provider, within: reply == "replied\n" ? 1 : 30) {
                #expect(status == 134, "\(operation) at \(hook)=\(n): the provider ended with \(status)")
                #expect(reply == "error org.freedesktop.DBus.Error.NoReply\n", "\(operation) at \(hook)=\(n): \(reply)")
                crashes += 1
                // The next call activates a provider again; the item is whole or absent.
                let now = try state(tag)
                #expect(bus.providerPIDs().count == 1, "\(operation) at \(hook)=\(n): no provider was activated")
                switch operation {
                case "create": #expect(["absent", "new"].contains(now), "\(operation) at \(hook)=\(n): \(now)")
                case "set": #expect(["old", "new"].contains(now), "\(operation) at \(hook)=\(n): \(now)")
                default: #expect(["old", "absent"].contains(now), "\(operation) at \(hook)=\(n): \(now)")
                }
                continue
            }
            // The operation finished before the nth point: the sweep is through.
            #expect(reply == "replied\n", "\(operation) at \(hook)=\(n): \(reply)")
            kill(provider, SIGTERM)
            #expect(Processes.wait(provider) == 0)
            #expect(try state(tag) == (operation == "delete" ? "absent" : "new"))
            try stopActivated()
            return crashes
        }
        Issue.record("\(operation): more than 400 crash points of \(hook)")
        return crashes
    }

    @Test func killedAfterAnyStoreWriteEachItemIsWholeOrAbsent() throws {
        for operation in ["create", "set", "delete"] {
            let points = try sweep(operation, hook: "KEYCHAIN_TEST_ABORT_AFTER_STORE_WRITES")
            // At least the write's statement (uncommitted: the old item) and its COMMIT (the new one).
            #expect(points >= 2, "\(operation): \(points) store-write crash points inside the call")
        }
    }

    @Test func killedAfterAnyTPMCommandEachItemIsWholeOrAbsent() throws {
        var points: [String: Int] = [:]
        for operation in ["create", "set", "delete"] {
            points[operation] = try sweep(operation, hook: "KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS")
        }
        // SetSecret reads the item first: a fresh provider unseals the collection's key in the TPM (6 commands
        // today). CreateItem and Delete send none: a write seals to the wrapping key's public part.
        #expect(points["set"]! > 0, "\(points)")
    }
}
#endif
