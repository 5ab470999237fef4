import KeychainCore
import Glibc
import SecureMemory
import TPM2
import KeychainBasics

/// One process's turn at a TPM that no resource manager shares out (swtpm, mssim, `/dev/tpm0`):
/// an exclusive `flock` held for a whole operation, so no other process's commands interleave and
/// the holder may flush whatever an earlier, killed process left in the TPM.
///
/// The lock file is per TPM, not per store, so stores sharing a TPM take turns too: beside the
/// embedded TPM's state, else in a directory of this user's (`$XDG_RUNTIME_DIR/keychain` or
/// `/tmp/keychain-<uid>`), named after the TCTI. It is opened `O_NOFOLLOW`, 0600, and must be a
/// regular file of ours in a directory of ours that nobody else can write to: another user's file
/// could otherwise hold us off forever. When no such directory can be had, the store's directory is
/// used (then only processes on the same store take turns).
///
/// A TPM that goes away for good (a test's software TPM) takes its lock files with it:
/// `removeLocks(of:)`.
package final class TPMTurn {
    /// How long to wait for another process's turn to end: longer than any one operation takes.
    static let maximumWait: Duration = .seconds(30)

    private let fd: Int32
    let path: String
    /// A TPM's turns are marked: each writes random bytes of its own over the lock file's first
    /// bytes when it is taken, so the next taker can tell whether anyone took a turn since the one it
    /// last ended (`Engine.withKeyring`: no leftover check then). Empty for other locks.
    private(set) var mark: [UInt8] = []
    /// The mark the lock file held when this turn was taken: the previous turn's (nil in a new file).
    private(set) var previousMark: [UInt8]?
    static let markLength = 16

    /// Takes the turn, waiting for the current holder; nil when the TPM has a resource manager.
    static func take(_ device: TPMDevice, configuration: KeychainConfiguration) throws(KeychainError) -> TPMTurn? {
        guard !device.hasResourceManager else { return nil }
        let path: String
        if case .embedded = configuration.tpm {
            path = EmbeddedTPM.directory(configuration.storeDirectory) + "/tpm.lock"
        } else {
            path = (userDirectory() ?? configuration.storeDirectory) + "/" + lockName(device)
        }
        return try TPMTurn(path: path, marked: true)
    }

    /// An exclusive flock on `path`, a private file of this user's, waited for as a turn is
    /// (the rollback counter's lock in a store's directory).
    static func take(path: String) throws(KeychainError) -> TPMTurn { try TPMTurn(path: path) }

    private init(path: String, marked: Bool = false) throws(KeychainError) {
        self.path = path
        fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw KeychainError(.storageError, "Cannot open the TPM lock \(path)", underlying: .errno(errno))
        }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid(), info.st_mode & 0o022 == 0 else {
            close(fd)
            throw KeychainError(.storageError, "The TPM lock \(path) is not a private file of this user: remove it")
        }
        // keychaind's call waits no longer than its own deadline (`CallDeadline`).
        let longest = ContinuousClock.now + Self.maximumWait
        let deadline = min(longest, CallDeadline.current?.instant ?? longest)
        var pause: UInt32 = 200
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR, ContinuousClock.now < deadline else {
                close(fd)
                let waited = deadline < longest ? "for this call's whole deadline" : "for over 30 s"
                throw KeychainError(.hardwareUnavailable,
                                    "Another process has been using the TPM \(waited) (lock \(path)): "
                                    + "wait for it to finish, or stop it")
            }
            usleep(pause)
            pause = min(pause * 2, 5_000)
        }
        guard marked else { return }
        var previous = [UInt8](repeating: 0, count: Self.markLength)
        if pread(fd, &previous, Self.markLength, 0) == Self.markLength { previousMark = previous }
        let mark = Sodium.randomBytes(Self.markLength)
        // Unmarked, this turn would pass for the one before it: a taker that ended that one would
        // skip the leftover check after a process killed in this one.
        guard pwrite(fd, mark, Self.markLength, 0) == Self.markLength else {
            let error = errno
            close(fd)
            throw KeychainError(.storageError, "Cannot write the TPM lock \(path)", underlying: .errno(error))
        }
        self.mark = mark
    }

    deinit { close(fd) }  // closing releases the flock

    /// The lock's name in a user's directory: one per TPM, after its TCTI string.
    private static func lockName(_ device: TPMDevice) -> String {
        "tpm-" + Hex.encode(sha256(Array(device.tctiConfiguration.utf8)).prefix(8)) + ".lock"
    }

    /// This user's lock file of `device` where this process takes its turns (nil when it takes them
    /// in a store's directory, or needs none).
    package static func userLock(of device: TPMDevice) -> String? {
        guard !device.hasResourceManager else { return nil }
        return userDirectory(making: false).map { $0 + "/" + lockName(device) }
    }

    /// Removes this user's lock files of a TPM that is gone for good, in both of the user's
    /// directories (a child given another `XDG_RUNTIME_DIR` may have used the other).
    ///
    /// Each test's software TPM is a TPM of its own, and its lock outlived it: 20,898 of them were
    /// left in `/tmp/keychain-0` on the shared machine. `SoftwareTPM` calls this when released, and
    /// for the folder of a killed run it removes.
    /// - Important: only for a TPM no process will use again: a lock removed while a process waits
    ///   on it lets the next process take a second turn at once.
    package static func removeLocks(of device: TPMDevice) {
        guard !device.hasResourceManager else { return }
        for dir in Set(userDirectories()) where privateDirectory(dir) {
            unlink(dir + "/" + lockName(device))
        }
    }

    /// `$XDG_RUNTIME_DIR/keychain` (when set), then `/tmp/keychain-<uid>`.
    private static func userDirectories() -> [String] {
        // getenv, not ProcessInfo's environment: that copies the whole environment into a dictionary,
        // about a seventh of a cold read's instructions when it ran at every turn.
        let base = getenv("XDG_RUNTIME_DIR").map { String(cString: $0) }.flatMap { $0.hasPrefix("/") ? $0 : nil }
        return (base.map { [$0 + "/keychain"] } ?? []) + ["/tmp/keychain-\(geteuid())"]
    }

    /// `$XDG_RUNTIME_DIR/keychain` or `/tmp/keychain-<uid>`, made 0700 when absent (with `making`);
    /// nil unless it is a real directory (not a symlink) of this user that nobody else can write to.
    private static func userDirectory(making: Bool = true) -> String? {
        let dir = userDirectories()[0]
        if making && mkdir(dir, 0o700) != 0 && errno != EEXIST { return nil }
        return privateDirectory(dir) ? dir : nil
    }

    private static func privateDirectory(_ dir: String) -> Bool {
        var info = stat()
        return lstat(dir, &info) == 0 && info.st_mode & S_IFMT == S_IFDIR && info.st_uid == geteuid() && info.st_mode & 0o077 == 0
    }
}
