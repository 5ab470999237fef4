internal import CSQLite

/// Schema version 1, created in one transaction. WITHOUT ROWID: every lookup is
/// by primary key, so this saves the second B-tree search per read.
let schemaVersion: Int64 = 2
let schemaV1 = """
    CREATE TABLE meta(
        name TEXT PRIMARY KEY,
        value BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE wrapping_keys(
        service TEXT NOT NULL,
        protection TEXT NOT NULL,
        public_key BLOB NOT NULL,
        sealed_public BLOB NOT NULL,
        sealed_private BLOB NOT NULL,
        policy BLOB NOT NULL,
        created INTEGER NOT NULL,
        PRIMARY KEY(service, protection)
    ) WITHOUT ROWID;
    CREATE TABLE items(
        service TEXT NOT NULL,
        key TEXT NOT NULL,
        protection TEXT NOT NULL,
        label TEXT,
        created INTEGER NOT NULL,
        modified INTEGER NOT NULL,
        writer_public BLOB NOT NULL,
        salt BLOB NOT NULL,
        nonce BLOB NOT NULL,
        ciphertext BLOB NOT NULL,
        PRIMARY KEY(service, key)
    ) WITHOUT ROWID;
    -- Resetting a protection level touches every item that uses it.
    CREATE INDEX items_by_protection ON items(protection);
    PRAGMA user_version = 1;
    """

/// Version 2: a wrapping key says which backend holds it (`WrappingKeyRecord.Backend`); a token's
/// part of it moves out of `sealed_private` (which keeps only a TPM's part) into `token_sealed`.
/// Version 1 marked token keys by their policy, the text "pkcs11-user-pin".
let schemaV2Upgrade = """
    ALTER TABLE wrapping_keys ADD COLUMN backend TEXT NOT NULL DEFAULT 'tpm';
    ALTER TABLE wrapping_keys ADD COLUMN token_format INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE wrapping_keys ADD COLUMN token TEXT;
    ALTER TABLE wrapping_keys ADD COLUMN token_sealed BLOB NOT NULL DEFAULT x'';
    UPDATE wrapping_keys SET backend = 'token', token_format = 1, token_sealed = sealed_private,
        sealed_private = x'', policy = x''
        WHERE policy = CAST('pkcs11-user-pin' AS BLOB);
    PRAGMA user_version = 2;
    """

/// The SQL behind both Store (on its read connection) and Transaction (on the
/// write connection). Callers hold the connection's lock.
extension Connection {
    // MARK: Reading rows

    private func itemRecord(_ row: Statement) -> ItemRecord {
        ItemRecord(
            service: row.text(0), key: row.text(1), protection: row.text(2), label: row.optionalText(3),
            created: row.int64(4), modified: row.int64(5),
            writerPublic: row.blob(6), salt: row.blob(7), nonce: row.blob(8), ciphertext: row.blob(9))
    }

    private func wrappingKeyRecord(_ row: Statement) -> WrappingKeyRecord {
        WrappingKeyRecord(
            service: row.text(0), protection: row.text(1), publicKey: row.blob(2),
            sealedPublic: row.blob(3), sealedPrivate: row.blob(4), policy: row.blob(5), created: row.int64(6),
            backend: WrappingKeyRecord.Backend(rawValue: row.text(7)) ?? .unknown, tokenFormat: row.int64(8),
            token: row.optionalText(9), tokenSealed: row.blob(10))
    }

    // MARK: Meta

    func meta(_ name: String) throws(StoreError) -> [UInt8]? {
        try row("SELECT value FROM meta WHERE name = ?1", "reading meta \(name)", name) { $0.blob(0) }
    }

    func setMeta(_ name: String, _ value: [UInt8]) throws(StoreError) {
        _ = try change("INSERT OR REPLACE INTO meta(name, value) VALUES(?1, ?2)", "writing meta \(name)", name, value)
    }

    func deleteMeta(_ name: String) throws(StoreError) -> Bool {
        try change("DELETE FROM meta WHERE name = ?1", "deleting meta \(name)", name) > 0
    }

