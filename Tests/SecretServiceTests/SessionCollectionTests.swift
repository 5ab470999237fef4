import Foundation
import KeychainTestThreads
import Testing

/// libsecret's `session` collection (`SECRET_COLLECTION_SESSION`, the alias
/// `/org/freedesktop/secrets/aliases/session`): its items live in the provider's memory and are gone
/// when the provider restarts. Secrets reach the scripts on stdin, never in argv.
@Suite(.serialized, .offThePool) struct SessionCollectionTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "gi", package: "python3-gi")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        bus = try PrivateBus()
    }

    static let lookup = """
        import sys, gi
        gi.require_version('Secret', '1')
        from gi.repository import Secret
        schema = Secret.Schema.new('org.example.SessionOnly', Secret.SchemaFlags.NONE, {'tab': Secret.SchemaAttributeType.STRING})
        if sys.argv[1] == 'store':
            pw = sys.stdin.read()
            assert Secret.password_store_sync(schema, {'tab': '7'}, Secret.COLLECTION_SESSION, 'for this session', pw, None)
            assert Secret.password_lookup_sync(schema, {'tab': '7'}, None) == pw
        found = Secret.password_lookup_sync(schema, {'tab': '7'}, None)
        print('none' if found is None else 'found ' + found)

        """

    @Test func libsecretsSessionCollectionKeepsItsItemsUntilTheProviderRestarts() throws {
        #expect(try bus.python(Self.lookup, input: Array("session-pw".utf8), ["store"]) == "found session-pw\n")
        // The alias names the in-memory collection, which holds the item; the alias cannot be moved.
        let where_ = try bus.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.get_collection_by_alias(conn, 'session')
            print(coll.collection_path, [i.get_label() for i in coll.get_all_items()])
            from secretstorage.util import DBusAddressWrapper
            svc = DBusAddressWrapper('/org/freedesktop/secrets', 'org.freedesktop.Secret.Service', conn)
            try:
                svc.call('SetAlias', 'so', 'session', '/org/freedesktop/secrets/collection/login')
                print('moved')
            except Exception as e:
                print('refused', 'InvalidArgs' in str(e))
            """)
        #expect(where_ == "/org/freedesktop/secrets/collection/session ['for this session']\nrefused True\n", "\(where_)")

        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to exit on SIGTERM") { bus.providerPIDs().isEmpty }
        // Activated again on the same store: nothing of the session collection was written to it.
        #expect(try bus.python(Self.lookup, ["lookup"]) == "none\n")
        #expect(!bus.providerPIDs().isEmpty, "the lookup activated the provider again")
    }
}
