import Foundation
import Keychain
import KeychainTestThreads
import Testing

/// `keychainctl --store RELATIVE/PATH` with the embedded software TPM. Its swtpm daemonizes into `/`,
/// so a relative store path handed to it named `/RELATIVE/PATH`: the TPM's state and sockets went
/// elsewhere than the store, and the first command failed (`CreatePrimary(salt key)`, TPM_RC 0x101).
/// The configuration now makes the path absolute when it is set.
@Suite("Relative store paths", .offThePool)
struct RelativeStoreTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    @Test func aRelativeStorePathWorksWithTheEmbeddedTPM() throws {
        try #require(!FileManager.default.fileExists(atPath: "/dev/tpmrm0"), "a TPM device here would be used instead of the embedded one")
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-rel-\(UUID().uuidString)").path
        let store = base + "/rel/store"
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        defer {
            EmbeddedTPM.stop(storeDirectory: store)
            try? FileManager.default.removeItem(atPath: base)
        }
        // keychainctl run from `cwd` (no TPM in the environment: the embedded one).
        func cli(in cwd: String, _ storeArgument: String, _ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run("/bin/sh", ["-c", "cd \"$0\" && exec \"$@\"", cwd, ctl, "--store", storeArgument] + args,
                    input: Array(input.utf8), environment: ["KEYCHAIN_TCTI": "", "TPM2TCTI": "", "KEYCHAIN_READER": "none"])
        }
        let set = try cli(in: base, "rel/store", ["set", "s", "k"], "value")
        #expect(set.status == 0, "\(set.stderr)")
        #expect(try cli(in: base, "rel/store", ["get", "s", "k"]).stdout == Array("value".utf8))
        #expect(try cli(in: base + "/rel", "./store/../store", ["get", "s", "k"]).stdout == Array("value".utf8))
        // The embedded TPM lives in the store named, and the same store opens by its absolute path.
        #expect(FileManager.default.fileExists(atPath: store + "/swtpm"))
        #expect(try cli(in: "/", store, ["get", "s", "k"]).stdout == Array("value".utf8))
    }

    @Test func theConfigurationMakesTheStorePathAbsolute() {
        let cwd = FileManager.default.currentDirectoryPath
        var configuration = KeychainConfiguration(storeDirectory: "a/b", tpm: .embedded)
        #expect(configuration.storeDirectory == URL(fileURLWithPath: cwd + "/a/b").standardizedFileURL.path)
        configuration.storeDirectory = "c/../d"
        #expect(configuration.storeDirectory == URL(fileURLWithPath: cwd + "/d").standardizedFileURL.path)
        configuration.storeDirectory = "/abs/x"
        #expect(configuration.storeDirectory == "/abs/x")
    }
}
