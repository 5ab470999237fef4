import Foundation
import KeychainTestSupport

/// One of the two devices of a backup or provisioning test: a private swtpm and a store on it,
/// driven through the built `keychainctl`.
struct CLIDevice {
    let tpm: SoftwareTPM
    let store: String
    init() throws {
        tpm = try SoftwareTPM()
        store = tpm.directory + "/store"
    }
    /// For tpm2-tools on this device's TPM.
    var env: [String: String] { ["TPM2TOOLS_TCTI": tpm.tcti] }
}

/// The CLI calls of tests with two devices.
protocol TwoDeviceTest {}

extension TwoDeviceTest {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    @discardableResult
    func cli(_ d: CLIDevice, _ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", d.store, "--tcti", d.tpm.tcti] + args, input: Array(input.utf8))
    }

    func text(_ d: CLIDevice, _ args: [String], _ input: String = "") throws -> String {
        String(decoding: try cli(d, args, input).stdout, as: UTF8.self)
    }

    /// The code of a `--json` error on stdout.
    func errorCode(_ result: (status: Int32, stdout: [UInt8], stderr: String)) -> String? {
        let body = try? JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: [String: Any]]
        return body?["error"]?["code"] as? String
    }
}
