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

    /// NV_Read of `size` bytes of `index` with the owner's empty password (Part 3, 31.13).
    static func nvRead(_ index: UInt32, size: UInt16) -> [UInt8] {
        let be32 = { (v: UInt32) in (0..<4).map { UInt8(truncatingIfNeeded: v >> (24 - 8 * $0)) } }
        let password: [UInt8] = be32(0x4000_0009) + [0, 0, 0, 0, 0]  // TPM_RS_PW, no nonce, no attributes, no HMAC
        let body = be32(0x4000_0001) + be32(index) + be32(UInt32(password.count)) + password
            + [UInt8(size >> 8), UInt8(size & 0xFF), 0, 0]
        return [0x80, 0x02] + be32(UInt32(10 + body.count)) + be32(UInt32(TPMProfile.Command.nvRead)) + body
    }

    /// A chip's 768-byte NV buffer: a larger NV_Read is refused as the chip refuses it (swtpm's 1024 takes
    /// it), GetCapability says 768, and tpm2-tools, which sizes its reads and writes by that, moves 1024 bytes.
    @Test func anNVReadLargerThanTheChipsBufferIsRefusedAndToolsSplitTheirs() throws {
        for (profile, limit) in [(TPMProfile(name: "768-byte NV buffer", nvBufferMax: 768), 768), (.swtpm, 1024)] {
            let tpm = try SoftwareTPM(profile: profile)
            let index = "0x01500010"
            let data = (0..<1024).map { UInt8(truncatingIfNeeded: $0 * 7) }
            let file = tpm.directory + "/nv.bin"
            #expect(FileManager.default.createFile(atPath: file, contents: Data(data)))
            for argv in [["tpm2_nvdefine", index, "-C", "o", "-s", "1024", "-a", "ownerread|ownerwrite"],
                         ["tpm2_nvwrite", index, "-C", "o", "-i", file]] {
                let result = try runChild("/usr/bin/" + argv[0], Array(argv.dropFirst()) + ["-T", tpm.tcti])
                #expect(result.status == 0, "\(argv[0]): \(result.stderr)")
            }
            let read = try runChild("/usr/bin/tpm2_nvread", [index, "-C", "o", "-s", "1024", "-T", tpm.tcti])
            #expect(read.status == 0 && read.stdout == data, "\(read.stderr)")
            let properties = String(decoding: try runChild("/usr/bin/tpm2_getcap", ["-T", tpm.tcti, "properties-fixed"]).stdout, as: UTF8.self)
            #expect(properties.contains("TPM2_PT_NV_BUFFER_MAX:\n  raw: 0x\(String(limit, radix: 16, uppercase: true))"), "\(properties)")
            let whole = try send(tpm, Self.nvRead(0x0150_0010, size: 1024))
            #expect(Array(whole[6..<10]) == (limit == 768 ? [0, 0, 0x01, 0xC4] : [0, 0, 0, 0]), "\(whole.prefix(10))")
            let fits = try send(tpm, Self.nvRead(0x0150_0010, size: 768))
            #expect(Array(fits[6..<10]) == [0, 0, 0, 0] && fits.count > 768, "\(fits.prefix(10))")
        }
    }
}
