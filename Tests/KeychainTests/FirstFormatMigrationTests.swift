import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// A store of the first format (schema 1, token items under "<service>@strongbox") is migrated on
/// open. The stores are made by the first format's own steps: SQL for its layout, and its `none`
/// token items' own data keys sealed by the token as that version sealed them.
@Suite("Stores of the first format are migrated on open", .offThePool)
struct FirstFormatMigrationTests {
    /// Turns the token rows of a store into the first format's layout, as that version wrote them:
    /// schema version 1 (no backend columns), token items and keys under "<service>@strongbox", a
    /// token key's sealed secret in sealed_private with the policy text "pkcs11-user-pin".
    static func downgradeToFirstFormat(_ path: String, extraSQL: String = "") throws {
        let sql = """
            UPDATE items SET service = service || '@strongbox' WHERE protection LIKE '%@strongbox' AND service NOT LIKE '%@strongbox';
            UPDATE wrapping_keys SET service = service || '@strongbox', sealed_private = token_sealed,
                policy = CAST('pkcs11-user-pin' AS BLOB) WHERE backend = 'token';
            ALTER TABLE wrapping_keys DROP COLUMN backend;
            ALTER TABLE wrapping_keys DROP COLUMN token_format;
            ALTER TABLE wrapping_keys DROP COLUMN token;
            ALTER TABLE wrapping_keys DROP COLUMN token_sealed;
            DELETE FROM meta WHERE name = 'items.one-namespace';
            \(extraSQL)
            PRAGMA user_version = 1;
            """
        try Self.sql(path, sql)
    }

    static let childVariable = "KEYCHAIN_TEST_FIRST_FORMAT_CHILD"

    /// Writes `none` token items as the first format did (`setOnToken`: a data key per item sealed by
    /// the service's token key, in writerPublic, no salt), under "svc@strongbox", in a child test
    /// process (SoftHSM2 takes one configuration per process).
    static func writeFirstFormatNoneItems(_ t: TokenBackendTests.Token, _ items: [String: String], modified: Int64) throws {
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let job = try JSONEncoder().encode(["store": t.store, "uri": t.uri(), "items": String(data: try JSONEncoder().encode(items), encoding: .utf8)!,
                                            "modified": String(modified)])
        let child = try run(me, ["--testing-library", "swift-testing", "--filter", "firstFormatNoneItemsAreWrittenInAChild"],
                            environment: t.env.merging([childVariable: String(data: job, encoding: .utf8)!]) { $1 })
        let output = String(decoding: child.stdout, as: UTF8.self) + child.stderr
        #expect(child.status == 0 && output.contains("Test firstFormatNoneItemsAreWrittenInAChild() passed"), "\(output)")
    }

