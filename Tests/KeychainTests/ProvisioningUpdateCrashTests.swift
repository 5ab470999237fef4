import Foundation
import KeychainTestSupport
import Testing

extension ProvisioningTests {
    /// An update of an installed item (version n-1 there, version n under another protection, so its
    /// write makes a new key with the TPM) killed after each TPM command in turn: the same bundle,
    /// imported again, installs version n. Guards the import's pending mark: without it the version
    /// recorded before the kill makes the retry answer "alreadyInstalled" over the old value.
    @Test func anUpdateKilledAtEveryTPMCommandInstallsTheNewValueWhenRetried() throws {
        let b = try Device()
        let id = try identity(b)
        func bundle(_ version: Int) throws -> String {
            let path = b.tpm.directory + "/v\(version).bundle"
            let accessible = version % 2 == 1 ? "afterFirstUnlock" : "always"
            let made = try sealFor(id, ["svc", "k", "--version", "\(version)", "--accessible", accessible], "value-\(version)", in: b.tpm.directory)
            try Data(made.stdout).write(to: URL(fileURLWithPath: path))
            return path
        }
        for n in 1...60 {
            let old = 2 * n - 1, new = 2 * n
            #expect(try cli(b, ["import", try bundle(old)]).status == 0, "kill \(n): the installed version")
            let update = try bundle(new)
            let killed = try run(ctl, ["--store", b.store, "--tcti", b.tpm.tcti, "import", update],
                                 environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let got = try cli(b, ["get", "svc", "k"]).stdout
            #expect(got == Array("value-\(old)".utf8) || got == Array("value-\(new)".utf8), "kill \(n)")
            if killed.status != 0 { #expect(try cli(b, ["import", update]).status == 0, "retry after kill \(n)") }
            #expect(String(decoding: try cli(b, ["get", "svc", "k"]).stdout, as: UTF8.self) == "value-\(new)", "after kill \(n)")
            if killed.status == 0 { return }
        }
        Issue.record("the update never completed")
    }
}