    // MARK: Items

    func item(service: String, key: String) throws(StoreError) -> ItemRecord? {
        try row("""
            SELECT service, key, protection, label, created, modified, writer_public, salt, nonce, ciphertext
            FROM items WHERE service = ?1 AND key = ?2
            """, "reading an item", service, key, read: itemRecord)
    }

    func hasItem(service: String, key: String) throws(StoreError) -> Bool {
        try row("SELECT 1 FROM items WHERE service = ?1 AND key = ?2", "looking up an item", service, key) { _ in } != nil
    }

    func keys(service: String) throws(StoreError) -> [String] {
        try rows("SELECT key FROM items WHERE service = ?1 ORDER BY key", "listing keys", service) { $0.text(0) }
    }

    func items(protection: String) throws(StoreError) -> [ItemRecord] {
        try rows("""
            SELECT service, key, protection, label, created, modified, writer_public, salt, nonce, ciphertext
            FROM items WHERE protection = ?1 ORDER BY service, key
            """, "listing items", protection, read: itemRecord)
    }

    func itemCount(service: String, protection: String) throws(StoreError) -> Int {
        try row(
            "SELECT count(*) FROM items WHERE service = ?1 AND protection = ?2", "counting items", service, protection
        ) { Int($0.int64(0)) } ?? 0
    }

    func services() throws(StoreError) -> [String] {
        try rows("SELECT service FROM items UNION SELECT service FROM wrapping_keys ORDER BY 1", "listing services") {
            $0.text(0)
        }
    }

    func putItem(_ r: ItemRecord) throws(StoreError) {
        _ = try change("""
            INSERT OR REPLACE INTO items(
                service, key, protection, label, created, modified, writer_public, salt, nonce, ciphertext)
            VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
            """, "writing an item",
            r.service, r.key, r.protection, r.label, r.created, r.modified, r.writerPublic, r.salt, r.nonce, r.ciphertext)
    }

    func deleteItem(service: String, key: String) throws(StoreError) -> Bool {
        try change("DELETE FROM items WHERE service = ?1 AND key = ?2", "deleting an item", service, key) > 0
    }

    func deleteItems(service: String) throws(StoreError) -> Int {
        try change("DELETE FROM items WHERE service = ?1", "deleting a service's items", service)
    }

    func deleteItems(protection: String) throws(StoreError) -> Int {
        try change("DELETE FROM items WHERE protection = ?1", "deleting items by protection", protection)
    }

    // MARK: Wrapping keys

    func wrappingKey(service: String, protection: String) throws(StoreError) -> WrappingKeyRecord? {
        try row("""
            SELECT service, protection, public_key, sealed_public, sealed_private, policy, created, backend, token_format, token, token_sealed
            FROM wrapping_keys WHERE service = ?1 AND protection = ?2
            """, "reading a wrapping key", service, protection, read: wrappingKeyRecord)
    }

    func wrappingKeys(service: String) throws(StoreError) -> [WrappingKeyRecord] {
        try rows("""
            SELECT service, protection, public_key, sealed_public, sealed_private, policy, created, backend, token_format, token, token_sealed
            FROM wrapping_keys WHERE service = ?1 ORDER BY protection
            """, "listing wrapping keys", service, read: wrappingKeyRecord)
    }

    func wrappingKeys(protectionPrefix prefix: String) throws(StoreError) -> [WrappingKeyRecord] {
        // substr/length count characters alike, so this is an exact prefix test
        // with no LIKE wildcards or case folding to escape.
        try rows("""
            SELECT service, protection, public_key, sealed_public, sealed_private, policy, created, backend, token_format, token, token_sealed
            FROM wrapping_keys WHERE substr(protection, 1, length(?1)) = ?1 ORDER BY service, protection
            """, "listing wrapping keys", prefix, read: wrappingKeyRecord)
    }

