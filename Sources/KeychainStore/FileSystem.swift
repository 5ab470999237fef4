#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Directory and file modes: the store's secrets are only as private as its files.
enum FileSystem {
    private static let typeMask: mode_t = 0o170000
    private static let directoryType: mode_t = 0o040000
    private static let regularType: mode_t = 0o100000

    static func describe(_ code: Int32) -> String {
        String(cString: strerror(code))
    }

    private static func failure(_ kind: StoreError.Kind? = nil, _ path: String, _ what: String, _ code: Int32)
        -> StoreError
    {
        let kind = kind ?? ((code == EACCES || code == EPERM || code == EROFS) ? .permissions : .cannotOpen)
        return StoreError(kind: kind, path: path, message: "\(what) \(path): \(describe(code))", errno: code)
    }

    /// Creates `path` (and missing parents) with mode 0700, or checks that the
    /// existing one is a directory and tightens it to 0700 if it is ours.
    static func prepareDirectory(_ path: String) throws(StoreError) {
        guard !path.isEmpty else {
            throw StoreError(kind: .cannotOpen, path: path, message: "the store directory path is empty")
        }
        var info = stat()
        if stat(path, &info) != 0 {
            let code = errno
            // ENOTDIR: a parent is a file; makeDirectories names it.
            guard code == ENOENT || code == ENOTDIR else {
                throw failure(nil, path, "cannot inspect store directory", code)
            }
            try makeDirectories(path)
            // umask may have removed bits; the owner needs all three.
            if chmod(path, 0o700) != 0 {
                throw failure(.permissions, path, "cannot set mode 0700 on store directory", errno)
            }
            return
        }
        guard info.st_mode & typeMask == directoryType else {
            throw StoreError(
                kind: .cannotOpen, path: path,
                message: "store path \(path) exists but is not a directory", errno: ENOTDIR)
        }
        // Someone else's directory (e.g. a shared one set up by root) is left as it is.
        if info.st_uid == geteuid(), info.st_mode & 0o777 != 0o700 {
            if chmod(path, 0o700) != 0 {
                throw failure(.permissions, path, "cannot set mode 0700 on store directory", errno)
            }
        }
    }

    /// mkdir -p with mode 0700 for every directory we create.
    private static func makeDirectories(_ path: String) throws(StoreError) {
        var prefix = path.hasPrefix("/") ? "/" : ""
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        for (index, part) in parts.enumerated() {
            prefix += part
            if mkdir(prefix, 0o700) != 0 {
                let code = errno
                if code != EEXIST {
                    throw failure(nil, path, "cannot create store directory", code)
                }
                // An existing parent must be a directory; the final one is checked by the caller.
                var info = stat()
                if stat(prefix, &info) == 0, info.st_mode & typeMask != directoryType {
                    throw StoreError(
                        kind: .cannotOpen, path: path,
                        message: "cannot create store directory \(path): \(prefix) is not a directory",
                        errno: ENOTDIR)
                }
            }
            if index < parts.count - 1 { prefix += "/" }
        }
    }

    /// Creates the database file with mode 0600 before SQLite sees it, so it is
    /// never readable by others, even for an instant; tightens an existing one.
    ///
    /// - Important: never open and close a file that SQLite may have open in this process:
    ///   closing any descriptor of a file drops every POSIX lock the process holds on it,
    ///   and another process may then reset the WAL index under our mapping (SIGBUS).
    ///   So the file is opened only when `O_EXCL` proves it is new, and modes are set by path.
    static func prepareDatabaseFile(_ path: String) throws(StoreError) {
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        if fd >= 0 {
            close(fd)
            return
        }
        guard errno == EEXIST else { throw failure(nil, path, "cannot create keychain database", errno) }
        var info = stat()
        guard lstat(path, &info) == 0 else { throw failure(nil, path, "cannot inspect keychain database", errno) }
        guard info.st_mode & typeMask == regularType else {
            throw StoreError(
                kind: .cannotOpen, path: path, message: "keychain database \(path) is not a regular file")
        }
        try tighten(info: info, path: path)
    }

    /// SQLite gives -wal and -shm the database's mode, but files left by an older
    /// build or another tool may be looser. By path only (see `prepareDatabaseFile`).
    static func tightenIfPresent(_ path: String) throws(StoreError) {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & typeMask == regularType else { return }
        try tighten(info: info, path: path)
    }

    private static func tighten(info: stat, path: String) throws(StoreError) {
        guard info.st_uid == geteuid(), info.st_mode & 0o777 != 0o600 else { return }
        if chmod(path, 0o600) != 0 {
            throw failure(.permissions, path, "cannot set mode 0600 on", errno)
        }
    }

    static func mode(of path: String) -> mode_t? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return info.st_mode & 0o7777
    }
}
