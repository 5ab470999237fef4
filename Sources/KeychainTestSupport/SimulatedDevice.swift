import Keychain

/// A device for tests: a private software TPM, the simulated fingerprint reader (in the TPM's
/// temporary directory) and scripted prompt answers, with a passcode and enrolled fingers as asked.
///
/// ```swift
/// let d = try await SimulatedDevice(passcode: SecureBytes(copying: Array("2468".utf8)), fingers: ["thumb"])
/// d.answers.push(.finger("thumb"))
/// ```
public struct SimulatedDevice: Sendable {
    public let tpm: SoftwareTPM
    /// Answers the prompts of reads, in order (push them before the read).
    public let answers = ScriptedAuthenticator()
    public let configuration: KeychainConfiguration
    public let device: KeychainDevice

    /// - Parameters:
    ///   - passcode: set as the device passcode (and used to enroll the fingers); nil for none.
    ///   - fingers: enrolled on the reader.
    ///   - reader: false for a device without a fingerprint reader.
    public init(passcode: SecureBytes? = nil, fingers: [String] = [], reader: Bool = true) async throws {
        tpm = try SoftwareTPM()
        var configuration = tpm.configuration()
        configuration.readerDirectory = reader ? tpm.directory + "/reader" : nil
        configuration.authenticator = answers
        self.configuration = configuration
        device = KeychainDevice(configuration: configuration)
        if let passcode { try await device.setPasscode(passcode) }
        for finger in fingers where reader { try await device.enrollFinger(finger, passcode: passcode) }
    }
}
