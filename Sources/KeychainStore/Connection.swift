internal import CSQLite

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
#if DEBUG
import Synchronization
#endif

/// How long to wait for other writers. Tests shorten it; the Store uses `standard`.
struct BusyPolicy: Sendable {
    /// SQLite's own busy handler waits this long on each attempt.
    var sqliteTimeoutMilliseconds: Int32
    /// Our retry loop keeps going this long past the first busy result.
    var retryLimit: Duration

    static let standard = BusyPolicy(sqliteTimeoutMilliseconds: 10_000, retryLimit: .seconds(30))
}

#if DEBUG
/// Test hook for crash-atomicity tests: with `KEYCHAIN_TEST_ABORT_AFTER_STORE_WRITES=N` the process
/// ends, without any cleanup as `kill -9` there would, right after its Nth store write: a statement
/// that changed the database (inside its transaction, not yet committed) or a COMMIT.
/// Debug builds only: no environment variable can end a release build.
enum StoreCrashPoint {
    private static let abortAfter: Int? = getenv("KEYCHAIN_TEST_ABORT_AFTER_STORE_WRITES")
        .flatMap { Int(String(cString: $0)) }.flatMap { $0 > 0 ? $0 : nil }
    private static let writes = Atomic<Int>(0)

    static func reached() {
        guard let abortAfter else { return }
        if writes.add(1, ordering: .relaxed).newValue == abortAfter { _exit(134) }
    }
}
#endif

/// One SQLite connection with a cache of prepared statements. Not thread-safe:
/// the Store guards each connection with its own lock.
final class Connection {
    let handle: OpaquePointer
    let path: String
    let busy: BusyPolicy
    /// Keyed by the address of the SQL literal: all our SQL is static, and an
    /// address hashes far faster than the text.
    private var statements: [UInt: OpaquePointer] = [:]

