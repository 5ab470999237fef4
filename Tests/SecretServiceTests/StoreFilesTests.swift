import Foundation
import KeychainTestThreads
import Testing

/// An attacker with the store files (docs/security.md, threat 2): another process reads every byte of
/// the store directory and its SQLite tables, and finds no attribute value, label, content type or secret.
@Suite(.serialized, .offThePool) struct StoreFilesTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        bus = try PrivateBus()
    }

    static let markers = ["attrvalue-Q7W3E9", "attrname-K2L8", "itemlabel-Z5X1C4", "ctype-P0O9I8", "secretbytes-A1S2D3F4",
                          "colllabel-M6N7", "newsecret-G5H6J7", "newattr-R4T5Y6"]

    @Test func theStoreHoldsNoAttributeValueLabelOrSecretInAnyFile() throws {
        _ = try bus.python("""
            import sys, secretstorage
            conn = secretstorage.dbus_init()
            secret = sys.stdin.buffer.read()
            c = secretstorage.get_default_collection(conn)
            item = c.create_item('itemlabel-Z5X1C4', {'attrname-K2L8': 'attrvalue-Q7W3E9', 'xdg:schema': 'org.example'}, secret,
                                 content_type='ctype-P0O9I8')
            other = secretstorage.create_collection(conn, 'colllabel-M6N7')
            other.create_item('l', {'k': 'v'}, b'x')
            # A rewrite of the secret and the attributes: the old and the new must both be absent.
            item.set_secret(b'newsecret-G5H6J7')
            item.set_attributes({'attrname-K2L8': 'attrvalue-Q7W3E9', 'other': 'newattr-R4T5Y6'})
            [found] = c.search_items({'other': 'newattr-R4T5Y6'})
            assert found.get_secret() == b'newsecret-G5H6J7'
            """, input: Array("secretbytes-A1S2D3F4".utf8))
        // Every file of the store directory as it is on disk now (the WAL too), while the provider runs …
        try expectNoMarker(in: bus.store)
        // … and after it checkpointed and closed the database.
        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to exit on SIGTERM") { bus.providerPIDs().isEmpty }
        try expectNoMarker(in: bus.store)
        // What a search needs is there: the keyed hashes, in the keychain items' labels.
        let labels = try bus.python("""
            import sqlite3, sys
            db = sqlite3.connect('file:' + sys.argv[1] + '/keychain.db?mode=ro', uri=True)
            for service, key, label in db.execute("select service, key, label from items where service like 'org.freedesktop.secrets/%'"):
                print(service, key, label)
            """, [bus.store])
        #expect(labels.contains("org.freedesktop.secrets/login i"), "\(labels)")
        #expect(labels.contains(" h1:"), "\(labels)")
    }

    func expectNoMarker(in directory: String) throws {
        let files = try FileManager.default.subpathsOfDirectory(atPath: directory).filter { !$0.hasPrefix("swtpm") }
        #expect(files.contains("keychain.db"))
        for file in files {
            guard let data = FileManager.default.contents(atPath: directory + "/" + file) else { continue }
            for marker in Self.markers {
                #expect(data.range(of: Data(marker.utf8)) == nil, "\(marker) is readable in \(file)")
                // SQLite may keep text in UTF-16 nowhere here, but a rewrite must not leave the old bytes either.
                #expect(data.range(of: Data(marker.utf16.flatMap { [UInt8($0 & 0xFF), UInt8($0 >> 8)] })) == nil, "\(marker) (UTF-16) in \(file)")
            }
        }
    }
}