    /// The child's side of `writeFirstFormatNoneItems`: skipped (not passed) in every other run.
    @Test(.enabled(if: ProcessInfo.processInfo.environment[FirstFormatMigrationTests.childVariable] != nil,
                   "the child process of writeFirstFormatNoneItems"))
    func firstFormatNoneItemsAreWrittenInAChild() throws {
        let text = try #require(ProcessInfo.processInfo.environment[Self.childVariable])
        let job = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: String])
        let itemsText = try #require(job["items"])
        let items = try #require(try JSONSerialization.jsonObject(with: Data(itemsText.utf8)) as? [String: String])
        #expect(!items.isEmpty)
        let session = try TokenSession(uri: job["uri"]!)
        let store = try Store(directory: job["store"]!)
        let modified = Int64(job["modified"]!)!
        for (key, value) in items {
            let tag = "afterFirstUnlock/none@strongbox"
            let dataKey = SecureBytes(random: Sodium.xchachaKeyLength)
            let sealed = try session.seal(dataKey, service: "svc@strongbox", key: key, protection: tag)
            var record = ItemRecord(service: "svc@strongbox", key: key, protection: tag, created: 1, modified: modified,
                                    writerPublic: sealed, salt: [], nonce: Sodium.randomBytes(Sodium.xchachaNonceLength), ciphertext: [])
            // The first format authenticated "svc@strongbox" as the service: the record as stored then.
            record.ciphertext = Array(value.utf8).withUnsafeBytes {
                Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(
                    ItemRecord(service: "svc", key: key, protection: tag, created: 1, modified: modified, writerPublic: sealed, salt: [],
                               nonce: record.nonce, ciphertext: [])))
            }
            try store.write { try $0.putItem(record) }
        }
        // A `passcode` item: an X25519 pair per service whose secret the token sealed (the policy
        // column said so), and the value in the envelope.
        let tag = "afterFirstUnlock/passcode/0@strongbox"
        let pair = Sodium.generateX25519()
        let sealed = try session.seal(pair.secretKey, service: "svc@strongbox", key: "", protection: tag)
        let writer = Sodium.generateX25519()
        let shared = try Sodium.x25519(writer.secretKey, pair.publicKey)
        var record = ItemRecord(service: "svc", key: "p", protection: tag, created: 1, modified: 1, writerPublic: writer.publicKey,
                                salt: Sodium.randomBytes(ItemEnvelope.saltLength), nonce: Sodium.randomBytes(Sodium.xchachaNonceLength),
                                ciphertext: [])
        let dataKey = ItemEnvelope.dataKey(shared: shared, writerPublic: writer.publicKey, wrappingPublic: pair.publicKey, salt: record.salt)
        record.ciphertext = Sodium.seal(Array("pin-guarded".utf8), key: dataKey, nonce: record.nonce,
                                        associatedData: ItemEnvelope.associatedData(record))
        record.service = "svc@strongbox"
        try store.write { tx in
            try tx.putWrappingKey(WrappingKeyRecord(service: "svc@strongbox", protection: tag, publicKey: pair.publicKey, sealedPublic: [],
                                                    sealedPrivate: sealed, policy: Array("pkcs11-user-pin".utf8), created: 1))
            try tx.putItem(record)
        }
    }

    /// Runs SQL on a store's database in another process (python3's sqlite3; CI installs python3).
    static func sql(_ store: String, _ sql: String) throws {
        let result = try run("/usr/bin/python3", ["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                                                  + "c.executescript(sys.argv[2]); c.commit()", store + "/keychain.db", sql])
        #expect(result.status == 0, "sqlite3: \(result.stderr)")
    }

    /// A store of the first format is migrated on open: its token items join their service and read
    /// as before (the PIN-guarded one too); where the TPM storage and the token storage both held a
    /// key, the one modified last stays and the other's key goes with it.
    @Test(arguments: [true, false])
    func aFirstFormatStoreIsMigratedOnOpen(tokenNewer: Bool) throws {
        let t = try TokenBackendTests.Token()
        // The first format held a TPM item and a token item of one key at once; its `none` token
        // items had their own data key, sealed by the token; its `passcode` items a token-sealed
        // X25519 pair per service (all written here as that version did).
        // Modified long after or long before the TPM item below.
        try Self.writeFirstFormatNoneItems(t, ["k": "from the token", "only": "token only"], modified: tokenNewer ? 4_000_000_000_000 : 1)
        try Self.sql(t.store, "CREATE TABLE kept AS SELECT * FROM items WHERE key = 'k'; DELETE FROM items WHERE key = 'k';")
        #expect(try t.cli(["set", "svc", "k"], input: Array("from the TPM".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "tpm-only", "--accessible", "always"], input: Array("tpm only".utf8)).status == 0)
        try Self.downgradeToFirstFormat(t.store, extraSQL: """
            INSERT INTO items SELECT service, key, protection, label, created, modified, writer_public, salt,
                nonce, ciphertext FROM kept;
            DROP TABLE kept;
            """)

        #expect(String(decoding: try t.cli(["ls", "svc"]).stdout, as: UTF8.self) == "k\nonly\np\ntpm-only\n")
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array((tokenNewer ? "from the token" : "from the TPM").utf8))
        #expect(try t.cli(["get", "svc", "only"]).stdout == Array("token only".utf8))
        #expect(try t.cli(["get", "svc", "tpm-only", "--key-storage", "strongbox"]).stdout == Array("tpm only".utf8))
        #expect(try t.cli(["get", "svc", "p", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout == Array("pin-guarded".utf8))
        let store = try Store(directory: t.store)
        #expect(try store.services() == ["svc"])
        #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/passcode/0@strongbox")?.backend == .token)
        #expect(try store.item(service: "svc", key: "k")?.protection
                == (tokenNewer ? "afterFirstUnlock/none@strongbox" : "afterFirstUnlock/none"))
        // The loser's key, which no item uses any more, is gone with it (a first-format token item's
        // own data key is in its row).
        if tokenNewer { #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/none") == nil) }
        // A new write of a lock-state level does not go under the first format's token-only key: a
        // key split with the TPM replaces it, and the items of the old key still read with it.
        #expect(try t.cli(["set", "svc", "p2", "--key-storage", "strongbox", "--access-control", "passcode"],
                          input: Array("split".utf8)).status == 0)
        #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/passcode/0@strongbox")?.tokenFormat == 2)
        #expect(try t.cli(["get", "svc", "p2", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout == Array("split".utf8))
        #expect(try t.cli(["get", "svc", "p", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout == Array("pin-guarded".utf8))
        // A write replaces a first-format item with the envelope.
        #expect(try t.cli(["set", "svc", "only", "--key-storage", "strongbox"], input: Array("rewritten".utf8)).status == 0)
        #expect(try store.item(service: "svc", key: "only")?.salt.isEmpty == false)
        #expect(try t.cli(["get", "svc", "only"]).stdout == Array("rewritten".utf8))
    }
}
