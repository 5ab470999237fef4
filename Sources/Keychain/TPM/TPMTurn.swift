import Foundation
import TPM2

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
final class TPMTurn {
    /// How long to wait for another process's turn to end: longer than any one operation takes.
    static let maximumWait: Duration = .seconds(30)

    private let fd: Int32
    let path: String

    /// Takes the turn, waiting for the current holder; nil when the TPM has a resource manager.
    static func take(_ device: TPMDevice, configuration: KeychainConfiguration) throws(KeychainError) -> TPMTurn? {
        guard !device.hasResourceManager else { return nil }
        let path: String
        if case .embedded = configuration.tpm {
            path = EmbeddedTPM.directory(configuration.storeDirectory) + "/tpm.lock"
        } else {
            let name = "tpm-" + sha256(Array(device.tctiConfiguration.utf8)).prefix(8).map { String(format: "%02x", $0) }.joined() + ".lock"
            path = (userDirectory() ?? configuration.storeDirectory) + "/" + name
        }
        return try TPMTurn(path: path)
    }

    private init(path: String) throws(KeychainError) {
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
        let deadline = ContinuousClock.now + Self.maximumWait
        var pause: UInt32 = 200
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR, ContinuousClock.now < deadline else {
                close(fd)
                throw KeychainError(.hardwareUnavailable,
                                    "Another process has been using the TPM for over 30 s (lock \(path)): "
                                    + "wait for it to finish, or stop it")
            }
            usleep(pause)
            pause = min(pause * 2, 5_000)
        }
    }

    deinit { close(fd) }  // closing releases the flock

    /// `$XDG_RUNTIME_DIR/keychain` or `/tmp/keychain-<uid>`, made 0700 when absent; nil unless it is
    /// a real directory (not a symlink) of this user that nobody else can write to.
    private static func userDirectory() -> String? {
        let base = ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"].flatMap { $0.hasPrefix("/") ? $0 : nil }
        let dir = base.map { $0 + "/keychain" } ?? "/tmp/keychain-\(geteuid())"
        if mkdir(dir, 0o700) != 0 && errno != EEXIST { return nil }
        var info = stat()
        guard lstat(dir, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == geteuid(),
              info.st_mode & 0o077 == 0 else { return nil }
        return dir
    }
}
