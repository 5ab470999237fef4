import KeychainCore
import Glibc
import FoundationEssentials
import KeychainStore
import TPM2

/// A software TPM (swtpm) kept in `<store>/swtpm/`, for machines without one and for tests.
///
/// Started on demand as a daemon on Unix sockets in that 0700 directory and left running, so several
/// processes of its owner share it the way they share a real TPM (swtpm serves one connection at a
/// time; each keychain operation connects and disconnects); no other user can reach it. Stopping its
/// process is a TPM reboot: `reboot(storeDirectory:)`.
public enum EmbeddedTPM {
    static func directory(_ store: String) -> String { store + "/swtpm" }

    /// The identity of the store this TPM serves, written at its first use with the store.
    static func storePin(_ store: String) -> String { directory(store) + "/keychain.id" }

    /// The TPM device of the store's software TPM, starting it when it is not running.
    /// - Returns: the device, and whether this call started it (a fresh TPM boot).
    /// - Note: `package`, not `public`: TPM2 types stay out of Keychain's public API (tests start it with this).
    package static func ensureRunning(storeDirectory: String) throws(KeychainError) -> (device: TPMDevice, started: Bool) {
        let dir = directory(storeDirectory)
        // Someone else's state (or a planted one) is refused, as the store's directory is.
        do { try FileSystem.preparePrivateDirectory(dir, what: "embedded TPM's state directory") } catch {
            throw KeychainError(store: error)
        }
        let swtpm = try Swtpm(directory: dir)
        // One starter at a time: two processes must not start two swtpms on one state.
        let lockFD = open(dir + "/start.lock", O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard lockFD >= 0 else { throw KeychainError(.storageError, "Cannot open \(dir)/start.lock", underlying: .errno(errno)) }
        defer { close(lockFD) }
        flock(lockFD, LOCK_EX)
        defer { flock(lockFD, LOCK_UN) }

        if swtpm.isListening { return (swtpm.device, false) }
        // Looked up only when one must start: not on every operation of a running one.
        guard Processes.findExecutable("swtpm") != nil else {
            throw KeychainError(.hardwareUnavailable,
                                "No TPM: there is no /dev/tpmrm0 and swtpm is not installed for the embedded software TPM "
                                + "(apt-get install swtpm), or pass --tcti")
        }
        stop(storeDirectory: storeDirectory)  // one that no longer listens, or an older one on TCP
        _ = try swtpm.start(state: dir, pidFile: dir + "/swtpm.pid")
        return (swtpm.device, true)
    }

    /// Simulates a reboot: the swtpm process stops (its state stays) and the next use starts it again,
    /// which is a TPM Reset: `CLEAR_STCLEAR` indices are cleared and PCRs return to their initial values.
    public static func reboot(storeDirectory: String) {
        stop(storeDirectory: storeDirectory)
    }

    /// Stops the store's software TPM if it runs.
    public static func stop(storeDirectory: String) {
        let dir = directory(storeDirectory)
        guard let pidText = try? String(contentsOfFile: dir + "/swtpm.pid", encoding: .utf8),
              let pid = pid_t(pidText.trimmingSpaces(newlines: true)), pid > 0 else { return }
        defer { try? FileManager.default.removeItem(atPath: dir + "/swtpm.pid") }
        // A stale file's pid may be another process's now.
        guard (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8)) == "swtpm\n" else { return }
        kill(pid, SIGTERM)
        for _ in 0..<20 where kill(pid, 0) == 0 { usleep(10_000) }
        if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
    }
}
