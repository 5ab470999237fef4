internal import CSQLite
import KeychainBasics
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The keychain's durable store: one SQLite database, `keychain.db`, in a
/// private directory. Safe to share between threads, and between processes
/// using the same directory.
///
/// Reads go through their own connection, so they never wait for a writer
/// (WAL lets readers and one writer run together); writes are serialised by
/// SQLite's write lock, taken up front by `BEGIN IMMEDIATE`.
public final class Store: @unchecked Sendable {
    public let directory: String
    public let databasePath: String
    /// The store's identity as `keychain.id` holds it: 32 hex digits and a newline.
    public private(set) var identity: [UInt8] = []

    private let reader: Connection
    private let readLock = Mutex(())
    private let writer: Connection
    private let writeLock = Mutex(())
    /// The thread running a `write` body (0 when none): a `write` inside it fails with an error
    /// instead of waiting for itself.
    private let writingThread = Atomic<UInt>(0)

    /// The file beside `keychain.db` that records the store's identity outside the database.
    public static let identityFileName = "keychain.id"
    /// The database in the store's directory.
    public static let databaseFileName = "keychain.db"
    static let identityMeta = "store.id"

    /// Opens (or creates) the store in `directory`.
    ///
    /// The store's identity, a random 16 bytes, is kept twice: in the database's meta and in
    /// `keychain.id` beside it. A database that is missing or empty while `keychain.id` exists (or
    /// while `initializedBecause` says why the directory was initialised), or one whose identity is
    /// not the recorded one, is refused with `.notThisStore`: it would read as an empty keychain.
    ///
    /// - Important: a database replaced by an older copy of the same store is not detected.
    public convenience init(directory: String, initializedBecause evidence: String? = nil) throws(StoreError) {
        try self.init(directory: directory, busy: .standard, initializedBecause: evidence)
    }

    init(directory: String, busy: BusyPolicy, initializedBecause evidence: String? = nil) throws(StoreError) {
        self.directory = directory
        let base = directory.hasSuffix("/") ? directory : directory + "/"
        databasePath = base + Store.databaseFileName
        let identityPath = base + Store.identityFileName

        try FileSystem.preparePrivateDirectory(directory, what: "store directory")
        let recorded = try FileSystem.readPrivateFile(identityPath, what: "the store's identity")
        // Before SQLite creates a fresh database in its place.
        let size = FileSystem.size(of: databasePath)
        if (size ?? 0) == 0 {
            let state = size == nil ? "is missing" : "is empty (0 bytes)"
            if recorded != nil {
                throw Store.notThisStore(databasePath, state, because: "\(identityPath) records this store's identity")
            }
            if let evidence { throw Store.notThisStore(databasePath, state, because: evidence) }
        }
        try FileSystem.prepareDatabaseFile(databasePath)

        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX
        writer = try Connection(path: databasePath, flags: flags, busy: busy)
        // WAL survives in the file; the other settings are per connection.
        // synchronous=FULL: a commit that returned is on disk even after power loss.
        // secure_delete: deleted ciphertext is overwritten, not left in free pages.
        try writer.execute("PRAGMA journal_mode=WAL", "enabling write-ahead logging")
        try Store.configure(writer)
        // After a checkpoint the write-ahead log is cut back to this: a 16 MiB write (or the zeroed
        // pages of a large removal, secure_delete) does not keep a 16 MiB -wal for good.
        try writer.execute("PRAGMA journal_size_limit=1048576", "limiting the write-ahead log")
        if recorded != nil, try writer.userVersion() == 0 {
            throw Store.notThisStore(databasePath, "is not a keychain database",
                                     because: "\(identityPath) records this store's identity")
        }
        try Store.giveSpaceBack(writer)
        try Store.migrate(writer)
        identity = try Store.checkIdentity(writer, recorded: recorded, identityPath: identityPath)
        try FileSystem.tightenIfPresent(databasePath + "-wal")
        try FileSystem.tightenIfPresent(databasePath + "-shm")

        reader = try Connection(path: databasePath, flags: flags, busy: busy)
        try Store.configure(reader)
        // A guard against a read path ever writing through this connection.
        try reader.execute("PRAGMA query_only=ON", "configuring the read connection")
    }

    private static func notThisStore(_ database: String, _ state: String, because evidence: String) -> StoreError {
        let directory = String(database.dropLast("/keychain.db".count))
        return StoreError(
            kind: .notThisStore, path: database,
            message: "The keychain database \(database) \(state), but this store was initialised (\(evidence)): "
                + "reading on would show an empty keychain. Restore keychain.db from a backup; or, to start over "
                + "with no items, remove \(directory) (every item of this store is lost)")
    }

