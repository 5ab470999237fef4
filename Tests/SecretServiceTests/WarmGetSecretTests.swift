import Foundation
import KeychainTestThreads
import Testing

/// A warm `GetSecret` is answered on the bus thread (`Keychain.warmRead`), and it answers only what
/// the keychain's own read would: not after a device lock by another process (a `whenUnlocked`
/// collection), not after the collection's window passed, not an item another process removed.
@Suite(.serialized, .offThePool) struct WarmGetSecretTests {
    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
    }

    static let full = buildDirectory.appendingPathComponent("keychainctl-full").path

    /// A bus whose provider answers prompts from `answers`; the device passcode 2468 is set (and the
    /// device unlocked) before the provider starts: the software TPM takes one connection at a time.
    func bus(answers: String = "") throws -> PrivateBus {
        let bus = try PrivateBus(answers: answers)
        try bus.setPasscode("2468")
        return bus
    }

    /// Python: `refused(item)` asserts a read of `item` is refused as locked (secretstorage's own
    /// check of `Locked`, or the provider's `IsLocked`).
    static let refused = """
        from jeepney.wrappers import DBusErrorResponse
        from secretstorage.exceptions import LockedException
        def refused(item):
            try:
                item.get_secret()
            except LockedException:
                return
            except DBusErrorResponse as e:
                assert e.name == 'org.freedesktop.Secret.Error.IsLocked', e
                return
            raise SystemExit('read a locked item')

        """

    /// `keychainctl-full` on the provider's store, as another process of the same user.
    func keychainctl(_ bus: PrivateBus, _ args: [String], input: [UInt8] = []) throws {
        let result = try SecretServiceTests.run(Self.full, ["--store", bus.store, "--tcti", bus.tpm.tcti] + args, input: input)
        try #require(result.status == 0, "keychainctl \(args.joined(separator: " ")): \(result.stderr)")
    }

    @Test func aWarmGetSecretWakesNoThreadButTheBussOwn() throws {
        let bus = try bus()
        // Started (by activation) and its store opened before its pid is taken.
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=w", "warm", "0"], input: Array("started".utf8)).status == 0)
        let out = try bus.python(RawCallTests.prelude + """
            import secretstorage
            c = secretstorage.dbus_init()
            login = secretstorage.get_default_collection(c)
            login.create_item('w', {'warm': '1'}, b'warm-value')
            [item] = login.search_items({'warm': '1'})
            assert item.get_secret() == b'warm-value'  # the cold read: the key is unsealed
            pid = int(sys.argv[1])
            def others():
                # Context switches of the provider's threads but the main one (the bus's).
                total = 0
                for task in os.listdir('/proc/%d/task' % pid):
                    if int(task) == pid:
                        continue
                    for line in open('/proc/%d/task/%s/status' % (pid, task)):
                        if 'ctxt_switches' in line:
                            total += int(line.split()[1])
                return total
            before = others()
            for _ in range(200):
                assert item.get_secret() == b'warm-value'
            print(others() - before)
            """, [String(try #require(bus.providerPIDs().first, "no provider runs"))])
        // A read handed to a task and back wakes a thread of Swift's pool at least once per read.
        let switches = try #require(Int(out.trimmingCharacters(in: .whitespacesAndNewlines)), "\(out)")
        #expect(switches < 20, "200 warm GetSecrets switched the provider's other threads \(switches) times")
    }

    @Test func aDeviceLockByAnotherProcessEndsWarmReadsOfAWhenUnlockedCollection() throws {
        let bus = try bus()
        let made = try bus.python(RawCallTests.prelude + """
            import secretstorage
            props = {'org.freedesktop.Secret.Collection.Label': ('s', 'Unlocked only'),
                     'org.freedesktop.Secret.Collection.KeychainAccessible': ('s', 'whenUnlocked')}
            path, _ = call(BASE, SVC, 'CreateCollection', 'a{sv}s', (props, ''))
            coll = secretstorage.Collection(secretstorage.dbus_init(), path)
            coll.create_item('u', {'unlocked': '1'}, b'unlocked-secret')
            [item] = coll.search_items({'unlocked': '1'})
            for _ in range(3):
                assert item.get_secret() == b'unlocked-secret'  # warm after the first
            print('ok')
            """)
        #expect(made == "ok\n")
        try keychainctl(bus, ["lock"])
        let read = Self.refused + """
            import secretstorage
            c = secretstorage.dbus_init()
            [item] = secretstorage.search_items(c, {'unlocked': '1'})
            coll = secretstorage.Collection(c, item.item_path.rsplit('/', 1)[0])

            """
        let locked = try bus.python(read + """
            refused(item)  # a whenUnlocked item of a locked device
            assert coll.is_locked()
            print('ok')
            """)
        #expect(locked == "ok\n")
        try keychainctl(bus, ["unlock"], input: Array("2468\n".utf8))
        let unlocked = try bus.python(read + """
            assert coll.unlock() is False  # no access control: nothing to ask
            assert item.get_secret() == b'unlocked-secret'
            print('ok')
            """)
        #expect(unlocked == "ok\n")
    }

    @Test func aWindowThatPassedEndsWarmReads() throws {
        // The Unlock's answer, then a cancel for the read after the window.
        let bus = try bus(answers: "passcode:2468\ncancel\n")
        let out = try bus.python(RawCallTests.prelude + Self.refused + """
            import secretstorage, time
            props = {'org.freedesktop.Secret.Collection.Label': ('s', 'Short'),
                     'org.freedesktop.Secret.Collection.KeychainAccessControl': ('s', 'passcode'),
                     'org.freedesktop.Secret.Collection.KeychainAuthValidity': ('u', 2)}
            path, _ = call(BASE, SVC, 'CreateCollection', 'a{sv}s', (props, ''))
            coll = secretstorage.Collection(secretstorage.dbus_init(), path)
            assert coll.unlock() is False  # nothing stored yet: no question
            coll.create_item('s', {'short': '1'}, b'short-secret')
            [item] = coll.search_items({'short': '1'})
            assert call(BASE, SVC, 'Lock', 'ao', ([path],)) == ([path], '/')
            assert coll.unlock() is False  # the first answer: the window opens
            # Past the 2 s window (more time passing only makes that surer): the read must ask, and is canceled.
            time.sleep(3)
            refused(item)
            assert coll.is_locked()
            print('ok')
            """)
        #expect(out == "ok\n")
    }

    @Test func anItemAnotherProcessRemovedIsGoneForAWarmRead() throws {
        let bus = try bus()
        let path = try bus.python("""
            import secretstorage
            login = secretstorage.get_default_collection(secretstorage.dbus_init())
            login.create_item('r', {'removed': '1'}, b'removed-secret')
            [item] = login.search_items({'removed': '1'})
            for _ in range(3):
                assert item.get_secret() == b'removed-secret'
            print(item.item_path)
            """).trimmingCharacters(in: .whitespacesAndNewlines)
        let id = try #require(path.split(separator: "/").last.map(String.init))
        try keychainctl(bus, ["rm", "org.freedesktop.secrets/login", id])
        let out = try bus.python(RawCallTests.prelude + """
            session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))[1]
            error('org.freedesktop.Secret.Error.NoSuchObject', call(sys.argv[1], ITEM, 'GetSecret', 'o', (session,)))
            print('ok')
            """, [path])
        #expect(out == "ok\n")
    }
}
