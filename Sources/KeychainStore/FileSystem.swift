#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import KeychainBasics

/// Directory and file modes: the store's secrets are only as private as its files.
///
/// The one place that decides whether a directory the keychain keeps secrets in (the store, the
/// fingerprint reader's, the embedded TPM's state) can be trusted, as OpenSSH's StrictModes does:
/// the directory and every entry in it are the caller's and writable by no one else, no entry is a
/// symbolic link, and no one but root and the caller can replace any directory above it.
public enum FileSystem {
    private static let typeMask: mode_t = 0o170000
    private static let directoryType: mode_t = 0o040000
    private static let regularType: mode_t = 0o100000
    private static let symlinkType: mode_t = 0o120000
    private static let groupOrOtherWrite: mode_t = 0o022
    private static let sticky: mode_t = 0o1000

    static func describe(_ code: Int32) -> String {
        String(cString: strerror(code))
    }

    private static func failure(_ kind: StoreError.Kind? = nil, _ path: String, _ what: String, _ code: Int32)
        -> StoreError
    {
        let kind = kind ?? ((code == EACCES || code == EPERM || code == EROFS) ? .permissions : .cannotOpen)
        return StoreError(kind: kind, path: path, message: "\(what) \(path): \(describe(code))", errno: code)
    }

    private static func untrusted(_ path: String, _ message: String) -> StoreError {
        StoreError(kind: .untrusted, path: path, message: message)
    }

    private static func octal(_ mode: mode_t) -> String {
        let text = String(mode & 0o7777, radix: 8)
        return String(repeating: "0", count: max(0, 4 - text.count)) + text
    }

    // MARK: Private directories

    /// Creates `path` (and missing parents) with mode 0700, or checks that the existing one can be
    /// trusted and tightens it to 0700; then checks every entry in it. `what` names it in messages
    /// ("store directory").
    ///
    /// - Throws: `.untrusted` when the directory, an entry in it or a directory above it is another
    ///   user's, writable by group or others, or (for entries) a symbolic link; nothing is written then.
    public static func preparePrivateDirectory(_ path: String, what: String) throws(StoreError) {
        guard !path.isEmpty else {
            throw StoreError(kind: .cannotOpen, path: path, message: "the \(what) path is empty")
        }
        var info = stat()
        if stat(path, &info) != 0 {
            let code = errno
            // ENOTDIR: a parent is a file; makeDirectories names it.
            guard code == ENOENT || code == ENOTDIR else {
                throw failure(nil, path, "cannot inspect \(what)", code)
            }
            // Never create inside a directory that someone else could swap under us.
            try checkAncestors(of: path, what: what, existingOnly: true)
            try makeDirectories(path, what: what)
            // umask may have removed bits; the owner needs all three.
            if chmod(path, 0o700) != 0 {
                throw failure(.permissions, path, "cannot set mode 0700 on \(what)", errno)
            }
        }
        try checkPrivateDirectory(path, what: what)
    }

    /// Checks an existing directory (see `preparePrivateDirectory`) without creating it.
    /// - Returns: false when there is no such directory.
    public static func checkPrivateDirectoryIfPresent(_ path: String, what: String) throws(StoreError) -> Bool {
        var info = stat()
        guard lstat(path, &info) == 0 else {
            guard errno == ENOENT else { throw failure(nil, path, "cannot inspect \(what)", errno) }
            return false
        }
        try checkPrivateDirectory(path, what: what)
        return true
    }

    private static func checkPrivateDirectory(_ path: String, what: String) throws(StoreError) {
        try checkAncestors(of: path, what: what, existingOnly: false)
        var info = stat()
        guard stat(path, &info) == 0 else { throw failure(nil, path, "cannot inspect \(what)", errno) }
        guard info.st_mode & typeMask == directoryType else {
            throw StoreError(
                kind: .cannotOpen, path: path,
                message: "\(what) \(path) exists but is not a directory", errno: ENOTDIR)
        }
        guard info.st_uid == geteuid() else {
            throw untrusted(path, "The \(what) \(path) belongs to uid \(info.st_uid), not to this user (uid \(geteuid())): "
                + "its owner can read and replace what the keychain keeps there. Remove it, or check its contents "
                + "and make it this user's: chown -R \(geteuid()) \(path) && chmod 0700 \(path)")
        }
        guard info.st_mode & groupOrOtherWrite == 0 else {
            throw untrusted(path, "The \(what) \(path) is writable by group or others (mode \(octal(info.st_mode))): "
                + "anyone could have planted or replaced files in it. Remove it, or check its contents "
                + "and chmod 0700 \(path)")
        }
        // Only our own directory is tightened: readable by others is not yet a planted file.
        if info.st_mode & 0o777 != 0o700, chmod(path, 0o700) != 0 {
            throw failure(.permissions, path, "cannot set mode 0700 on \(what)", errno)
        }
        try checkEntries(of: path, what: what)
    }

