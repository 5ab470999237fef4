import Foundation
import KeychainTestThreads
import Testing

/// A cold read, a write and a property read that opens a cold item are done off the bus thread:
/// while one client's call waits for the keychain (here its prompt, a person taking their time), the
/// provider answers every other client, and that client's own later calls come after it.
@Suite(.serialized, .offThePool) struct ColdReadTests {
    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
    }

    @Test func otherClientsAreAnsweredWhileAColdGetSecretsIsInFlight() throws {
        // The collection asks at every read (passcode, no window); its read's answer comes 20 s late.
        let bus = try PrivateBus(answers: "delay:20\npasscode:2468\n")
        try bus.setPasscode("2468")
        let out = try bus.python(RawCallTests.prelude + """
            import secretstorage
            from jeepney import new_method_call, DBusAddress, MessageType
            props = {'org.freedesktop.Secret.Collection.Label': ('s', 'Asks'),
                     'org.freedesktop.Secret.Collection.KeychainAccessControl': ('s', 'passcode')}
            path, _ = call(BASE, SVC, 'CreateCollection', 'a{sv}s', (props, ''))
            asks = secretstorage.Collection(secretstorage.dbus_init(), path)
            assert asks.unlock() is False  # nothing stored yet: opened without a question
            asks.create_item('a', {'asks': '1'}, b'asked-secret')
            [item] = asks.search_items({'asks': '1'})
            a = connect()
            session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=a)[1]
            # Client A: a GetSecrets whose read waits for the prompt's answer; its reply is not awaited here.
            sent = new_method_call(DBusAddress(BASE, 'org.freedesktop.secrets', SVC), 'GetSecrets', 'aoo', ([item.item_path], session))
            serial = 4242
            a.send(sent, serial=serial)
            def replied(timeout):
                try:
                    while True:
                        msg = a.receive(timeout=timeout)
                        if msg.header.fields.get(HeaderFields.reply_serial) == serial:
                            return msg
                except TimeoutError:
                    return None
            # Client B, on its own connection, is answered meanwhile: a search, a session, a property.
            b = connect()
            assert call(BASE, SVC, 'SearchItems', 'a{ss}', ({'asks': '1'},), c=b) == ([item.item_path], [])
            assert call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=b)[1].startswith(BASE + '/session/')
            assert call(path, 'org.freedesktop.DBus.Properties', 'Get', 'ss', (COL, 'Label'), c=b) == (('s', 'Asks'),)
            assert replied(0) is None, 'A was answered before B: its read held the bus thread'
            # Then A's reply comes, with the secret.
            reply = replied(120)
            assert reply is not None and reply.header.message_type == MessageType.method_return, reply
            [(got, (_, _, value, _))] = reply.body[0].items()
            assert got == item.item_path and value == b'asked-secret', reply.body
            print('ok')
            """)
        #expect(out == "ok\n")
    }

    /// Client A's calls sent without waiting for their replies (jeepney), and what B gets meanwhile.
    static let pending = """
        from jeepney import new_method_call, DBusAddress, MessageType
        def send(c, path, iface, method, sig, body, serial):
            c.send(new_method_call(DBusAddress(path, 'org.freedesktop.secrets', iface), method, sig, body), serial=serial)
        def replies(c, serials, timeout):
            got = {}
            try:
                while len(got) < len(serials):
                    msg = c.receive(timeout=timeout)
                    serial = msg.header.fields.get(HeaderFields.reply_serial)
                    if serial in serials:
                        got[serial] = msg
            except TimeoutError:
                pass
            return got
        def asks_collection():
            props = {'org.freedesktop.Secret.Collection.Label': ('s', 'Asks'),
                     'org.freedesktop.Secret.Collection.KeychainAccessControl': ('s', 'passcode')}
            path, _ = call(BASE, SVC, 'CreateCollection', 'a{sv}s', (props, ''))
            return path

        """

    @Test func otherClientsAreAnsweredWhileAColdWriteWaitsAndItsClientsNextReadSeesIt() throws {
        // The collection asks at every read: SetSecret reads the item first (its label and attributes
        // stay), and that read's answer comes 15 s late; the GetSecret after it asks again.
        let bus = try PrivateBus(answers: "delay:15\npasscode:2468\npasscode:2468\n")
        try bus.setPasscode("2468")
        let out = try bus.python(RawCallTests.prelude + Self.pending + """
            import secretstorage
            path = asks_collection()
            asks = secretstorage.Collection(secretstorage.dbus_init(), path)
            assert asks.unlock() is False  # nothing stored yet: opened without a question
            asks.create_item('a', {'asks': '1'}, b'first')
            [item] = asks.search_items({'asks': '1'})
            a = connect()
            session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=a)[1]
            # Client A: a SetSecret that waits for its read's prompt, then at once a GetSecret of the
            # same item, neither reply awaited.
            send(a, item.item_path, ITEM, 'SetSecret', '(oayays)', ((session, b'', b'second', 'text/plain'),), 7001)
            send(a, item.item_path, ITEM, 'GetSecret', 'o', (session,), 7002)
            # Client B is answered meanwhile: a search, a session, a property, a write of another collection.
            b = connect()
            assert call(BASE, SVC, 'SearchItems', 'a{ss}', ({'asks': '1'},), c=b) == ([item.item_path], [])
            assert call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=b)[1].startswith(BASE + '/session/')
            assert call(path, 'org.freedesktop.DBus.Properties', 'Get', 'ss', (COL, 'Label'), c=b) == (('s', 'Asks'),)
            login = BASE + '/collection/login'
            b_session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=b)[1]
            made = call(login, COL, 'CreateItem', 'a{sv}(oayays)b',
                        ({'org.freedesktop.Secret.Item.Label': ('s', 'b')}, (b_session, b'', b'b-value', 'text/plain'), False), c=b)
            assert made[0].startswith(login + '/'), made
            assert replies(a, {7001, 7002}, 0) == {}, 'A was answered before B: its write held the bus thread'
            # Then A's replies: the write, and the read after it sees the new value.
            got = replies(a, {7001, 7002}, 120)
            assert got[7001].header.message_type == MessageType.method_return, got[7001]
            assert got[7002].header.message_type == MessageType.method_return, got[7002]
            assert got[7002].body[0][2] == b'second', got[7002].body
            assert item.get_label() == 'a' and item.get_attributes() == {'asks': '1'}
            print('ok')
            """)
        #expect(out == "ok\n")
    }

    @Test func otherClientsAreAnsweredWhileAPropertyReadOpensAColdItem() throws {
        // A provider started again knows no item's label: its Unlock's prompt reads one item (the
        // first answer), and a Get of the other's label reads that one, which asks again; that
        // answer comes 15 s late.
        let bus = try PrivateBus(answers: "passcode:2468\ndelay:15\npasscode:2468\n")
        try bus.setPasscode("2468")
        _ = try bus.python(RawCallTests.prelude + Self.pending + """
            import secretstorage
            asks = secretstorage.Collection(secretstorage.dbus_init(), asks_collection())
            assert asks.unlock() is False
            asks.create_item('first', {'asks': '1'}, b'value')
            asks.create_item('second', {'asks': '1'}, b'value')
            """)
        let provider = try #require(bus.providerPIDs().first, "the bus activated the provider")
        kill(provider, SIGTERM)
        try waitUntil("the provider to exit on SIGTERM") { kill(provider, 0) != 0 }
        let out = try bus.python(RawCallTests.prelude + Self.pending + """
            import secretstorage
            asks = secretstorage.Collection(secretstorage.dbus_init(), BASE + '/collection/asks')
            assert asks.unlock() is False  # the prompt read one of the two items
            # A raw search: secretstorage's Item reads the item's label when it is made.
            paths = sorted(call(BASE + '/collection/asks', COL, 'SearchItems', 'a{ss}', ({'asks': '1'},))[0])
            # Client A: a Get of each item's label; the item the prompt did not read is read now, and asks.
            a = connect()
            for serial, path in zip((7101, 7102), paths):
                send(a, path, 'org.freedesktop.DBus.Properties', 'Get', 'ss', (ITEM, 'Label'), serial)
            b = connect()
            assert call(BASE, SVC, 'SearchItems', 'a{ss}', ({'asks': '1'},), c=b) == (paths, [])
            assert call(paths[1], 'org.freedesktop.DBus.Properties', 'Get', 'ss', (ITEM, 'Created'), c=b)[0][1] > 0
            assert call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')), c=b)[1].startswith(BASE + '/session/')
            early = replies(a, {7101, 7102}, 0)
            assert len(early) < 2, 'A was answered before B: its property read held the bus thread'
            got = {**early, **replies(a, {7101, 7102} - set(early), 120)}
            assert sorted(m.body[0][1] for m in got.values()) == ['first', 'second'], [m.body for m in got.values()]
            print('ok')
            """)
        #expect(out == "ok\n")
    }
}
