import Foundation
import Keychain

/// A device for tests: a private software TPM, the simulated fingerprint reader (`tpm.directory/reader`)
/// and scripted prompt answers, with a passcode and enrolled fingers as asked.
///
/// It starts unlocked: with the passcode set (when one is given) and unlocked, the fingers enrolled
/// (with the passcode), and no answer queued. One device per test: tests running in parallel
/// must not share one, since its `answers` are a single queue.
///
/// ```swift
/// let d = try await SimulatedDevice(passcode: SecureBytes(copying: Array("2468".utf8)), fingers: ["thumb"])
/// d.answers.push(.finger("thumb"))
/// ```
public struct SimulatedDevice: Sendable {
    public let tpm: SoftwareTPM
    /// Answers the prompts of reads, in order (push them before the read); `answers.requests` records
    /// each prompt asked. With no answer left a prompt is interrupted (`SYSTEM_CANCELED`).
    public let answers = ScriptedAuthenticator()
    public let configuration: KeychainConfiguration
    public let device: KeychainDevice
    /// The passcode it was made with (nil for none), used by `unlock()` and `enrollFinger(_:)`.
    public let passcode: SecureBytes?
    /// keychaind serving this device's store when it was made `throughDaemon`; `configuration` reaches
    /// the keychain through it (prompts still come to `answers`).
    public let daemon: KeychainDaemon?

    /// `KEYCHAIN_TEST_THROUGH_DAEMON=1` in the environment: devices are made `throughDaemon` unless
    /// told otherwise, so one suite runs in-process and, run again with it, through keychaind.
    public static var throughDaemonByDefault: Bool {
        ProcessInfo.processInfo.environment["KEYCHAIN_TEST_THROUGH_DAEMON"] == "1"
    }

    /// - Parameters:
    ///   - passcode: set as the device passcode (and used to enroll the fingers); nil for none.
    ///   - fingers: enrolled on the reader.
    ///   - reader: false for a device without a fingerprint reader.
    ///   - throughDaemon: serve the store with keychaind (`daemon`) and call it through its socket.
    ///   - profile: the TPM chip to behave as (`.typicalSPI`, `.oldFirmware`, …); nil for `SoftwareTPM()`'s default.
    public init(passcode: SecureBytes? = nil, fingers: [String] = [], reader: Bool = true,
                throughDaemon: Bool = SimulatedDevice.throughDaemonByDefault, profile: TPMProfile? = nil) async throws {
        tpm = try SoftwareTPM(profile: profile)
        self.passcode = passcode
        let readerDirectory = reader ? tpm.directory + "/reader" : nil
        if throughDaemon {
            let daemon = try KeychainDaemon(tpm: tpm, reader: readerDirectory)
            self.daemon = daemon
            configuration = daemon.configuration(authenticator: answers)
        } else {
            daemon = nil
            var configuration = tpm.configuration()
            configuration.readerDirectory = readerDirectory
            configuration.authenticator = answers
            self.configuration = configuration
        }
        device = KeychainDevice(configuration: configuration)
        if let passcode { try await device.setPasscode(passcode) }
        for finger in fingers where reader { try await device.enrollFinger(finger, passcode: passcode) }
    }

    /// The name `service` has in the store's tables: keychaind keeps each uid's items apart
    /// (`uid:N/service`), for tests that look at the stored records.
    public func storeService(_ service: String) -> String {
        daemon == nil ? service : KeychainDaemon.storeService(service)
    }

    /// Locks the device: `whenUnlocked…` items fail with `INTERACTION_NOT_ALLOWED` until `unlock()`.
    public func lock() async throws { try await device.lock() }
    /// Unlocks with the device's passcode (checked by the TPM).
    public func unlock() async throws { try await device.unlock(passcode: passcode) }
    /// Enrolls one more finger with the device's passcode: `biometryCurrentSet` items are invalidated.
    public func enrollFinger(_ name: String) async throws { try await device.enrollFinger(name, passcode: passcode) }

    /// Runs `body` with this device as `KeychainConfiguration.default`: the default `keychain`,
    /// `createKeychain(options)` and `KeychainDevice()` called in it (and in the tasks it starts, not
    /// detached ones) use this TPM, store, reader and `answers`. Other tests' tasks are not affected.
    public func asDefault<R>(isolation: isolated (any Actor)? = #isolation,
                             _ body: () async throws -> R) async rethrows -> R {
        try await KeychainConfiguration.$taskDefault.withValue(configuration, operation: body, isolation: isolation)
    }

    /// The environment that points a child process's default configuration (`keychain`,
    /// `createKeychain()`, `keychainctl`) at this device's TPM, store and reader. A child has no
    /// `answers`: reads that prompt fail there with `INTERACTION_NOT_ALLOWED`.
    public var environment: [String: String] {
        if let daemon { return daemon.environment }
        var environment = tpm.environment
        environment["KEYCHAIN_READER"] = configuration.readerDirectory ?? "none"
        return environment
    }
}
