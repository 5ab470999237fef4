import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

@Suite("TPM connection strings and deadlines", .offThePool)
struct TPMTransportTests {
    @Test func wellFormedTCTIStringsPrintBackAsTheyWereParsed() throws {
        for conf in ["swtpm:path=/run/user/0/tpm", "swtpm:host=127.0.0.1,port=2321", "device:/dev/tpmrm0", "tabrmd:bus_type=session"] {
            #expect(try TPMDevice(parsing: conf).tctiConfiguration == conf)
        }
        #expect(try TPMDevice(parsing: "swtpm:path=/x/tpm") == .swtpmSocket(path: "/x/tpm"))
        #expect(try TPMDevice(parsing: "swtpm:port=2400") == .swtpm(host: "127.0.0.1", port: 2400))
    }

    /// Each of these used to become `swtpm:host=127.0.0.1,port=2321`: a port any local user may hold.
    @Test func malformedSwtpmStringsAreRefusedNotReadAsTheDefaultPort() {
        for conf in ["swtpm:host=,port=abc", "swtpm:port=abc", "swtpm:port=0", "swtpm:port=65535", "swtpm:port=-1",
                     "swtpm:host", "swtpm:path=", "swtpm:path=/a,port=2321", "swtpm:host=h,host=i", "swtpm:prot=2321",
                     "swtpm:host=h,"] {
            #expect(throws: TPMDevice.InvalidConfiguration.self, "\(conf)") { try TPMDevice(parsing: conf) }
        }
    }

    /// tpm2-abrmd's own OBJECT_MEMORY and SESSION_MEMORY (a client past `--max-transients`/`--max-sessions`)
    /// come in the resource manager's layer with a TPM code: a TPM code, not a lost connection. Its TSS
    /// codes in that layer, and the TCTI's, still are.
    @Test func aResourceManagersRefusalInTPMTermsIsATPMCodeNotALostConnection() {
        for (raw, base) in [(UInt32(0xB0902), TPMReturnCode.objectMemory), (0xB0903, .sessionMemory)] {
            let code = TPMReturnCode(rawValue: raw)
            #expect(code.isResourceManagerRefusal && code.is(base))
            #expect(!TPMError(command: "Load", code: code).isConnectionFailure)
        }
        for raw: UInt32 in [0xB0001, 0xB000A, 0xA000A] {
            #expect(!TPMReturnCode(rawValue: raw).isTPMError)
            #expect(TPMError(command: "Load", code: TPMReturnCode(rawValue: raw)).isConnectionFailure, "\(raw)")
        }
        #expect(TPMReturnCode(rawValue: 0x902).is(.objectMemory) && !TPMReturnCode(rawValue: 0x902).isResourceManagerRefusal)
    }

    /// A stopped TPM: the command returns after the deadline, marked as unanswered, and the context
    /// refuses later commands at once instead of waiting again.
    @Test func aCommandToAStoppedTPMReturnsAfterTheDeadline() throws {
        let tpm = try SoftwareTPM()
        let context = try TPMContext(device: tpm.device, timeout: .milliseconds(500))
        _ = try context.readPCRs(PCRSelection([7]))
        #expect(kill(tpm.processIdentifier, SIGSTOP) == 0)
        defer { kill(tpm.processIdentifier, SIGCONT) }
        let error = #expect(throws: TPMError.self) { try context.readPCRs(PCRSelection([7])) }
        #expect(error?.timedOut == true && error?.isConnectionFailure == true)
        #expect(context.unanswered != nil)
        let next = #expect(throws: TPMError.self) { try context.readPCRs(PCRSelection([7])) }
        #expect(next?.timedOut == true)
        // A new connection to the stopped TPM is bounded too (the TCTI talks to it while connecting).
        let connect = #expect(throws: TPMError.self) { try TPMContext(device: tpm.device, timeout: .milliseconds(500)) }
        #expect(connect?.timedOut == true)
    }

    /// A TPM that went away mid-connection: the command fails as a lost connection, and the context
    /// takes no later command, even once a TPM answers again (after a failed receive ESAPI answers
    /// every call "called in the wrong order"; seen in CI as a kept connection's next operation blaming
    /// the storage root key), so keychaind does not keep it for another operation.
    @Test func aConnectionThatFailedBelowTheTPMTakesNoLaterCommand() throws {
        let tpm = try SoftwareTPM()
        let context = try TPMContext(device: tpm.device)
        _ = try context.readPCRs(PCRSelection([7]))
        #expect(context.isUsable)
        tpm.stop()
        let error = #expect(throws: TPMError.self) { try context.readPCRs(PCRSelection([7])) }
        #expect(error?.isConnectionFailure == true && error?.timedOut == false, "\(String(describing: error))")
        #expect(!context.isUsable)
        try tpm.reboot()
        let next = #expect(throws: TPMError.self) { try context.readPCRs(PCRSelection([7])) }
        #expect(next?.isConnectionFailure == true)
        #expect(next?.code == error?.code, "the first failure's code, not ESAPI's sequence error: \(String(describing: next))")
        _ = try TPMContext(device: tpm.device).readPCRs(PCRSelection([7]))  // a new connection is served
        #expect(TPMError(command: "StartAuthSession", code: TPMReturnCode(rawValue: 0x70007)).isConnectionFailure)
    }
}
