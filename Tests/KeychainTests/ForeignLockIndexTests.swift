import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Someone else's NV index at a device-lock handle is never taken for ours: provisioning compares its
/// name (public area: attributes, write policy, size, written) with the one it defines.
@Suite("Foreign indices at the device lock's handles", .offThePool)
struct ForeignLockIndexTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    func cli(_ tpm: SoftwareTPM, _ store: String, _ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", store, "--tcti", tpm.tcti] + args, input: Array(input.utf8))
    }

    func tools(_ tpm: SoftwareTPM, _ tool: String, _ args: [String], input: [UInt8] = []) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run("/usr/bin/" + tool, args, input: input, environment: ["TPM2TOOLS_TCTI": tpm.tcti])
    }

    /// A descriptor planted before the first provisioning, anyone-writable, holding a well-formed
    /// descriptor ("no passcode", the planter's approval key): it is remade, not read.
    @Test func aPlantedDescriptorIsRemadeNotTrusted() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        #expect(try tools(tpm, "tpm2_nvdefine", ["-C", "o", "-s", "512", "-a", "ownerread|ownerwrite|authread|authwrite", "0x01004B53"]).status == 0)
        let fake: [UInt8] = [0, 0, 1, 0xAA, 0, 1, 0xBB, 0, 1, 0xCC]
        let wrote = try tools(tpm, "tpm2_nvwrite", ["-C", "0x01004B53", "-i-", "0x01004B53"], input: fake)
        #expect(wrote.status == 0, "\(wrote.stderr)")
        let status = try cli(tpm, store, ["status"])
        #expect(status.status == 0, "\(status.stderr)")
        // Ours now: written only through the passcode policy, not by anyone with the empty auth.
        let attributes = String(decoding: try tools(tpm, "tpm2_nvreadpublic", ["0x01004B53"]).stdout, as: UTF8.self)
        #expect(attributes.contains("policywrite") && !attributes.contains("authwrite"), "\(attributes)")
        #expect(try cli(tpm, store, ["passcode", "set"], "2468\n").status == 0)
        #expect(try cli(tpm, store, ["lock"]).status == 0)
        #expect(try cli(tpm, store, ["unlock"], "2468\n").status == 0)
    }

    /// Our descriptor stays, but the state index beside it was swapped for one anyone may write: a new
    /// store on this TPM refuses it with a clear error instead of pinning it.
    @Test func aSwappedStateIndexIsRefused() throws {
        let tpm = try SoftwareTPM()
        #expect(try cli(tpm, tpm.directory + "/store", ["status"]).status == 0)
        #expect(try tools(tpm, "tpm2_nvundefine", ["-C", "o", "0x01004B51"]).status == 0)
        #expect(try tools(tpm, "tpm2_nvdefine", ["-C", "o", "-s", "1", "-a", "ownerread|ownerwrite|authread|authwrite|clear_stclear", "0x01004B51"]).status == 0)
        let other = try cli(tpm, tpm.directory + "/other", ["status"])
        #expect(other.status == 3 && other.stderr.contains("HARDWARE_UNAVAILABLE") && other.stderr.contains("0x01004b51"), "\(other.stderr)")
    }
}