    /// Every entry must be the caller's, not a symbolic link, and (files, directories) writable by
    /// no one else. Sockets and FIFOs are only reachable through this 0700 directory.
    private static func checkEntries(of path: String, what: String) throws(StoreError) {
        guard let dir = opendir(path) else { throw failure(nil, path, "cannot list \(what)", errno) }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
            }
            if name == "." || name == ".." { continue }
            try checkEntry(path + "/" + name, what: what)
        }
    }

    private static func checkEntry(_ file: String, what: String) throws(StoreError) {
        var info = stat()
        guard lstat(file, &info) == 0 else {
            if errno == ENOENT { return }  // removed meanwhile (another process's temporary file)
            throw failure(nil, file, "cannot inspect", errno)
        }
        let type = info.st_mode & typeMask
        guard type != symlinkType else {
            throw untrusted(file, "\(file) in the \(what) is a symbolic link: the keychain never follows one there. "
                + "Remove it (rm \(file))")
        }
        guard info.st_uid == geteuid() else {
            throw untrusted(file, "\(file) in the \(what) belongs to uid \(info.st_uid), not to this user "
                + "(uid \(geteuid())): someone else put it there. Remove it (rm -r \(file))")
        }
        if type == regularType || type == directoryType, info.st_mode & groupOrOtherWrite != 0 {
            throw untrusted(file, "\(file) in the \(what) is writable by group or others (mode \(octal(info.st_mode))). "
                + "Remove it, or check it and chmod go-w \(file)")
        }
    }

    /// Each directory above `path` (as written, and after resolving symbolic links) must be root's
    /// or the caller's, and not writable by group or others unless sticky (as /tmp: there only an
    /// entry's owner may rename it); a symbolic link on the way must be root's or the caller's.
    private static func checkAncestors(of path: String, what: String, existingOnly: Bool) throws(StoreError) {
        try checkChain(absolute(path), of: path, what: what, existingOnly: existingOnly)
        var resolved = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        if realpath(path, &resolved) != nil {
            let real = String(decoding: resolved.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            try checkChain(real, of: path, what: what, existingOnly: existingOnly)
        }
    }

    private static func checkChain(_ absolutePath: String, of path: String, what: String, existingOnly: Bool)
        throws(StoreError)
    {
        let parts = absolutePath.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        var prefix = ""
        for index in 0..<parts.count {  // "/" first, then each directory above the last component
            let directory = prefix.isEmpty ? "/" : prefix
            var info = stat()
            if lstat(directory, &info) != 0 {
                if existingOnly && errno == ENOENT { return }
                throw failure(nil, directory, "cannot inspect a directory above the \(what)", errno)
            }
            try checkAncestor(directory, info, of: path, what: what)
            if info.st_mode & typeMask == symlinkType {
                // The link's target is checked as a directory too.
                guard stat(directory, &info) == 0 else { throw failure(nil, directory, "cannot inspect", errno) }
                try checkAncestor(directory, info, of: path, what: what)
            }
            prefix += "/" + parts[index]
        }
        // The last component itself may be a link (checked here); the directory it names is checked by the caller.
        var info = stat()
        if lstat(prefix, &info) == 0, info.st_mode & typeMask == symlinkType {
            try checkAncestor(prefix, info, of: path, what: what)
        }
    }

    private static func checkAncestor(_ directory: String, _ info: stat, of path: String, what: String)
        throws(StoreError)
    {
        let me = geteuid()
        guard info.st_uid == 0 || info.st_uid == me else {
            throw untrusted(path, "\(directory), on the way to the \(what) \(path), belongs to uid \(info.st_uid), "
                + "neither root nor this user (uid \(me)): its owner could replace the \(what). "
                + "Keep the \(what) in a directory of your own (chown it, or choose another path)")
        }
        let writable = info.st_mode & typeMask != symlinkType && info.st_mode & groupOrOtherWrite != 0
        guard !writable || info.st_mode & sticky != 0 else {
            throw untrusted(path, "\(directory), on the way to the \(what) \(path), is writable by group or others "
                + "(mode \(octal(info.st_mode))) and not sticky: anyone could replace the \(what). "
                + "chmod go-w \(directory), or choose another path")
        }
    }

    private static func absolute(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return path }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) + "/" + path
    }

    /// mkdir -p with mode 0700 for every directory we create.
    private static func makeDirectories(_ path: String, what: String) throws(StoreError) {
        var prefix = path.hasPrefix("/") ? "/" : ""
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        for (index, part) in parts.enumerated() {
            prefix += part
            if mkdir(prefix, 0o700) != 0 {
                let code = errno
                if code != EEXIST {
                    throw failure(nil, path, "cannot create \(what)", code)
                }
                // An existing parent must be a directory; the final one is checked by the caller.
                var info = stat()
                if stat(prefix, &info) == 0, info.st_mode & typeMask != directoryType {
                    throw StoreError(
                        kind: .cannotOpen, path: path,
                        message: "cannot create \(what) \(path): \(prefix) is not a directory",
                        errno: ENOTDIR)
                }
            }
            if index < parts.count - 1 { prefix += "/" }
        }
    }

    // MARK: Private files

    /// The contents of a file in a checked private directory, or nil when it does not exist. Opened
    /// with O_NOFOLLOW, and refused unless it is a regular file of the caller's that no one else may write.
    public static func readPrivateFile(_ path: String, what: String) throws(StoreError) -> [UInt8]? {
        // O_NONBLOCK: a FIFO planted under that name must not hang the open (fstat then refuses it).
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT { return nil }
            if code == ELOOP {
                throw untrusted(path, "\(path) (\(what)) is a symbolic link: the keychain never follows one there. "
                    + "Remove it (rm \(path))")
            }
            throw failure(nil, path, "cannot open \(what)", code)
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw failure(nil, path, "cannot inspect \(what)", errno) }
        guard info.st_mode & typeMask == regularType else {
            throw StoreError(kind: .cannotOpen, path: path, message: "\(what) \(path) is not a regular file")
        }
        guard info.st_uid == geteuid(), info.st_mode & groupOrOtherWrite == 0 else {
            throw untrusted(path, "\(path) (\(what)) belongs to uid \(info.st_uid) with mode \(octal(info.st_mode)): "
                + "only this user (uid \(geteuid())) may have written it. Remove it (rm \(path))")
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count: Int
            switch valueOrErrno({ chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) } }) {
            case .success(let n): count = n
            case .failure(let code): throw failure(nil, path, "cannot read \(what)", code.rawValue)
            }
            if count == 0 { return bytes }
            bytes += chunk[0..<count]
        }
    }

    /// Creates a file with mode 0600 and `bytes`, durably (fsync of the file and its directory).
    /// - Returns: false when the file already exists (nothing written).
    public static func createPrivateFile(_ path: String, _ bytes: [UInt8], what: String) throws(StoreError) -> Bool {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            if errno == EEXIST { return false }
            throw failure(nil, path, "cannot create \(what)", errno)
        }
        var written = 0
        while written < bytes.count {
            let result = valueOrErrno { bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } }
            guard case .success(let count) = result, count > 0 else {
                let code = if case .failure(let failed) = result { failed.rawValue } else { errno }
                close(fd)
                unlink(path)
                throw failure(nil, path, "cannot write \(what)", code)
            }
            written += count
        }
        let synced = fsync(fd) == 0
        let code = errno
        close(fd)
        guard synced else {
            unlink(path)
            throw failure(nil, path, "cannot write \(what)", code)
        }
        let parent = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        let dirFD = open(parent.isEmpty ? "." : parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD >= 0 {
            fsync(dirFD)
            close(dirFD)
        }
        return true
    }

    // MARK: The database file

    /// Creates the database file with mode 0600 before SQLite sees it, so it is
    /// never readable by others, even for an instant; tightens an existing one.
    ///
    /// - Important: never open and close a file that SQLite may have open in this process:
    ///   closing any descriptor of a file drops every POSIX lock the process holds on it,
    ///   and another process may then reset the WAL index under our mapping (SIGBUS).
    ///   So the file is opened only when `O_EXCL` proves it is new, and modes are set by path.
    static func prepareDatabaseFile(_ path: String) throws(StoreError) {
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
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

    /// The size of a regular file, nil when there is none (a symbolic link is refused by the directory check).
    static func size(of path: String) -> Int? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        return Int(info.st_size)
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
