import Foundation
import KeychainTestThreads
import Testing

/// Calls made by hand (python's jeepney, a D-Bus library with no Secret Service logic): malformed
/// calls, random ones, Chromium's sequence replayed call for call, and warm reads on a frozen TPM.
@Suite(.serialized, .offThePool) struct RawCallTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        bus = try PrivateBus()
    }

    /// A jeepney connection and `call(path, interface, method, signature, body)`: the error name, or the reply's body.
    static let prelude = """
        import os, sys, random
        from jeepney import DBusAddress, new_method_call, MessageType, HeaderFields
        from jeepney.io.blocking import open_dbus_connection
        def connect():
            return open_dbus_connection(bus='SESSION')
        conn = connect()
        BASE = '/org/freedesktop/secrets'
        def call(path, iface, method, sig=None, body=(), c=None):
            msg = new_method_call(DBusAddress(path, 'org.freedesktop.secrets', iface), method, sig, body)
            reply = (c or conn).send_and_get_reply(msg, timeout=30)
            if reply.header.message_type == MessageType.error:
                return ('error', reply.header.fields[HeaderFields.error_name])
            return reply.body
        def error(name, got):
            assert got == ('error', name), (name, got)
        SVC = 'org.freedesktop.Secret.Service'
        COL = 'org.freedesktop.Secret.Collection'
        ITEM = 'org.freedesktop.Secret.Item'

        """

    @Test func everyMalformedCallGetsADBusErrorAndTheProviderServesOn() throws {
        let out = try bus.python(Self.prelude + """
            ia = 'org.freedesktop.DBus.Error.InvalidArgs'
            error(ia, call(BASE, SVC, 'OpenSession', 's', ('plain',)))
            error(ia, call(BASE, SVC, 'SearchItems', 's', ('x',)))
            error(ia, call(BASE, SVC, 'GetSecrets', 'ao', ([],)))
            error('org.freedesktop.DBus.Error.UnknownMethod', call(BASE, SVC, 'Nope'))
            error('org.freedesktop.DBus.Error.UnknownMethod', call(BASE, COL, 'CreateItem', 'a{sv}(oayays)b', ({}, ('/', b'', b'', ''), False)))
            error('org.freedesktop.DBus.Error.NotSupported', call(BASE, SVC, 'OpenSession', 'sv', ('rot13', ('s', ''))))
            dh = 'dh-ietf1024-sha256-aes128-cbc-pkcs7'
            for bad in [b'', b'\\x00', b'\\x01', b'\\xff' * 128, b'\\x02' * 129]:
                error(ia, call(BASE, SVC, 'OpenSession', 'sv', (dh, ('ay', bad))))
            error(ia, call(BASE, SVC, 'OpenSession', 'sv', (dh, ('s', 'not a key'))))
            error('org.freedesktop.Secret.Error.NoSuchObject', call(BASE + '/collection/nope', COL, 'SearchItems', 'a{ss}', ({},)))
            error('org.freedesktop.Secret.Error.NoSuchObject', call(BASE + '/collection/login/inope', ITEM, 'Delete'))
            error('org.freedesktop.Secret.Error.NoSuchObject', call(BASE + '/session/999', 'org.freedesktop.Secret.Session', 'Close'))
            error('org.freedesktop.DBus.Error.UnknownObject', call('/elsewhere', SVC, 'SearchItems', 'a{ss}', ({},)))
            error('org.freedesktop.Secret.Error.NoSession', call(BASE, SVC, 'GetSecrets', 'aoo', ([], BASE + '/session/999')))
            # A session of another connection is no session of ours.
            other = connect()
            _, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=other)
            item, prompt = call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b',
                                ({'org.freedesktop.Secret.Item.Label': ('s', 'x')}, (session, b'', b'v', 'text/plain'), False), c=other)
            error('org.freedesktop.Secret.Error.NoSession', call(item, ITEM, 'GetSecret', 'o', (session,)))
            error('org.freedesktop.Secret.Error.NoSession', call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b',
                                                                 ({}, (session, b'', b'v', ''), False)))
            # Properties: wrong types, read-only, unknown.
            error(ia, call(item, 'org.freedesktop.DBus.Properties', 'Set', 'ssv', (ITEM, 'Label', ('u', 7))))
            error('org.freedesktop.DBus.Error.PropertyReadOnly', call(item, 'org.freedesktop.DBus.Properties', 'Set', 'ssv', (ITEM, 'Locked', ('b', True))))
            error('org.freedesktop.DBus.Error.UnknownProperty', call(item, 'org.freedesktop.DBus.Properties', 'Get', 'ss', (ITEM, 'Nope')))
            # A huge attribute map and an oversized field are refused, nothing stored.
            _, mine = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
            huge = {'org.freedesktop.Secret.Item.Attributes': ('a{ss}', {str(i): 'v' for i in range(10000)})}
            error(ia, call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b', (huge, (mine, b'', b'v', ''), False)))
            long = {'org.freedesktop.Secret.Item.Attributes': ('a{ss}', {'k': 'x' * 5000})}
            error(ia, call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b', (long, (mine, b'', b'v', ''), False)))
            # A DH secret that does not decrypt: 17 bytes are no whole number of AES blocks (16 random ones
            # would decrypt to valid padding once in 256 runs).
            import secretstorage.dhcrypto as d
            s = d.Session()
            _, dhpath = call(BASE, SVC, 'OpenSession', 'sv', (dh, ('ay', d.int_to_bytes(s.my_public_key))))
            error(ia, call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b', ({}, (dhpath, b'\\x00' * 16, b'\\x01' * 17, ''), False)))
            # Still serving: the item made above reads back.
            assert call(item, ITEM, 'GetSecret', 'o', (session,), c=other)[0][2] == b'v'
            print('ok')
            """)
        #expect(out == "ok\n")
        #expect(bus.providerPIDs().count == 1)
    }

    @Test func randomCallsWithRandomSignaturesNeverCrashTheProvider() throws {
        let out = try bus.python(Self.prelude + """
            random.seed(int(sys.argv[1]))
            _, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
            item, _ = call(BASE + '/collection/login', COL, 'CreateItem', 'a{sv}(oayays)b',
                           ({'org.freedesktop.Secret.Item.Attributes': ('a{ss}', {'fuzz': 'keep'})}, (session, b'', b'kept', ''), False))
            paths = [BASE, BASE + '/collection/login', BASE + '/aliases/default', BASE + '/collection/session', item, session,
                     BASE + '/prompt/1', '/', BASE + '/collection', BASE + '/collection/login/x', BASE + '/aliases/none/y']
            members = {SVC: ['OpenSession', 'CreateCollection', 'SearchItems', 'Unlock', 'Lock', 'GetSecrets', 'ReadAlias', 'SetAlias'],
                       COL: ['Delete', 'SearchItems', 'CreateItem'], ITEM: ['Delete', 'GetSecret', 'SetSecret'],
                       'org.freedesktop.Secret.Session': ['Close'], 'org.freedesktop.Secret.Prompt': ['Prompt', 'Dismiss'],
                       'org.freedesktop.DBus.Properties': ['Get', 'GetAll', 'Set'], 'org.freedesktop.DBus.Introspectable': ['Introspect']}
            def value(sig):
                if sig == 's': return random.choice(['', 'plain', 'default', 'x' * random.randint(0, 300), 'Label', 'Items', SVC, COL, ITEM])
                if sig == 'o': return random.choice(paths + ['/org/x'])
                if sig == 'b': return random.random() < 0.5
                if sig == 'u': return random.randint(0, 2**32 - 1)
                if sig == 'ay': return os.urandom(random.randint(0, 200))
                if sig == 'a{ss}': return {value('s')[:20]: value('s') for _ in range(random.randint(0, 5))}
                if sig == 'ao': return [value('o') for _ in range(random.randint(0, 4))]
                if sig == 'v':
                    inner = random.choice(['s', 'ay', 'u', 'a{ss}', 'b', 'o'])
                    return (inner, value(inner))
                if sig == 'a{sv}': return {random.choice(['org.freedesktop.Secret.Item.Label', 'org.freedesktop.Secret.Item.Attributes',
                                                          'org.freedesktop.Secret.Collection.Label',
                                                          'org.freedesktop.Secret.Collection.KeychainAccessible', 'x']): value('v')
                                           for _ in range(random.randint(0, 3))}
                if sig == '(oayays)': return (value('o'), value('ay'), value('ay'), value('s'))
                raise ValueError(sig)
            sigs = ['', 's', 'o', 'b', 'u', 'ay', 'a{ss}', 'ao', 'v', 'a{sv}', '(oayays)', 'sv', 'ss', 'ssv', 'aoo', 'so',
                    'a{sv}s', 'a{sv}(oayays)b', 'o(oayays)', 'b(oayays)']
            errors = 0
            for n in range(int(sys.argv[2])):
                iface = random.choice(list(members))
                method = random.choice(members[iface] + ['Nope'])
                sig = random.choice(sigs)
                parts, i = [], 0
                while i < len(sig):
                    for token in ['a{sv}', 'a{ss}', '(oayays)', 'ay', 'ao']:
                        if sig.startswith(token, i):
                            parts.append(token); i += len(token); break
                    else:
                        parts.append(sig[i]); i += 1
                body = tuple(value(p) for p in parts)
                if method in ('Delete',) and random.random() < 0.8:
                    continue  # keep the item and the collections most of the time, so later calls reach deeper
                reply = call(random.choice(paths), iface, method, sig or None, body)
                if isinstance(reply, tuple) and reply[:1] == ('error',):
                    errors += 1
            print(errors > 0)
            """, ["19", "1500"])
        #expect(out == "True\n", "\(out)")
        #expect(bus.providerPIDs().count == 1, "the provider is still the one the bus started")
        // And it still answers a real client.
        let stored = try bus.run(PrivateBus.secretTool, ["store", "--label=after", "after", "fuzz"], input: Array("still".utf8))
        #expect(stored.status == 0, "\(stored.stderr)")
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "after", "fuzz"]).stdout == Array("still".utf8))
    }

    @Test func chromiumsSequenceWorksOnAFreshAndOnANoDefaultProvider() throws {
        // Chromium's (and Electron's) os_crypt with libsecret, call for call; the second run has no
        // default collection, so it takes the CreateCollection branch.
        let sequence = Self.prelude + """
            def chromium():
                [default] = call(BASE, SVC, 'ReadAlias', 's', ('default',))
                if default == '/':
                    default, prompt = call(BASE, SVC, 'CreateCollection', 'a{sv}s',
                                           ({'org.freedesktop.Secret.Collection.Label': ('s', 'Default keyring')}, 'default'))
                    assert prompt == '/', prompt
                unlocked, prompt = call(BASE, SVC, 'Unlock', 'ao', ([default],))
                assert prompt == '/' and unlocked == [default], (unlocked, prompt)
                output, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
                [found] = call(default, COL, 'SearchItems', 'a{ss}', ({'application': 'chrome'},))
                if not found:
                    attrs = {'xdg:schema': 'chrome_libsecret_os_crypt_password_v2', 'application': 'chrome'}
                    props = {'org.freedesktop.Secret.Item.Label': ('s', 'Chrome Safe Storage'),
                             'org.freedesktop.Secret.Item.Attributes': ('a{ss}', attrs)}
                    item, prompt = call(default, COL, 'CreateItem', 'a{sv}(oayays)b',
                                        (props, (session, b'', sys.stdin.buffer.read(), 'text/plain'), True))
                    assert prompt == '/'
                    found = [item]
                [secret] = call(found[0], ITEM, 'GetSecret', 'o', (session,))
                assert call(session, 'org.freedesktop.Secret.Session', 'Close') == ()
                error('org.freedesktop.Secret.Error.NoSession', call(found[0], ITEM, 'GetSecret', 'o', (session,)))
                return default, secret[2]
            default, secret = chromium()
            print(default, secret.decode())
            if sys.argv[1] == 'delete':
                call(default, COL, 'Delete')
                [none] = call(BASE, SVC, 'ReadAlias', 's', ('default',))
                assert none == '/', none
            """
        let first = try bus.python(sequence, input: Array("chrome-key-1".utf8), ["keep"])
        #expect(first == "/org/freedesktop/secrets/collection/login chrome-key-1\n", "\(first)")
        // Again: the same item is found, nothing new is written.
        #expect(try bus.python(sequence, input: Array("unused".utf8), ["delete"]) == "/org/freedesktop/secrets/collection/login chrome-key-1\n")
        let fresh = try bus.python(sequence, input: Array("chrome-key-2".utf8), ["keep"])
        #expect(fresh == "/org/freedesktop/secrets/collection/default_keyring chrome-key-2\n", "\(fresh)")
    }

    @Test func warmReadsNeedNoTPMCommandAndAFrozenTPMDoesNotStopThem() throws {
        // After one cold read, the TPM is stopped (SIGSTOP): any TPM command would hang until the
        // keychain's 30 s TPM timeout. Warm reads through every client still answer at once.
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=w", "warm", "1"], input: Array("warm-value".utf8)).status == 0)
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "warm", "1"]).stdout == Array("warm-value".utf8))
        let swtpm = bus.tpm.processIdentifier
        try #require(swtpm > 0)
        kill(swtpm, SIGSTOP)
        defer { kill(swtpm, SIGCONT) }
        let start = Date()
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "warm", "1"]).stdout == Array("warm-value".utf8))
        let out = try bus.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            [item] = secretstorage.search_items(conn, {'warm': '1'})
            for _ in range(20):
                assert item.get_secret() == b'warm-value'
            print('ok')
            """)
        #expect(out == "ok\n")
        #expect(Date().timeIntervalSince(start) < 20, "warm reads waited for the stopped TPM")
    }

    @Test func propertiesGetComputesOnlyThePropertyAsked() throws {
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=one-property", "get", "1"], input: Array("value".utf8)).status == 0)
        // A provider started again knows the item's hashes and dates, not its label: reading that needs the TPM.
        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to exit on SIGTERM") { bus.providerPIDs().isEmpty }
        let item = try bus.python(Self.prelude + """
            [found], [] = call(BASE, SVC, 'SearchItems', 'a{ss}', ({'get': '1'},))
            print(found)
            """).trimmingCharacters(in: .whitespacesAndNewlines)
        let swtpm = bus.tpm.processIdentifier
        try #require(swtpm > 0)
        // With the TPM stopped, a property that needs no read answers at once (one that did would wait
        // for the keychain's 30 s TPM timeout, past the call's 10 s).
        kill(swtpm, SIGSTOP)
        var stopped = true
        defer { if stopped { kill(swtpm, SIGCONT) } }
        let out = try bus.python(Self.prelude + """
            import sys, time
            start = time.monotonic()
            for name in ['Locked', 'Created', 'Modified']:
                msg = new_method_call(DBusAddress(sys.argv[1], 'org.freedesktop.secrets', 'org.freedesktop.DBus.Properties'),
                                      'Get', 'ss', (ITEM, name))
                reply = conn.send_and_get_reply(msg, timeout=10)
                assert reply.header.message_type != MessageType.error, (name, reply.body)
            assert time.monotonic() - start < 10
            print('ok')
            """, [item])
        #expect(out == "ok\n")
        kill(swtpm, SIGCONT)
        stopped = false
        let label = try bus.python(Self.prelude + """
            import sys
            print(call(sys.argv[1], 'org.freedesktop.DBus.Properties', 'Get', 'ss', (ITEM, 'Label'))[0][1])
            """, [item])
        #expect(label == "one-property\n")
    }
}
