import Foundation
import KeychainTestThreads
import Testing

/// python's secretstorage and keyring, and libsecret's own API through python3-gi, unchanged, on a private bus.
/// Secrets reach the scripts on stdin, never in argv.
@Suite(.serialized, .offThePool) struct PythonClientTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        try PrivateBus.requirePython(module: "keyring", package: "python3-keyring")
        try PrivateBus.requirePython(module: "gi", package: "python3-gi")
        bus = try PrivateBus()
    }

    /// Opens a `plain` session by hand: secretstorage itself always asks for DH first.
    static let plainSession = """
        from secretstorage.dhcrypto import Session
        from secretstorage.util import DBusAddressWrapper
        def plain_session(conn):
            svc = DBusAddressWrapper('/org/freedesktop/secrets', 'org.freedesktop.Secret.Service', conn)
            output, path = svc.call('OpenSession', 'sv', 'plain', ('s', ''))
            s = Session(); s.object_path = path; s.encrypted = False
            return s

        """

    @Test(arguments: ["dh", "plain"])
    func secretstorageCreatesSearchesReadsRewritesAndDeletes(session: String) throws {
        let out = try bus.python(Self.plainSession + """
            import sys, secretstorage
            conn = secretstorage.dbus_init()
            session = plain_session(conn) if sys.argv[1] == 'plain' else None
            coll = secretstorage.get_default_collection(conn, session=session)
            if session is None:
                assert coll.session is None or coll.session.encrypted
            secret = sys.stdin.buffer.read()
            item = coll.create_item('First label', {'app': 'ss-' + sys.argv[1], 'user': 'alice'}, secret, content_type='application/octet-stream')
            assert item.get_secret() == secret, item.get_secret()
            assert item.get_label() == 'First label'
            assert item.get_attributes() == {'app': 'ss-' + sys.argv[1], 'user': 'alice'}, item.get_attributes()
            assert item.get_secret_content_type() == 'application/octet-stream'
            found = list(coll.search_items({'app': 'ss-' + sys.argv[1]}))
            assert [i.item_path for i in found] == [item.item_path], found
            assert list(coll.search_items({'app': 'ss-' + sys.argv[1], 'user': 'bob'})) == []
            everywhere = list(secretstorage.search_items(conn, {'user': 'alice', 'app': 'ss-' + sys.argv[1]}))
            assert [i.item_path for i in everywhere] == [item.item_path]
            item.set_label('Second label')
            item.set_attributes({'app': 'ss-' + sys.argv[1], 'user': 'carol'})
            item.set_secret(secret + b'\\x00more')
            again = secretstorage.Item(conn, item.item_path, session=session)
            assert again.get_label() == 'Second label'
            assert again.get_attributes() == {'app': 'ss-' + sys.argv[1], 'user': 'carol'}
            assert again.get_secret() == secret + b'\\x00more'
            assert list(coll.search_items({'user': 'alice', 'app': 'ss-' + sys.argv[1]})) == []
            assert again.get_created() > 1600000000 and again.get_modified() >= again.get_created()
            item.delete()
            assert list(coll.search_items({'app': 'ss-' + sys.argv[1]})) == []
            print('ok', coll.collection_path)
            """, input: [0, 7] + Array("pässword".utf8), [session])
        #expect(out == "ok /org/freedesktop/secrets/aliases/default\n" || out == "ok /org/freedesktop/secrets/collection/login\n", "\(out)")
    }

    @Test func secretstorageMakesACollectionAndFindsItsItemsAfterARestart() throws {
        _ = try bus.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.create_collection(conn, 'Work Things')
            assert coll.get_label() == 'Work Things'
            coll.create_item('w', {'k': 'v'}, b'work secret')
            coll.set_label('Renamed')
            print(coll.collection_path)
            """)
        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to exit on SIGTERM") { bus.providerPIDs().isEmpty }
        let out = try bus.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            labels = sorted(c.get_label() for c in secretstorage.get_all_collections(conn))
            assert labels == ['Login', 'Renamed', 'Session'], labels
            [item] = secretstorage.search_items(conn, {'k': 'v'})
            print(item.get_secret().decode())
            """)
        #expect(out == "work secret\n")
    }

    @Test func keyringSetsGetsAndDeletesForTwoUsersOfOneService() throws {
        let out = try bus.python("""
            import sys, keyring
            from keyring.backends import SecretService
            keyring.set_keyring(SecretService.Keyring())
            a, b = sys.stdin.read().split('\\n')
            keyring.set_password('git.example.org', 'alice', a)
            keyring.set_password('git.example.org', 'bob', b)
            assert keyring.get_password('git.example.org', 'alice') == a
            assert keyring.get_password('git.example.org', 'bob') == b
            keyring.set_password('git.example.org', 'alice', a + '2')
            assert keyring.get_password('git.example.org', 'alice') == a + '2'
            keyring.delete_password('git.example.org', 'alice')
            assert keyring.get_password('git.example.org', 'alice') is None
            assert keyring.get_password('git.example.org', 'bob') == b
            print('ok')
            """, input: Array("alice-pw\nbob-pw".utf8))
        #expect(out == "ok\n")
    }

    @Test func libsecretsPasswordAPIStoresLooksUpAndClearsWithASchema() throws {
        let out = try bus.python("""
            import sys, gi
            gi.require_version('Secret', '1')
            from gi.repository import Secret
            schema = Secret.Schema.new('org.example.Password', Secret.SchemaFlags.NONE,
                                       {'user': Secret.SchemaAttributeType.STRING, 'port': Secret.SchemaAttributeType.INTEGER})
            pw = sys.stdin.read()
            assert Secret.password_store_sync(schema, {'user': 'alice', 'port': '22'}, Secret.COLLECTION_DEFAULT, 'ssh', pw, None)
            assert Secret.password_lookup_sync(schema, {'user': 'alice', 'port': '22'}, None) == pw
            # xdg:schema is an ordinary attribute: another schema with the same attributes finds nothing.
            other = Secret.Schema.new('org.example.Other', Secret.SchemaFlags.NONE, {'user': Secret.SchemaAttributeType.STRING})
            assert Secret.password_lookup_sync(other, {'user': 'alice'}, None) is None
            assert Secret.password_clear_sync(schema, {'user': 'alice', 'port': '22'}, None)
            assert Secret.password_lookup_sync(schema, {'user': 'alice', 'port': '22'}, None) is None
            print('ok')
            """, input: Array("gi-secret".utf8))
        #expect(out == "ok\n")
    }
}
