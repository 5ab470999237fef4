import Foundation
import Keychain
import TPM2

/// A private software TPM for one test or suite: swtpm on a free loopback port with its state in a
/// temporary directory, small dictionary-attack limits, stopped and removed when released.
///
/// ```swift
/// let tpm = try SoftwareTPM()
/// let keychain = try createKeychain(.init(service: "tests"), configuration: tpm.configuration())
/// ```
public final class SoftwareTPM: @unchecked Sendable {
    public let directory: String
    public private(set) var port: Int
    private var pid: pid_t = 0
    private let lock = NSLock()

    /// The TCTI string of this TPM (`swtpm:host=127.0.0.1,port=…`).
    public var tcti: String { "swtpm:host=127.0.0.1,port=\(port)" }
    public var device: TPMDevice { .swtpm(host: "127.0.0.1", port: port) }

    public init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-swtpm-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory + "/state", withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        port = 0
        try start(newPort: true)
        // Low DA limits, so a test that fails authorizations never waits minutes (our own objects are noDA).
        let context = try TPMContext(device: device)
        try context.setDictionaryAttackParameters(maxTries: 1000, recoveryTime: 1, lockoutRecovery: 1)
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A keychain configuration on this TPM with its store in `directory/store` (or `store`).
    public func configuration(store: String? = nil, pcrSelection: [Int] = [7]) -> KeychainConfiguration {
        KeychainConfiguration(storeDirectory: store ?? directory + "/store", tpm: .tcti(tcti), pcrSelection: pcrSelection)
    }

    /// A TPM reset: the process stops and starts again on the same state and port.
    public func reboot() throws {
        stop()
        try start(newPort: false)
    }

    public func stop() {
        lock.lock(); defer { lock.unlock() }
        guard pid > 0 else { return }
        kill(pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        pid = 0
    }

    private func start(newPort: Bool) throws {
        lock.lock(); defer { lock.unlock() }
        guard let swtpm = ["/usr/bin/swtpm", "/usr/local/bin/swtpm"].first(where: FileManager.default.isExecutableFile) else {
            throw SoftwareTPMError("swtpm is not installed (apt-get install swtpm)")
        }
        for attempt in 0..<20 {
            // Another process's swtpm on a taken port would answer our connection test: pick free ones.
            if newPort || attempt > 0 { port = Processes.freePortPair() }
            let argv = ["swtpm", "socket", "--tpm2",
                        "--server", "type=tcp,port=\(port),bindaddr=127.0.0.1",
                        "--ctrl", "type=tcp,port=\(port + 1),bindaddr=127.0.0.1",
                        "--tpmstate", "dir=\(directory)/state",
                        "--flags", "not-need-init,startup-clear",
                        "--log", "file=\(directory)/swtpm.log"]
            guard let child = Processes.spawn(swtpm, argv) else {
                throw SoftwareTPMError("cannot start swtpm: errno \(errno)")
            }
            var exited = false
            for _ in 0..<300 {
                var status: Int32 = 0
                if waitpid(child, &status, WNOHANG) == child { exited = true; break }  // port taken: try another
                if Processes.canConnect(port) {
                    usleep(20_000)
                    // Still alive after answering: the port is ours (a child that lost the race exits at once).
                    if waitpid(child, &status, WNOHANG) == child { exited = true; break }
                    pid = child
                    return
                }
                usleep(5_000)
            }
            if exited { continue }
            kill(child, SIGKILL)
            var status: Int32 = 0
            waitpid(child, &status, 0)
        }
        throw SoftwareTPMError("swtpm did not start; see \(directory)/swtpm.log")
    }
}

public struct SoftwareTPMError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