    init(path: String, flags: Int32, busy: BusyPolicy) throws(StoreError) {
        var db: OpaquePointer?
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let detail = db.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            let extended = db.map { sqlite3_extended_errcode($0) } ?? rc
            sqlite3_close_v2(db)
            throw StoreError(
                kind: Connection.kind(for: rc, default: .cannotOpen), path: path,
                message: "cannot open keychain database \(path): \(detail) (SQLite code \(extended))",
                sqliteCode: rc & 0xff, sqliteExtendedCode: extended)
        }
        handle = db
        self.path = path
        self.busy = busy
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, busy.sqliteTimeoutMilliseconds)
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(handle)
    }

    var inTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    // MARK: Errors

    static func kind(for code: Int32, default fallback: StoreError.Kind = .sqlite) -> StoreError.Kind {
        switch code & 0xff {
        case SQLITE_CORRUPT, SQLITE_NOTADB: .corrupt
        case SQLITE_BUSY, SQLITE_LOCKED: .busy
        case SQLITE_CANTOPEN: .cannotOpen
        case SQLITE_PERM, SQLITE_READONLY, SQLITE_AUTH: .permissions
        default: fallback
        }
    }

    /// A StoreError for result `code`, saying what we were doing.
    func error(_ code: Int32, _ doing: String) -> StoreError {
        // errmsg describes the connection's latest failure; fall back to the generic text otherwise.
        let detail = sqlite3_extended_errcode(handle) == code
            ? String(cString: sqlite3_errmsg(handle)) : String(cString: sqlite3_errstr(code))
        let kind = Connection.kind(for: code)
        let prefix = switch kind {
        case .corrupt: "keychain database \(path) is damaged or not a database, while \(doing)"
        case .busy: "keychain database \(path) stayed locked by another process, while \(doing)"
        default: "\(doing) failed in keychain database \(path)"
        }
        return StoreError(
            kind: kind, path: path, message: "\(prefix): \(detail) (SQLite code \(code))",
            sqliteCode: code & 0xff, sqliteExtendedCode: code)
    }

    // MARK: Statements

    private func prepared(_ sql: StaticString) throws(StoreError) -> OpaquePointer {
        let key = UInt(bitPattern: sql.utf8Start)
        if let statement = statements[key] { return statement }
        var statement: OpaquePointer?
        let rc = sql.utf8Start.withMemoryRebound(to: CChar.self, capacity: sql.utf8CodeUnitCount) { text in
            sqlite3_prepare_v3(
                handle, text, Int32(sql.utf8CodeUnitCount), UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        }
        guard rc == SQLITE_OK, let statement else {
            sqlite3_finalize(statement)
            throw error(rc, "preparing a query")
        }
        statements[key] = statement
        return statement
    }

    /// Runs `body` with the cached statement for `sql`, and always leaves it
    /// reset (so no read snapshot stays open) with bindings cleared.
    @inline(__always)
    func withStatement<R>(
        _ sql: StaticString, _ body: (inout Statement) throws(StoreError) -> R
    ) throws(StoreError) -> R {
        var statement = Statement(handle: try prepared(sql), connection: self)
        defer {
            sqlite3_reset(statement.handle)
            sqlite3_clear_bindings(statement.handle)
        }
        return try body(&statement)
    }

    /// Runs a statement that returns no rows we need, e.g. PRAGMA or DDL.
    func execute(_ sql: StaticString, _ doing: String) throws(StoreError) {
        try withStatement(sql) { (statement: inout Statement) throws(StoreError) in
            while try statement.step(doing) {}
        }
    }

    /// Runs a data-changing statement with `values` bound to ?1, ?2, … and returns how many rows it touched.
    func change(_ sql: StaticString, _ doing: String, _ values: any QueryValue...) throws(StoreError) -> Int {
        try withStatement(sql) { (statement: inout Statement) throws(StoreError) in
            try statement.bind(values)
            while try statement.step(doing) {}
            return Int(sqlite3_changes(handle))
        }
    }

    /// Runs a query with `values` bound to ?1, ?2, … and reads its first row, if there is one.
    func row<R>(
        _ sql: StaticString, _ doing: String, _ values: any QueryValue..., read: (Statement) -> R
    ) throws(StoreError) -> R? {
        try withStatement(sql) { (statement: inout Statement) throws(StoreError) in
            try statement.bind(values)
            return try statement.step(doing) ? read(statement) : nil
        }
    }

    /// Runs a query with `values` bound to ?1, ?2, … and reads every row.
    func rows<R>(
        _ sql: StaticString, _ doing: String, _ values: any QueryValue..., read: (Statement) -> R
    ) throws(StoreError) -> [R] {
        try withStatement(sql) { (statement: inout Statement) throws(StoreError) in
            try statement.bind(values)
            var rows: [R] = []
            while try statement.step(doing) { rows.append(read(statement)) }
            return rows
        }
    }

    /// Several SQL statements in one string, run in order; only for schema setup.
    func executeScript(_ sql: String, _ doing: String) throws(StoreError) {
        let rc = sqlite3_exec(handle, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw error(rc, doing) }
    }

    /// Copies the write-ahead log into the database file; true when all of it is there now
    /// (false when a reader of an older snapshot kept part of it in the log).
    func checkpoint() throws(StoreError) -> Bool {
        try withStatement("PRAGMA wal_checkpoint(FULL)") { (statement: inout Statement) throws(StoreError) -> Bool in
            guard try statement.step("checkpointing the write-ahead log") else { return false }
            // busy, frames in the log, frames checkpointed (-1, -1 when not in WAL mode).
            return statement.int64(0) == 0 && statement.int64(1) == statement.int64(2)
        }
    }

    /// Copies the log into the database and cuts the log to nothing, without waiting: while another
    /// connection reads, only what it can is copied (true when all of it was).
    func truncatingCheckpointWithoutWaiting() throws(StoreError) -> Bool {
        sqlite3_busy_timeout(handle, 0)
        defer { sqlite3_busy_timeout(handle, busy.sqliteTimeoutMilliseconds) }
        return try withStatement("PRAGMA wal_checkpoint(TRUNCATE)") { (statement: inout Statement) throws(StoreError) -> Bool in
            guard try statement.step("checkpointing the write-ahead log") else { return false }
            return statement.int64(0) == 0 && statement.int64(1) == statement.int64(2)
        }
    }

    /// 0 none, 1 full, 2 incremental (`PRAGMA auto_vacuum`).
    func autoVacuum() throws(StoreError) -> Int64 {
        try withStatement("PRAGMA auto_vacuum") { (statement: inout Statement) throws(StoreError) -> Int64 in
            _ = try statement.step("reading the vacuum mode")
            return statement.int64(0)
        }
    }

    /// The bytes of the database's free pages (on its freelist).
    func freePageBytes() throws(StoreError) -> Int {
        let pages = try withStatement("PRAGMA freelist_count") { (statement: inout Statement) throws(StoreError) -> Int64 in
            _ = try statement.step("counting free pages")
            return statement.int64(0)
        }
        let size = try withStatement("PRAGMA page_size") { (statement: inout Statement) throws(StoreError) -> Int64 in
            _ = try statement.step("reading the page size")
            return statement.int64(0)
        }
        return Int(pages * size)
    }

    // MARK: Transactions

    /// BEGIN IMMEDIATE takes the write lock now, so the body never meets a busy
    /// error half way through.
    func begin() throws(StoreError) {
        try execute("BEGIN IMMEDIATE", "starting a write transaction")
    }

    func commit() throws(StoreError) {
        try withStatement("COMMIT") { (statement: inout Statement) throws(StoreError) in
            // A busy COMMIT leaves the transaction open, so retrying it is safe.
            statement.retryBusyInTransaction = true
            while try statement.step("committing a write transaction") {}
        }
        #if DEBUG
        StoreCrashPoint.reached()
        #endif
    }

    /// Best effort: rollback only fails if the transaction is already gone.
    func rollback() {
        guard inTransaction else { return }
        _ = try? execute("ROLLBACK", "rolling back a write transaction")
        if inTransaction {
            // Should not happen; ROLLBACK with no statement pending always works.
            _ = sqlite3_exec(handle, "ROLLBACK", nil, nil, nil)
        }
    }
}

