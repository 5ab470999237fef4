import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// The chip profiles' proxy in front of swtpm (issue 39): what a TPM lacks is refused as a revision 1.16
/// part refuses it and missing from its command list, to our TPM layer and to tpm2-tools alike; the
/// warnings a chip answers are retried by our layer, within its bound. Profiles without latency, so
/// the suite takes swtpm's time (scripts/tpm-profiles.sh runs the timed ones).
@Suite("TPM chip profiles", .offThePool)
struct ChipProfileTests {
    /// The old firmware's missing commands, without its latencies.
    static let lacking = TPMProfile(name: "no PolicyAuthorizeNV", missingCommands: TPMProfile.oldFirmware.missingCommands)

    /// PolicyAuthorizeNV's header alone (tag, size, command code): the chip refuses it before reading on.
    static let policyAuthorizeNV: [UInt8] = [0x80, 0x01, 0, 0, 0, 10, 0, 0, 0x01, 0x92]

    func send(_ tpm: SoftwareTPM, _ command: [UInt8]) throws -> [UInt8] {
        let result = try runChild("/usr/bin/tpm2_send", ["-T", tpm.tcti], input: command)
        #expect(result.status == 0, "\(result.stderr)")
        return result.stdout
    }

    func listedCommands(_ tpm: SoftwareTPM) throws -> String {
        let result = try runChild("/usr/bin/tpm2_getcap", ["-T", tpm.tcti, "commands"])
        #expect(result.status == 0, "\(result.stderr)")
        return String(decoding: result.stdout, as: UTF8.self)
    }

    @Test func aMissingCommandIsAnsweredCommandCodeAndLeftOutOfTheCapability() throws {
        let tpm = try SoftwareTPM(profile: Self.lacking)
        let response = try send(tpm, Self.policyAuthorizeNV)
        #expect(Array(response.suffix(4)) == [0, 0, 0x01, 0x43], "\(response)")
        let context = try TPMContext(device: tpm.device)
        #expect(try !context.implements(command: CommandCode.policyAuthorizeNV))
        #expect(try context.implements(command: CommandCode.unseal))
        // tpm2-tools' own listing (the whole list, several GetCapability answers) lacks all four.
        let listed = try listedCommands(tpm)
        #expect(listed.contains("TPM2_CC_Unseal") && listed.contains("TPM2_CC_PolicyAuthorize:"), "\(listed)")
        for missing in ["PolicyAuthorizeNV", "CreateLoaded", "PolicyTemplate", "EncryptDecrypt2"] {
            #expect(!listed.contains("TPM2_CC_\(missing)"), "\(missing) listed")
        }
    }

    @Test func plainSwtpmImplementsWhatTheOldFirmwareLacks() throws {
        let tpm = try SoftwareTPM(profile: .swtpm)
        let context = try TPMContext(device: tpm.device)
        #expect(try context.implements(command: CommandCode.policyAuthorizeNV))
        #expect(try listedCommands(tpm).contains("TPM2_CC_PolicyAuthorizeNV"))
        // The same bytes reach swtpm, which implements the command and refuses them for another reason.
        #expect(Array(try send(tpm, Self.policyAuthorizeNV).suffix(4)) != [0, 0, 0x01, 0x43])
    }

    @Test(arguments: [TPMReturnCode.retry, .yielded, .testing, .nvRate])
    func aWarningTheChipAnswersIsRetriedByOurLayer(_ warning: TPMReturnCode) throws {
        let pcrRead = TPMProfile.Command.pcrRead
        // More warnings than ESAPI resubmits by itself (5 submissions, for RETRY, YIELDED and TESTING; none
        // for NV_RATE): our `call` must send the command again.
        let tpm = try SoftwareTPM(profile: TPMProfile(name: "warns", warnings: [.init(command: pcrRead, code: warning, times: 8)]))
        let context = try TPMContext(device: tpm.device)
        let before = context.commandCount
        #expect(try context.readPCRs(PCRSelection([7]))[0].count == 32)
        #expect(tpm.commandsSeen.filter { $0 == pcrRead }.count == 9)
        #expect(context.commandCount - before > 1)
    }

    @Test func aChipThatKeepsAnsweringRetryIsGivenUpWithinTheBound() throws {
        let pcrRead = TPMProfile.Command.pcrRead
        let tpm = try SoftwareTPM(profile: TPMProfile(name: "busy", warnings: [.init(command: pcrRead, code: .retry, times: 1000)]))
        let context = try TPMContext(device: tpm.device)
        do {
            _ = try context.readPCRs(PCRSelection([7]))
            Issue.record("read PCRs from a chip that only answers TPM_RC_RETRY")
        } catch {
            #expect(error.code.is(.retry), "\(error)")
        }
        let sent = tpm.commandsSeen.filter { $0 == pcrRead }.count
        #expect(sent > 1 && sent < 1000, "\(sent) PCR_Reads")
    }
}
