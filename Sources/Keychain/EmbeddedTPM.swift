import Foundation
import TPM2

/// A software TPM (swtpm) kept in `<store>/swtpm/`, for machines without one and for tests.
///
/// Started on demand as a daemon on loopback and left running, so several processes share it the way
/// they share a real TPM (swtpm serves one connection at a time; each keychain operation connects
/// and disconnects). Stopping its process is a TPM reboot: `reboot(storeDirectory:)`.
public enum EmbeddedTPM {
    static func directory(_ store: String) -> String { store + "/swtpm" }

    /// The TPM device of the store's software TPM, starting it when it is not running.
    /// - Returns: the device, and whether this call started it (a fresh TPM boot).
    public static func ensureRunning(storeDirectory: String) throws(KeychainError) -> (device: TPMDevice, started: Bool) {
        let dir = directory(storeDirectory)
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        } catch {
            throw KeychainError(.storageError, "Cannot create \(dir) for the embedded software TPM: \(error.localizedDescription)")
        }
        // One starter at a time: two processes must not start two swtpms on one state.
        let lockFD = open(dir + "/start.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard lockFD >= 0 else { throw KeychainError(.storageError, "Cannot open \(dir)/start.lock", underlying: .errno(errno)) }
        defer { close(lockFD) }
        flock(lockFD, LOCK_EX)
        defer { flock(lockFD, LOCK_UN) }

        if let port = runningPort(dir) { return (.swtpm(host: "127.0.0.1", port: port), false) }
        let port = try start(dir)
        return (.swtpm(host: "127.0.0.1", port: port), true)
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
              let pid = pid_t(pidText.trimmingCharacters(in: .whitespacesAndNewlines)), pid > 0 else { return }
        kill(pid, SIGTERM)
        for _ in 0..<20 where kill(pid, 0) == 0 { usleep(10_000) }
        if kill(pid, 0) == 0 { kill(pid, SIGKILL) }
        try? FileManager.default.removeItem(atPath: dir + "/swtpm.pid")
        try? FileManager.default.removeItem(atPath: dir + "/port")
    }

    private static func runningPort(_ dir: String) -> Int? {
        guard let portText = try? String(contentsOfFile: dir + "/port", encoding: .utf8),
              let port = Int(portText.trimmingCharacters(in: .whitespacesAndNewlines)),
              let pidText = try? String(contentsOfFile: dir + "/swtpm.pid", encoding: .utf8),
              let pid = pid_t(pidText.trimmingCharacters(in: .whitespacesAndNewlines)),
              kill(pid, 0) == 0 else { return nil }
        return port
    }

    private static func start(_ dir: String) throws(KeychainError) -> Int {
        guard let swtpm = findExecutable("swtpm") else {
            throw KeychainError(.hardwareUnavailable,
                                "No TPM: there is no /dev/tpmrm0 and swtpm is not installed for the embedded software TPM "
                                + "(apt-get install swtpm), or pass --tcti")
        }
        for _ in 0..<5 {
            let port = Processes.freePortPair()
            try? FileManager.default.removeItem(atPath: dir + "/swtpm.pid")
            let status = Processes.spawn(swtpm, [
                "swtpm", "socket", "--tpm2",
                "--server", "type=tcp,port=\(port),bindaddr=127.0.0.1",
                "--ctrl", "type=tcp,port=\(port + 1),bindaddr=127.0.0.1",
                "--tpmstate", "dir=\(dir)",
                "--flags", "not-need-init,startup-clear",
                "--pid", "file=\(dir)/swtpm.pid",
                "--log", "file=\(dir)/swtpm.log",
                "--daemon",
            ]).map(Processes.wait)
            guard let status else {
                throw KeychainError(.hardwareUnavailable, "Cannot start swtpm at \(swtpm)", underlying: .errno(errno))
            }
            guard status == 0 else { continue }  // the port was taken meanwhile: try another
            for _ in 0..<500 {
                if Processes.canConnect(port) {
                    try? "\(port)\n".write(toFile: dir + "/port", atomically: true, encoding: .utf8)
                    return port
                }
                usleep(10_000)
            }
        }
        throw KeychainError(.hardwareUnavailable, "The embedded software TPM did not start: see \(dir)/swtpm.log")
    }

    static func findExecutable(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for dir in path.split(separator: ":") + ["/usr/bin", "/usr/local/bin"] {
            let candidate = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }
}