/// A prepared statement in use. Only valid inside `Connection.withStatement`.
struct Statement {
    let handle: OpaquePointer
    unowned(unsafe) let connection: Connection
    private var startedRows = false
    var retryBusyInTransaction = false

    init(handle: OpaquePointer, connection: Connection) {
        self.handle = handle
        self.connection = connection
    }

    // MARK: Binding (1-based indexes, as SQLite numbers them)

    func bind(_ index: Int32, _ value: String) throws(StoreError) {
        var text = value
        let rc = text.withUTF8 { utf8 -> Int32 in
            // A nil base address would bind NULL; an empty string must stay ''.
            let base = utf8.baseAddress.map { UnsafeRawPointer($0) } ?? emptyText
            return sqlite3_bind_text(
                handle, index, base.assumingMemoryBound(to: CChar.self), Int32(utf8.count), kc_sqlite_transient())
        }
        try check(rc)
    }

    func bind(_ index: Int32, _ value: String?) throws(StoreError) {
        guard let value else {
            try check(sqlite3_bind_null(handle, index))
            return
        }
        try bind(index, value)
    }

    func bind(_ index: Int32, _ value: [UInt8]) throws(StoreError) {
        let rc = value.withUnsafeBytes { bytes -> Int32 in
            // Zero bytes must be an empty blob, not NULL (the columns are NOT NULL).
            guard let base = bytes.baseAddress, bytes.count > 0 else {
                return sqlite3_bind_zeroblob(handle, index, 0)
            }
            return sqlite3_bind_blob(handle, index, base, Int32(bytes.count), kc_sqlite_transient())
        }
        try check(rc)
    }

