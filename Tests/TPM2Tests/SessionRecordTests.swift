import Glibc
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// ESAPI keeps a record of each session and object (an ESYS_TR, about 700 bytes) until it is flushed
/// through it or closed. keychaind keeps its TPM connection for its whole life, so a record left
/// behind by each call was memory that only grew (issue 38 item 13: the soak's 0.15 MiB a minute).
/// `name(of:)` (Esys_TR_GetName, no TPM command) is the probe: it fails once ESAPI has no such record.
@Suite("ESAPI's record of a session ends with the session", .offThePool)
struct SessionRecordTests {
    typealias Lock = DeviceLockFixture

    /// A session started with continueSession clear is closed by the TPM when the first command it
    /// authorizes succeeds (a prompted read's PolicySecret and Unseal, a counter's NV_Read): its record
    /// goes with it.
    @Test func aSessionTheTPMClosedLeavesNoRecordBehind() throws {
        let tpm = try SoftwareTPM()
        let ctx = try TPMContext(device: tpm.device)
        let pin = try Lock.writtenPin(on: ctx, passcode: SecureBytes(copying: Array("record-pin".utf8)))
        let policy = try ctx.startSession(.policy, saltKey: nil, continueSession: true)
        defer { ctx.flush(policy) }

        let auth = try ctx.startSession(.hmac, saltKey: nil)
        #expect(try !ctx.name(of: auth).isEmpty)  // the probe sees a live session's record
        try ctx.policySecret(policy, entity: pin, authSession: auth)
        #expect(ctx.liveTransientHandles == 1)  // the policy session's alone
        #expect(throws: TPMError.self) { try ctx.name(of: auth) }
        #expect(try !ctx.name(of: policy).isEmpty)  // a session that continues keeps its record
    }

    /// A flush that fails (the TPM stopped answering) forgets the handle: its record goes too.
    @Test func aSessionWhoseFlushFailedLeavesNoRecordBehind() throws {
        let tpm = try SoftwareTPM()
        let ctx = try TPMContext(device: tpm.device, timeout: .milliseconds(500))
        var session: TPMHandle?
        ctx.withTransient {
            session = try? ctx.startSession(.hmac, saltKey: nil, continueSession: true)
            #expect(kill(tpm.processIdentifier, SIGSTOP) == 0)
            #expect(throws: TPMError.self) { try ctx.readPCRs(PCRSelection([7])) }
        }
        #expect(kill(tpm.processIdentifier, SIGCONT) == 0)
        let started = try #require(session)
        #expect(ctx.failedFlushes == 1)
        #expect(throws: TPMError.self) { try ctx.name(of: started) }
    }
}