    func putWrappingKey(_ r: WrappingKeyRecord) throws(StoreError) {
        _ = try change("""
            INSERT OR REPLACE INTO wrapping_keys(
                service, protection, public_key, sealed_public, sealed_private, policy, created,
                backend, token_format, token, token_sealed)
            VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
            """, "writing a wrapping key",
            r.service, r.protection, r.publicKey, r.sealedPublic, r.sealedPrivate, r.policy, r.created,
            r.backend.rawValue, r.tokenFormat, r.token, r.tokenSealed)
    }

    func deleteWrappingKey(service: String, protection: String) throws(StoreError) -> Bool {
        try change(
            "DELETE FROM wrapping_keys WHERE service = ?1 AND protection = ?2", "deleting a wrapping key", service, protection
        ) > 0
    }

    func deleteWrappingKeys(service: String) throws(StoreError) -> Int {
        try change("DELETE FROM wrapping_keys WHERE service = ?1", "deleting a service's wrapping keys", service)
    }

    func deleteWrappingKeys(protection: String) throws(StoreError) -> Int {
        try change("DELETE FROM wrapping_keys WHERE protection = ?1", "deleting wrapping keys by protection", protection)
    }

    // MARK: Usage

    /// The items and the bytes stored under services that start with any of `prefixes` (keychaind's
    /// per-uid, per-application or per-group parts), one scan as `StoreUsage.scans` counts: each item's service, key, label and sealed fields, and the
    /// services' wrapping keys. A range scan of the primary keys: `prefix` ≤ service < `prefix`
    /// with its last byte one higher (text compares as bytes).
    func usage(servicePrefixes prefixes: [String]) throws(StoreError) -> StoreUsage {
        #if DEBUG
        StoreUsage.scans.add(1, ordering: .relaxed)
        #endif
        var total = StoreUsage(items: 0, bytes: 0)
        for prefix in prefixes {
            let usage = try usage(servicePrefix: prefix)
            total.items += usage.items
            total.bytes += usage.bytes
        }
        return total
    }

    private func usage(servicePrefix prefix: String) throws(StoreError) -> StoreUsage {
        var upper = Array(prefix.utf8)
        guard let last = upper.popLast(), last < 0x7F else {
            throw StoreError(kind: .sqlite, path: path, message: "a usage prefix must end in an ASCII character, got '\(prefix)'")
        }
        upper.append(last + 1)
        let bound = String(decoding: upper, as: UTF8.self)
        let items = try row("""
            SELECT count(*), total(length(CAST(service AS BLOB)) + length(CAST(key AS BLOB)) + ifnull(length(CAST(label AS BLOB)), 0)
                + length(writer_public) + length(salt) + length(nonce) + length(ciphertext))
            FROM items WHERE service >= ?1 AND service < ?2
            """, "measuring a namespace's items", prefix, bound) { (Int($0.int64(0)), Int($0.double(1))) } ?? (0, 0)
        let keys = try row("""
            SELECT total(length(CAST(service AS BLOB)) + length(CAST(protection AS BLOB)) + length(public_key)
                + length(sealed_public) + length(sealed_private) + length(policy) + length(token_sealed))
            FROM wrapping_keys WHERE service >= ?1 AND service < ?2
            """, "measuring a namespace's wrapping keys", prefix, bound) { Int($0.double(0)) } ?? 0
        return StoreUsage(items: items.0, bytes: items.1 + keys)
    }

    // MARK: Schema

    /// SQLite's data version of this connection: it changes when another connection (of this
    /// process or another) commits, or the files changed under it, and only then.
    func dataVersion() throws(StoreError) -> Int64 {
        try withStatement("PRAGMA data_version") { (s: inout Statement) throws(StoreError) in
            _ = try s.step("reading the data version")
            return s.int64(0)
        }
    }

    func userVersion() throws(StoreError) -> Int64 {
        try withStatement("PRAGMA user_version") { (s: inout Statement) throws(StoreError) in
            _ = try s.step("reading the schema version")
            return s.int64(0)
        }
    }
}
