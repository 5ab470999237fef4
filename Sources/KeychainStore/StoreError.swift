import KeychainBasics
/// A failure of the store, with enough detail for a person to act on it.
public struct StoreError: Error, Sendable, CustomStringConvertible {
    public enum Kind: String, Sendable, Equatable {
        /// The directory or database could not be created or opened.
        case cannotOpen
        /// A file or directory has modes or an owner that stop us, or chmod failed.
        case permissions
        /// Any other SQLite failure.
        case sqlite
        /// The database file is damaged or is not an SQLite database.
        case corrupt
        /// Other processes held the store's lock for longer than we wait.
        case busy
        /// A directory or file the store would trust may have been written by someone else: another
        /// user's, writable by group or others, or a symbolic link. Nothing was written.
        case untrusted
        /// `keychain.db` is not this store's: missing or empty although the directory was
        /// initialised, or another store's database. Reading it would show an empty keychain.
        case notThisStore
        /// An item's service, key or label is out of `ItemNames`' bounds. Nothing was written.
        case invalidName
    }

    public let kind: Kind
    /// Primary SQLite result code (e.g. 11 for SQLITE_CORRUPT), when SQLite reported the failure.
    public let sqliteCode: Int32?
    /// Extended SQLite result code, when SQLite reported the failure.
    public let sqliteExtendedCode: Int32?
    /// The system errno, when a system call failed.
    public let errno: Int32?
    /// The file or directory concerned.
    public let path: String
    /// What went wrong, in words, e.g. "cannot create store directory /x: Permission denied".
    public let message: String

    public init(
        kind: Kind, path: String, message: String,
        sqliteCode: Int32? = nil, sqliteExtendedCode: Int32? = nil, errno: Int32? = nil
    ) {
        self.kind = kind
        self.path = path
        self.message = message
        self.sqliteCode = sqliteCode
        self.sqliteExtendedCode = sqliteExtendedCode
        self.errno = errno
    }

    public var description: String { message }
}
