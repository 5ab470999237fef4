import Foundation
import KeychainTestThreads
import Testing

/// What a client can make the provider keep is bounded (issue 38 item 6): aliases, collection and
/// item labels, attributes, the number of aliases and collections and the registry's size. Each is
/// refused as a D-Bus error naming the bound, and a refused change leaves nothing behind, in the
/// provider's memory or in the store, so the next write works and a restarted provider finds no trace.
@Suite(.serialized, .offThePool) struct BoundsTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        bus = try PrivateBus()
    }

    /// jeepney, and `call(path, interface, method, signature, body)`: the reply's body, or
    /// `('error', name, message)`; `aliases()` and `collections()` as the provider shows them.
    static let prelude = """
        import re, sys
        from jeepney import DBusAddress, new_method_call, MessageType, HeaderFields
        from jeepney.io.blocking import open_dbus_connection
        conn = open_dbus_connection(bus='SESSION')
        BASE = '/org/freedesktop/secrets'
        SVC = 'org.freedesktop.Secret.Service'
        COL = 'org.freedesktop.Secret.Collection'
        PROPS = 'org.freedesktop.DBus.Properties'
        IA = 'org.freedesktop.DBus.Error.InvalidArgs'
        LE = 'org.freedesktop.DBus.Error.LimitsExceeded'
        LOGIN = BASE + '/collection/login'
        def call(path, iface, method, sig=None, body=()):
            msg = new_method_call(DBusAddress(path, 'org.freedesktop.secrets', iface), method, sig, body)
            reply = conn.send_and_get_reply(msg, timeout=60)
            if reply.header.message_type == MessageType.error:
                return ('error', reply.header.fields[HeaderFields.error_name], reply.body[0] if reply.body else '')
            return reply.body
        def refused(name, says, got):
            assert got[:2] == ('error', name), (name, str(got)[:300])
            assert says in got[2], (says, got[2][:300])
            assert len(got[2]) < 300, 'the message echoes the input: ' + got[2][:300]
        def aliases():
            xml = call(BASE + '/aliases', 'org.freedesktop.DBus.Introspectable', 'Introspect')[0]
            return sorted(re.findall('<node name="([^"]+)"', xml))
        def collections():
            return sorted(call(BASE, PROPS, 'Get', 'ss', (SVC, 'Collections'))[0][1])
        def create(label, alias=''):
            return call(BASE, SVC, 'CreateCollection', 'a{sv}s', ({'org.freedesktop.Secret.Collection.Label': ('s', label)}, alias))
        def session():
            return call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))[1]
        def create_item(coll, label, attributes, s):
            props = {'org.freedesktop.Secret.Item.Label': ('s', label), 'org.freedesktop.Secret.Item.Attributes': ('a{ss}', attributes)}
            return call(coll, COL, 'CreateItem', 'a{sv}(oayays)b', (props, (s, b'', b'v', 'text/plain'), False))

        """

    /// Stops the provider (SIGTERM); the next call activates a new one, which reads the registry from the store.
    func restart() throws {
        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to exit on SIGTERM") { bus.providerPIDs().isEmpty }
    }

    /// The registry's JSON as the store holds it, read by another process while no provider runs.
    func storedRegistry() throws -> String {
        try restart()
        let full = buildDirectory.appendingPathComponent("keychainctl-full").path
        let result = try SecretServiceTests.run(full, ["--store", bus.store, "--tcti", bus.tpm.tcti, "get", "org.freedesktop.secrets", "registry"])
        try #require(result.status == 0, "keychainctl get registry: \(result.stderr)")
        return String(decoding: result.stdout, as: UTF8.self)
    }

    @Test func hugeAliasesAreRefusedAndTheNextRegistryWriteWorks() throws {
        let out = try bus.python(Self.prelude + """
            huge = 'a' * (6 << 20)
            for i in range(3):
                refused(IA, 'An alias is at most 255 bytes, got 6291456', call(BASE, SVC, 'SetAlias', 'so', (huge[:-1] + str(i), LOGIN)))
            refused(IA, 'An alias is at most 255 bytes, got 6291456', create('Huge', huge))
            # The longest alias is taken, one byte more is not.
            assert call(BASE, SVC, 'SetAlias', 'so', ('b' * 255, LOGIN)) == ()
            refused(IA, 'at most 255 bytes, got 256', call(BASE, SVC, 'SetAlias', 'so', ('b' * 256, LOGIN)))
            assert call(BASE, SVC, 'ReadAlias', 's', (huge[:-1] + '0',)) == ('/',)
            assert create('After')[0] == BASE + '/collection/after', 'CreateCollection after the refusals'
            print(aliases() == ['b' * 255, 'default', 'session'], collections())
            """)
        #expect(out == "True ['/org/freedesktop/secrets/collection/after', '/org/freedesktop/secrets/collection/login', "
                + "'/org/freedesktop/secrets/collection/session']\n")
        let registry = try storedRegistry()
        #expect(registry.utf8.count < 1000, "the registry is \(registry.utf8.count) bytes")
        #expect(!registry.contains("aaaa") && registry.contains(String(repeating: "b", count: 255)) && registry.contains("after"))
        let again = try bus.python(Self.prelude + "print(aliases() == ['b' * 255, 'default', 'session'], len(collections()))")
        #expect(again == "True 3\n", "after a restart")
    }

    @Test func anAliasOrACollectionPastTheCountIsRefusedAndLeavesNothing() throws {
        let out = try bus.python(Self.prelude + """
            for i in range(255):
                assert call(BASE, SVC, 'SetAlias', 'so', ('a%d' % i, LOGIN)) == (), i
            assert len(aliases()) == 257  # default, session and ours
            refused(LE, 'There are 256 aliases', call(BASE, SVC, 'SetAlias', 'so', ('one_more', LOGIN)))
            refused(LE, 'There are 256 aliases', create('With alias', 'one_more'))
            before = collections()
            assert call(BASE, SVC, 'ReadAlias', 's', ('one_more',)) == ('/',)
            # Moving or removing an alias takes no room; the registry still takes writes.
            made = create('Other')[0]
            assert call(BASE, SVC, 'SetAlias', 'so', ('a0', made)) == ()
            assert call(BASE, SVC, 'SetAlias', 'so', ('a1', '/')) == ()
            assert call(BASE, SVC, 'SetAlias', 'so', ('one_more', LOGIN)) == ()
            print(before == sorted(set(collections()) - {made}), len(aliases()), 'one_more' in aliases(), 'a1' in aliases())
            """)
        #expect(out == "True 257 True False\n")
        let registry = try storedRegistry()
        #expect(registry.contains("\"one_more\"") && !registry.contains("\"a1\"") && !registry.contains("With alias"))
        let again = try bus.python(Self.prelude + """
            print(len(aliases()), call(BASE, SVC, 'ReadAlias', 's', ('a0',))[0])
            for i in range(254):
                assert create('C%d' % i)[0].startswith(BASE + '/collection/c'), i
            refused(LE, 'There are 256 collections', create('Too many'))
            print(len(collections()))
            """)
        #expect(again == "257 /org/freedesktop/secrets/collection/other\n257\n", "after a restart: 256 collections and the session")
    }

    @Test func aRegistryPastItsSizeIsRefusedAndTheNextWriteWorksAfterARestartToo() throws {
        // A control character is six bytes in the registry's JSON: a label of 4,096 of them takes 24 KiB.
        let out = try bus.python(Self.prelude + """
            shorts = [create('Short %d' % i)[0] for i in (1, 2)]
            big = '\\x01' * 4096
            made = []
            for i in range(40):
                got = create(big)
                if got[0] == 'error':
                    refused(LE, 'more than its 262144', got)
                    break
                made.append(got[0])
            else:
                raise SystemExit('40 collections of 4,096 control characters were taken')
            assert collections() == sorted(made + shorts + [LOGIN, BASE + '/collection/session'])
            # Growing a label is refused too (at the second try at most: one label's growth is less
            # than a collection's) and leaves the label as it was.
            labels = {LOGIN: 'Login', shorts[0]: 'Short 1', shorts[1]: 'Short 2'}
            for path in labels:
                got = call(path, PROPS, 'Set', 'ssv', (COL, 'Label', ('s', big)))
                if got != ():
                    refused(LE, 'more than its 262144', got)
                    kept = path
                    break
            else:
                raise SystemExit('three labels grew past the registry size')
            assert call(kept, PROPS, 'Get', 'ss', (COL, 'Label'))[0][1] == labels[kept]
            # A short label still fits, and an alias: the next registry write works.
            small = create('Small', 'small')[0]
            assert call(BASE, SVC, 'ReadAlias', 's', ('small',)) == (small,)
            print(len(made), len(collections()), kept, labels[kept])
            """)
        let fields = out.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: " ", maxSplits: 3).map(String.init)
        try #require(fields.count == 4, "\(out)")
        let (made, total, kept, label) = (Int(fields[0]) ?? 0, Int(fields[1]) ?? 0, fields[2], fields[3])
        #expect(made >= 8 && made <= 12 && total == made + 5, "\(out)")
        let registry = try storedRegistry()
        #expect(registry.utf8.count <= 262_144, "the registry is \(registry.utf8.count) bytes")
        let again = try bus.python(Self.prelude + """
            print(len(collections()), call(BASE, SVC, 'ReadAlias', 's', ('small',))[0])
            print(call(sys.argv[1], PROPS, 'Get', 'ss', (COL, 'Label'))[0][1])
            """, [kept])
        #expect(again == "\(total) /org/freedesktop/secrets/collection/small\n\(label)\n", "after a restart")
    }

    @Test func aHundredAndTwentyFourAttributesAreTakenAndOneMoreIsRefusedNamingTheLimit() throws {
        let out = try bus.python(Self.prelude + """
            s = session()
            many = {'name%03d' % i: 'value %d' % i for i in range(124)}
            item = create_item(LOGIN, 'many', many, s)[0]
            got = call(item, PROPS, 'Get', 'ss', ('org.freedesktop.Secret.Item', 'Attributes'))[0][1]
            assert got == many, len(got)
            assert call(LOGIN, COL, 'SearchItems', 'a{ss}', ({'name123': 'value 123'},)) == ([item],)
            more = dict(many, name124='value 124')
            refused(IA, 'An item has at most 124 attributes, got 125', create_item(LOGIN, 'more', more, s))
            refused(IA, 'An item has at most 124 attributes, got 125',
                    call(item, PROPS, 'Set', 'ssv', ('org.freedesktop.Secret.Item', 'Attributes', ('a{ss}', more))))
            assert call(item, PROPS, 'Get', 'ss', ('org.freedesktop.Secret.Item', 'Attributes'))[0][1] == many
            print(len(call(LOGIN, PROPS, 'Get', 'ss', (COL, 'Items'))[0][1]))
            """)
        #expect(out == "1\n")
    }

    @Test func oversizeLabelsAndAttributesAreRefusedNamingTheLimit() throws {
        let out = try bus.python(Self.prelude + """
            s = session()
            # The longest label is taken (the collection's name is its first 64 letters), one byte more is not.
            longest = create('L' * 4096)[0]
            assert longest == BASE + '/collection/' + 'l' * 64, longest
            refused(IA, "A collection's label is at most 4096 bytes, got 4097", create('L' * 4097))
            refused(IA, "A collection's label is at most 4096 bytes, got 6291456",
                    call(longest, PROPS, 'Set', 'ssv', (COL, 'Label', ('s', 'x' * (6 << 20)))))
            assert call(longest, PROPS, 'Get', 'ss', (COL, 'Label'))[0][1] == 'L' * 4096
            item = create_item(LOGIN, 'i' * 4096, {'k': 'v' * 4096, 'n' * 4096: 'v'}, s)[0]
            refused(IA, "An item's label is at most 4096 bytes, got 4097", create_item(LOGIN, 'i' * 4097, {}, s))
            refused(IA, "An item's label is at most 4096 bytes, got 4097",
                    call(item, PROPS, 'Set', 'ssv', ('org.freedesktop.Secret.Item', 'Label', ('s', 'i' * 4097))))
            refused(IA, 'Attribute names and values are at most 4096 bytes', create_item(LOGIN, 'x', {'k': 'v' * 4097}, s))
            refused(IA, 'Attribute names and values are at most 4096 bytes', create_item(LOGIN, 'x', {'n' * 4097: 'v'}, s))
            print(len(collections()), len(call(LOGIN, PROPS, 'Get', 'ss', (COL, 'Items'))[0][1]))
            """)
        #expect(out == "3 1\n")
    }
}
