import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// The same steps run on a real trial session and in `PolicyDigest.compute`, compared after every step,
/// so a disagreement names the step that introduced it.
@Suite("A trial session on swtpm agrees with the offline calculator", .offThePool)
struct TrialSessionTests {
    typealias Lock = DeviceLockFixture

    @Test func trialSessionDigestMatchesOfflineDigestAfterEveryStep() throws {
        let tpm = try SoftwareTPM()
        let ctx = try TPMContext(device: tpm.device)
        let passcode = SecureBytes(copying: Array("kat-pin".utf8))

        // The PIN index, written; the epoch counter, incremented once (PolicyNV needs written indices).
        let pin = try Lock.writtenPin(on: ctx, passcode: passcode)
        let epoch = try ctx.defineNV(Lock.epoch, auth: nil)
        try ctx.withSession(.policy, saltKey: nil) { session throws(TPMError) in
            try ctx.policyCommandCode(session, CommandCode.nvIncrement)
            try ctx.incrementNV(epoch, session: session)
        }
        // The names the TPM reports (NV_ReadPublic on fresh resources), not ESAPI's cached ones.
        #expect(try ctx.name(of: ctx.resource(forPersistent: Lock.pin.index)).hex == Lock.pin.name(written: true).hex)
        #expect(try ctx.name(of: ctx.resource(forPersistent: Lock.epoch.index)).hex == Lock.epoch.name(written: true).hex)

        var steps: [PolicyStep] = [
            .pcr(selection: PCRSelection([0, 7]), digest: sha256([UInt8](repeating: 0, count: 32) + Lock.pcr7Value)),
            .commandCode(CommandCode.nvChangeAuth),
            .authValue,
        ]
        steps.append(.or([PolicyDigest.compute([.commandCode(CommandCode.unseal)]), PolicyDigest.compute(steps)]))
        steps += [
            .secret(index: Lock.pin.index, name: Lock.pin.name(written: true), policyRef: Array("kat-ref".utf8)),
            Lock.epochIs(1),
            .cpHash(Lock.state.writeCpHash(data: [0], offset: 0, written: true)),
        ]

        let auth = try ctx.startSession(.hmac, saltKey: nil, continueSession: true)
        defer { ctx.flush(auth) }
        let trial = try ctx.startSession(.trial, saltKey: nil)
        defer { ctx.flush(trial) }
        for (count, step) in zip(1..., steps) {
            // The library's own runner (TPMContext.run), with the caller's PolicySecret.
            try ctx.run([step], on: trial, nvIndex: { _ in epoch }, other: { step throws(TPMError) in
                guard case .secret(_, _, let policyRef) = step else { return }
                try ctx.policySecret(trial, entity: pin, authSession: auth, policyRef: policyRef)
            })
            let offline = PolicyDigest.compute(Array(steps.prefix(count)))
            #expect(try ctx.policyDigest(trial).hex == offline.hex, "after step \(count): \(step)")
        }
    }
}