    func bind(_ index: Int32, _ value: Int64) throws(StoreError) {
        try check(sqlite3_bind_int64(handle, index, value))
    }

    /// Binds `values` to ?1, ?2, … in order.
    func bind(_ values: [any QueryValue]) throws(StoreError) {
        for (offset, value) in values.enumerated() { try value.bind(to: self, at: Int32(offset + 1)) }
    }

    private func check(_ rc: Int32) throws(StoreError) {
        guard rc == SQLITE_OK else { throw connection.error(rc, "binding a query parameter") }
    }

    // MARK: Stepping

    /// True when a row is ready, false when done. Busy and locked results are
    /// retried (for `busy.retryLimit`) whenever that is safe: before the first
    /// row, and outside an explicit transaction or for COMMIT.
    mutating func step(_ doing: String) throws(StoreError) -> Bool {
        var deadline: ContinuousClock.Instant?
        while true {
            let rc = sqlite3_step(handle)
            if rc == SQLITE_ROW {
                startedRows = true
                return true
            }
            if rc == SQLITE_DONE {
                #if DEBUG
                if sqlite3_stmt_readonly(handle) == 0 { StoreCrashPoint.reached() }
                #endif
                return false
            }
            let primary = rc & 0xff
            let retryable = (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) && !startedRows
                && (retryBusyInTransaction || !connection.inTransaction)
            guard retryable else { throw connection.error(rc, doing) }
            let now = ContinuousClock.now
            if deadline == nil { deadline = now + connection.busy.retryLimit }
            guard now < deadline! else { throw connection.error(rc, doing) }
            // A busy COMMIT keeps its transaction, so running it again retries the commit.
            sqlite3_reset(handle)
            // Random back-off so competing processes do not retry in lock step.
            usleep(UInt32.random(in: 1_000...20_000))
        }
    }

    // MARK: Columns (0-based indexes)

    func text(_ column: Int32) -> String {
        guard let bytes = sqlite3_column_text(handle, column) else { return "" }
        let count = Int(sqlite3_column_bytes(handle, column))
        return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
    }

    func optionalText(_ column: Int32) -> String? {
        sqlite3_column_type(handle, column) == SQLITE_NULL ? nil : text(column)
    }

    func blob(_ column: Int32) -> [UInt8] {
        guard let bytes = sqlite3_column_blob(handle, column) else { return [] }
        let count = Int(sqlite3_column_bytes(handle, column))
        return [UInt8](UnsafeRawBufferPointer(start: bytes, count: count))
    }

    func int64(_ column: Int32) -> Int64 {
        sqlite3_column_int64(handle, column)
    }

    func double(_ column: Int32) -> Double {
        sqlite3_column_double(handle, column)
    }
}

/// A valid, never-written address for binding empty text.
nonisolated(unsafe) private let emptyText: UnsafeRawPointer = {
    let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: 1)
    pointer.initialize(to: 0)
    return UnsafeRawPointer(pointer)
}()

/// A value a query binds to one of its parameters: text (nil binds NULL), a blob or an integer.
protocol QueryValue {
    func bind(to statement: Statement, at index: Int32) throws(StoreError)
}

extension String: QueryValue {
    func bind(to statement: Statement, at index: Int32) throws(StoreError) { try statement.bind(index, self) }
}

extension Optional: QueryValue where Wrapped == String {
    func bind(to statement: Statement, at index: Int32) throws(StoreError) { try statement.bind(index, self) }
}

extension Array: QueryValue where Element == UInt8 {
    func bind(to statement: Statement, at index: Int32) throws(StoreError) { try statement.bind(index, self) }
}

extension Int64: QueryValue {
    func bind(to statement: Statement, at index: Int32) throws(StoreError) { try statement.bind(index, self) }
}
