import Foundation
import Keychain
import TPM2

/// A private software TPM for one test or suite: swtpm on Unix sockets in a 0700 temporary directory,
/// small dictionary-attack limits, stopped and removed when released, and killed with the process
/// that made it (however that process ends).
///
/// ```swift
/// let tpm = try SoftwareTPM()
/// let keychain = try createKeychain(.init(service: "tests"), configuration: tpm.configuration())
/// ```
public final class SoftwareTPM: @unchecked Sendable {
    public let directory: String
    private let swtpm: Swtpm
    private var child: Swtpm.Child?
    private let lock = NSLock()

    /// The TCTI string of this TPM (`swtpm:path=…/tpm`).
    public var tcti: String { device.tctiConfiguration }
    public var device: TPMDevice { swtpm.device }
    /// The swtpm process (to stop it with SIGSTOP, say); 0 when it is not running.
    public var processIdentifier: pid_t { lock.withLock { child?.pid ?? 0 } }

    public init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-swtpm-\(UUID().uuidString)").path
        for dir in [directory, directory + "/state"] where mkdir(dir, 0o700) != 0 {
            throw SoftwareTPMError("cannot create \(dir): errno \(errno)")
        }
        swtpm = try Swtpm(directory: directory)
        try start()
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

    /// A TPM reset: the process stops and starts again on the same state.
    public func reboot() throws {
        stop()
        try start()
    }

    public func stop() {
        lock.withLock {
            child?.stop()
            child = nil
        }
    }

    private func start() throws {
        try lock.withLock { child = try swtpm.start(state: directory + "/state") }
    }
}

public struct SoftwareTPMError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