    /// This database's identity, made on first use; checked against `keychain.id`, which is written
    /// only once the identity is in `keychain.db` itself (checkpointed), never before.
    private static func checkIdentity(_ connection: Connection, recorded: [UInt8]?, identityPath: String)
        throws(StoreError) -> [UInt8]
    {
        var identity = try connection.meta(identityMeta)
        if identity == nil {
            // A database of an older build gets one, unless an identity was recorded for another database.
            guard recorded == nil else {
                throw notThisStore(connection.path, "has no store identity", because: "\(identityPath) records one")
            }
            try connection.begin()
            do throws(StoreError) {
                identity = try connection.meta(identityMeta)
                if identity == nil {
                    var generator = SystemRandomNumberGenerator()
                    identity = (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
                    try connection.setMeta(identityMeta, identity!)
                }
                try connection.commit()
            } catch {
                connection.rollback()
                throw error
            }
        }
        let hex = Hex.encode(identity!)
        let text = Array((hex + "\n").utf8)
        var onDisk = recorded
        if onDisk == nil, try connection.checkpoint() {
            if try FileSystem.createPrivateFile(identityPath, text, what: "the store's identity") { return text }
            onDisk = try FileSystem.readPrivateFile(identityPath, what: "the store's identity")  // another process's
        }
        if let onDisk, onDisk != text {
            let database = connection.path
            throw StoreError(
                kind: .notThisStore, path: database,
                message: "The keychain database \(database) belongs to another store (its identity is not the one in "
                    + "\(identityPath)): it was replaced or copied from elsewhere, and this store's items are not in it. "
                    + "Put this store's keychain.db back from a backup; or, to keep this database instead, remove \(identityPath)")
        }
        return text
    }

    /// Makes the database give freed pages back to the filesystem (`auto_vacuum=INCREMENTAL`,
    /// `reclaim()` after writes): a database without it (made before) is rebuilt once with VACUUM,
    /// which SQLite runs as one transaction (a kill leaves the old file or the new one).
    private static func giveSpaceBack(_ connection: Connection) throws(StoreError) {
        guard try connection.autoVacuum() != 2 else { return }
        // Takes effect at once on an empty database; an existing one needs the VACUUM.
        try connection.execute("PRAGMA auto_vacuum=INCREMENTAL", "enabling incremental vacuum")
        guard try connection.autoVacuum() != 2 else { return }
        try connection.execute("VACUUM", "rebuilding the database to give freed space back")
    }

    /// Freed pages beyond this many bytes go back to the filesystem after a write.
    static let reclaimThreshold = 1 << 20

    /// Gives the pages freed by a write back to the filesystem when they add up to more than
    /// `reclaimThreshold` (removed items, `clear`, a smaller value over a larger one): the freed pages
    /// are cut from the end of the file (incremental vacuum), then a checkpoint copies the log into
    /// `keychain.db` (truncated to its new size) and empties the log (it held the zeroed pages of
    /// `secure_delete`). It does not wait for other readers: then the log is cut at its next restart
    /// (`journal_size_limit`). Best effort: a failure leaves the pages free for the next writes.
    private static func reclaim(_ writer: Connection) {
        guard let free = try? writer.freePageBytes(), free > Store.reclaimThreshold else { return }
        try? writer.execute("PRAGMA incremental_vacuum", "giving freed pages back")
        _ = try? writer.truncatingCheckpointWithoutWaiting()
    }

    private static func configure(_ connection: Connection) throws(StoreError) {
        try connection.execute("PRAGMA synchronous=FULL", "configuring durability")
        try connection.execute("PRAGMA secure_delete=ON", "enabling secure delete")
    }

    /// Creates the schema on first use; several processes may race here, and
    /// BEGIN IMMEDIATE makes exactly one of them do it.
    private static func migrate(_ connection: Connection) throws(StoreError) {
        guard try connection.userVersion() != schemaVersion else { return }
        try connection.begin()
        do throws(StoreError) {
            let version = try connection.userVersion()
            if version == 0 {
                try connection.executeScript(schemaV1, "creating the store schema")
            }
            if version <= 1 {
                try connection.executeScript(schemaV2Upgrade, "upgrading the store schema to version 2")
            } else if version != schemaVersion {
                throw StoreError(
                    kind: .cannotOpen, path: connection.path,
                    message: "keychain database \(connection.path) has schema version \(version); "
                        + "this build understands version \(schemaVersion) only")
            }
            try connection.commit()
        } catch {
            connection.rollback()
            throw error
        }
    }

    // MARK: Reads (a consistent snapshot per call; never take the write lock)

    // The locks' bodies throw nothing: a body of that shape is what scripts/sanitizers/tsan.supp knows to
    // be under a lock when the lock is contended. Their outcome is the caller's alone (made from this
    // store's connection under the lock), so it is handed out unchecked: `R` need not be `Sendable`.
    private func read<R>(_ body: (Connection) throws(StoreError) -> R) throws(StoreError) -> R {
        try readLock.withLock { _ in
            nonisolated(unsafe) let outcome = Result { () throws(StoreError) -> R in try body(reader) }
            return outcome
        }.get()
    }

    /// A number that changes whenever the store's data may have changed since it was last read: a
    /// commit by any other connection, this process's writes included (SQLite's `data_version` of the
    /// read connection, which changes exactly when SQLite drops that connection's page cache). Equal
    /// numbers from one `Store` mean every read in between would have returned the same rows.
    public func dataVersion() throws(StoreError) -> Int64 {
        try read { c throws(StoreError) in try c.dataVersion() }
    }

    public func meta(_ name: String) throws(StoreError) -> [UInt8]? {
        try read { c throws(StoreError) in try c.meta(name) }
    }

    public func item(service: String, key: String) throws(StoreError) -> ItemRecord? {
        try read { c throws(StoreError) in try c.item(service: service, key: key) }
    }

    public func hasItem(service: String, key: String) throws(StoreError) -> Bool {
        try read { c throws(StoreError) in try c.hasItem(service: service, key: key) }
    }

    /// The service's keys, sorted by their UTF-8 bytes.
    public func keys(service: String) throws(StoreError) -> [String] {
        try read { c throws(StoreError) in try c.keys(service: service) }
    }

    /// Items of every service with exactly this protection, sorted by service then key.
    public func items(protection: String) throws(StoreError) -> [ItemRecord] {
        try read { c throws(StoreError) in try c.items(protection: protection) }
    }

    /// Every service with an item or a wrapping key, sorted.
    public func services() throws(StoreError) -> [String] {
        try read { c throws(StoreError) in try c.services() }
    }

    public func wrappingKey(service: String, protection: String) throws(StoreError) -> WrappingKeyRecord? {
        try read { c throws(StoreError) in try c.wrappingKey(service: service, protection: protection) }
    }

    /// The service's wrapping keys, sorted by protection.
    public func wrappingKeys(service: String) throws(StoreError) -> [WrappingKeyRecord] {
        try read { c throws(StoreError) in try c.wrappingKeys(service: service) }
    }

    /// Wrapping keys whose protection starts with `prefix` (case-sensitive), sorted by service then protection.
    public func wrappingKeys(whereProtectionHasPrefix prefix: String) throws(StoreError) -> [WrappingKeyRecord] {
        try read { c throws(StoreError) in try c.wrappingKeys(protectionPrefix: prefix) }
    }

    /// What the services that start with any of `prefixes` hold (one namespace's disjoint ranges;
    /// `Transaction.usage` inside a write).
    public func usage(servicePrefixes prefixes: [String]) throws(StoreError) -> StoreUsage {
        try read { c throws(StoreError) in try c.usage(servicePrefixes: prefixes) }
    }

    /// The schema version in the file (for tests and diagnostics).
    func schemaVersionOnDisk() throws(StoreError) -> Int64 {
        try read { c throws(StoreError) in try c.userVersion() }
    }

    // MARK: Writes

    /// Runs `body` in one transaction: all of its changes are committed
    /// together, or, if it throws, none are (its error is rethrown unchanged).
    /// Blocks while another thread or process is writing; only gives up, with a
    /// `.busy` StoreError, after about 30 s past SQLite's own 10 s wait.
    /// The Transaction is valid only inside `body`.
    public func write<T>(_ body: (Transaction) throws -> T) throws -> T {
        guard writingThread.load(ordering: .acquiring) != UInt(pthread_self()) else {
            throw StoreError(
                kind: .sqlite, path: databasePath,
                message: "Store.write was called inside another write on the same store (\(databasePath)); "
                    + "use the Transaction passed to the outer body instead")
        }
        return try writeLock.withLock { _ in
            writingThread.store(UInt(pthread_self()), ordering: .releasing)
            defer { writingThread.store(0, ordering: .releasing) }
            nonisolated(unsafe) let outcome = Result { () throws -> T in try Store.transact(writer, body) }
            return outcome
        }.get()
    }

    private static func transact<T>(_ writer: Connection, _ body: (Transaction) throws -> T) throws -> T {
        try writer.begin()
        let transaction = Transaction(writer)
        defer { transaction.close() }
        let result: T
        do {
            result = try body(transaction)
            try writer.commit()
        } catch {
            writer.rollback()
            throw error
        }
        reclaim(writer)
        return result
    }
}
