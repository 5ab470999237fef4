import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// Someone who reads our files and talks to the TPM directly, skipping this library's Swift code.
@Suite("Bypass with the stored blobs and direct ESAPI", .offThePool)
struct BypassTests {
    struct Stolen {
        let blob: TPMContext.SealedBlob
        let policy: SealPolicy
    }

    func steal(_ f: Fixture, service: String, accessible: Accessible) throws -> Stolen {
        let store = try Store(directory: f.configuration.storeDirectory)
        let tag = try ItemProtection(accessible: accessible).storageTag
        let record = try #require(try store.wrappingKey(service: service, protection: tag))
        return Stolen(blob: .init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate),
                      policy: try #require(SealPolicy.decode(record.policy)))
    }

    /// Tries to unseal with the policy steps the attacker chooses to run; returns the TPM error.
    func attempt(_ f: Fixture, _ stolen: Stolen, steps: [PolicyStep]) throws -> TPMError? {
        let context = try TPMContext(device: f.tpm.device)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
        let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
        let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
        defer { context.flush(session) }
        let object = try context.load(stolen.blob, parent: srk)
        defer { context.flush(object) }
        do {
            let approval = try? context.resource(forPersistent: BootApprovalLayout.index)
            try context.run(steps, on: session, nvIndex: { index throws(TPMError) in
                switch index {
                case DeviceLockLayout.epochIndex: return epoch
                case DeviceLockLayout.stateIndex: return state
                default:
                    guard let approval else { throw TPMError(command: "approval index", code: .handle) }
                    return approval
                }
            })
            _ = try context.unseal(object, session: session)
            return nil
        } catch {
            return error
        }
    }

    @Test func theSameStepsUnsealWhileTheDeviceStateIsRight() async throws {
        let f = try Fixture()
        try await f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly).setItem("k", "v")
        try await f.device.unlock(passcode: nil)  // no passcode: anyone may unlock, as the library does itself
        let stolen = try steal(f, service: "tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        // The control: with the state right, the attacker's own ESAPI calls do unseal (so the checks below can fail).
        #expect(try attempt(f, stolen, steps: stolen.policy.steps) == nil)
    }

    @Test func thisDeviceOnlyKeyDoesNotUnsealAfterPCRChange() async throws {
        let f = try Fixture()
        try await f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly).setItem("k", "v")
        try await f.device.unlock(passcode: nil)  // no passcode: anyone may unlock, as the library does itself
        let stolen = try steal(f, service: "tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        let approvedValue = try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7]))
        try f.extendPCR(7)
        let withStoredSteps = try attempt(f, stolen, steps: stolen.policy.steps)
        #expect(withStoredSteps?.code.is(.value) == true, "PolicyAuthorizeNV must refuse an unapproved PCR 7")
        // Skipping PolicyAuthorizeNV, or asserting the approved values (PolicyPCR refuses them), or asserting
        // today's values without the approval, leaves a digest the key was not sealed to.
        let skipped = try attempt(f, stolen, steps: stolen.policy.steps.filter { if case .authorizeNV = $0 { false } else { true } })
        #expect(skipped?.code.is(.policyFail) == true)
        let asApproved = try attempt(f, stolen, steps: [.pcr(selection: PCRSelection([7]), digest: sha256(approvedValue.flatMap { $0 }))])
        #expect(asApproved?.code.is(.value) == true)
        let today = sha256(try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7])).flatMap { $0 })
        let withToday = try attempt(f, stolen, steps: stolen.policy.steps.map {
            if case .authorizeNV = $0 { .pcr(selection: PCRSelection([7]), digest: today) } else { $0 }
        })
        #expect(withToday?.code.is(.policyFail) == true)
    }

    /// A ThisDeviceOnly key can never leave this TPM: the TPM itself reports `fixedTPM|fixedParent`
    /// for the stored object once loaded, and TPM2_Duplicate of it is refused, even in a session that
    /// satisfies its policy. Movable levels are not fixed (they may be backed up later).
    @Test func thisDeviceOnlyKeysAreFixedToThisTPMAndCannotBeDuplicated() async throws {
        let f = try Fixture()
        try await f.storage("fixed", accessible: .alwaysThisDeviceOnly).setItem("k", "v")
        try await f.storage("movable", accessible: .always).setItem("k", "v")
        let env = ["TPM2TOOLS_TCTI": f.tpm.tcti]
        let dir = f.tpm.directory
        func loadedAttributes(_ stolen: Stolen, _ name: String) throws -> String {
            try Data(stolen.blob.publicArea).write(to: URL(fileURLWithPath: "\(dir)/\(name).pub"))
            try Data(stolen.blob.privateArea).write(to: URL(fileURLWithPath: "\(dir)/\(name).priv"))
            let load = try run("/usr/bin/tpm2_load", ["-C", "0x81000001", "-u", "\(dir)/\(name).pub", "-r", "\(dir)/\(name).priv",
                                                 "-c", "\(dir)/\(name).ctx"], environment: env)
            #expect(load.status == 0, "\(load.stderr)")
            let out = try run("/usr/bin/tpm2_readpublic", ["-c", "\(dir)/\(name).ctx"], environment: env)
            _ = try run("/usr/bin/tpm2_flushcontext", ["-t"], environment: env)  // no resource manager: 3 slots
            let attributes = String(decoding: out.stdout, as: UTF8.self).split(separator: "\n")
                .drop { !$0.hasPrefix("attributes:") }.dropFirst().first ?? ""
            return String(attributes)
        }
        let fixed = try steal(f, service: "fixed", accessible: .alwaysThisDeviceOnly)
        let fixedAttributes = try loadedAttributes(fixed, "fixed")
        #expect(fixedAttributes.contains("fixedtpm") && fixedAttributes.contains("fixedparent"), "\(fixedAttributes)")
        let movableAttributes = try loadedAttributes(try steal(f, service: "movable", accessible: .always), "movable")
        #expect(!movableAttributes.isEmpty && !movableAttributes.contains("fixedparent"), "\(movableAttributes)")

        // The attack: load the stolen key, satisfy its policy (PolicyPCR), ask the TPM to export it.
        #expect(try run("/usr/bin/tpm2_load", ["-C", "0x81000001", "-u", "\(dir)/fixed.pub", "-r", "\(dir)/fixed.priv",
                                               "-c", "\(dir)/fixed.ctx"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_startauthsession", ["--policy-session", "-S", "\(dir)/dup.session"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_policypcr", ["-S", "\(dir)/dup.session", "-l", "sha256:7"], environment: env).status == 0)
        let duplicate = try run("/usr/bin/tpm2_duplicate", ["-C", "null", "-c", "\(dir)/fixed.ctx", "-G", "null",
                                                             "-p", "session:\(dir)/dup.session",
                                                             "-r", "\(dir)/dup.priv", "-s", "\(dir)/dup.seed"], environment: env)
        #expect(duplicate.status != 0)
        #expect(!FileManager.default.fileExists(atPath: "\(dir)/dup.priv"), "the TPM exported the key")
        _ = try run("/usr/bin/tpm2_flushcontext", ["-t"], environment: env)
        _ = try run("/usr/bin/tpm2_flushcontext", ["-l"], environment: env)
    }

    @Test func afterFirstUnlockKeyDoesNotUnsealAfterReboot() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))
        try await f.storage("afu", accessible: .afterFirstUnlock).setItem("k", "v")
        let stolen = try steal(f, service: "afu", accessible: .afterFirstUnlock)
        try f.tpm.reboot()
        let asSealed = try attempt(f, stolen, steps: stolen.policy.steps)
        #expect(asSealed?.code.is(.nvUninitialized) == true)
        let skipped = try attempt(f, stolen, steps: [])
        #expect(skipped?.code.is(.policyFail) == true)
    }

    @Test func whenUnlockedKeyDoesNotUnsealWhileLocked() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))
        try await f.storage("wu", accessible: .whenUnlocked).setItem("k", "v")
        let stolen = try steal(f, service: "wu", accessible: .whenUnlocked)
        try await f.device.lock()
        #expect(try attempt(f, stolen, steps: stolen.policy.steps)?.code.is(.policy) == true)
        // Asserting "locked" instead gives a digest the key was not sealed to.
        let lockedSteps = stolen.policy.steps.map {
            if case .nv(let i, let n, _, let o, let c) = $0 { PolicyStep.nv(index: i, name: n, operand: [0], offset: o, comparison: c) } else { $0 }
        }
        #expect(try attempt(f, stolen, steps: lockedSteps)?.code.is(.policyFail) == true)
    }

    @Test func theStateIndexCannotBeUnlockedWithoutThePasscode() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))
        try await f.device.lock()
        try checkTheStateIndexRefusesUnlockingWithoutThePasscode(f)
        #expect(try await f.device.status().lockState == .locked)
    }

    /// Its own connection, closed before the library connects again (swtpm serves one client at a time).
    func checkTheStateIndexRefusesUnlockingWithoutThePasscode(_ f: Fixture) throws {
        let context = try TPMContext(device: f.tpm.device)
        let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let descriptor = try #require(LockDescriptor(decoding: try context.readNV(
            try context.resource(forPersistent: DeviceLockLayout.descriptorIndex), size: DeviceLockLayout.descriptorSize)))
        let lockBranch = PolicyStep.authorizeDigest(keyName: descriptor.approval.keyName, policyRef: DeviceLockLayout.lockPolicyRef)
        let branches = [DeviceLockLayout.unlockBranch, lockBranch]

        // 1. The unlock branch without PolicySecret: PolicyOR refuses a digest that is no branch.
        let s1 = try context.startSession(.policy, saltKey: nil, continueSession: true)
        try context.policyCommandCode(s1, CommandCode.nvWrite)
        #expect(throws: TPMError.self) { try context.policyOR(s1, branches) }
        context.flush(s1)

        // 2. PolicySecret with a guessed PIN: the TPM refuses it (and counts it on the PIN index).
        try context.setAuth(pin, bytes("1111"))
        let auth = try context.startSession(.hmac, saltKey: srk, continueSession: true)
        let s2 = try context.startSession(.policy, saltKey: nil, continueSession: true)
        #expect(throws: TPMError.self) { try context.policySecret(s2, entity: pin, authSession: auth) }
        context.flush(s2); context.flush(auth)

        // 3. The once-approved lock policy cannot be bent into writing "unlocked".
        let statePublic = DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)
        let s3 = try context.startSession(.policy, saltKey: nil, continueSession: true)
        try context.policyCpHash(s3, statePublic.writeCpHash(data: DeviceLockLayout.unlocked, offset: 0, written: true))
        #expect(throws: TPMError.self) {
            try context.policyAuthorize(s3, approvedPolicy: DeviceLockLayout.lockPolicy(state: statePublic),
                                        policyRef: DeviceLockLayout.lockPolicyRef, keyPublic: descriptor.approval.keyPublic,
                                        keyName: descriptor.approval.keyName, signature: descriptor.approval.signatures[0])
        }
        context.flush(s3)
    }

    @Test func aKeyOfARemovedPasscodeStaysDeadInTheTPM() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))
        try await f.storage("wps", accessible: .whenPasscodeSetThisDeviceOnly).setItem("k", "v")
        let stolen = try steal(f, service: "wps", accessible: .whenPasscodeSetThisDeviceOnly)
        #expect(try attempt(f, stolen, steps: stolen.policy.steps) == nil)
        try await f.device.removePasscode(current: bytes("2580"))
        // The blobs were copied before the removal: the epoch counter moved, so they never open again.
        #expect(try attempt(f, stolen, steps: stolen.policy.steps)?.code.is(.policy) == true)
        try await f.device.setPasscode(bytes("2580"))
        #expect(try attempt(f, stolen, steps: stolen.policy.steps)?.code.is(.policy) == true)
    }

    @Test func nobodyWithoutThePasscodeCanRewriteTheDescriptorOrBumpTheEpoch() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))
        try checkTheLockIndicesRefuseWritesWithoutThePasscode(f)
        #expect(try await f.device.status().passcodeSet)
    }

    func checkTheLockIndicesRefuseWritesWithoutThePasscode(_ f: Fixture) throws {
        let context = try TPMContext(device: f.tpm.device)
        let descriptor = try context.resource(forPersistent: DeviceLockLayout.descriptorIndex)
        let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
        // Plain authValue writes are not allowed at all (POLICYWRITE only).
        #expect(throws: TPMError.self) { try context.writeNV(descriptor, data: [0], authHandle: descriptor, session: nil) }
        // A policy session without PolicySecret does not satisfy the write policy.
        let session = try context.startSession(.policy, saltKey: nil, continueSession: true)
        try context.policyCommandCode(session, CommandCode.nvIncrement)
        #expect(throws: TPMError.self) { try context.incrementNV(epoch, session: session) }
        context.flush(session)
    }
}

/// The device-lock layout computed offline matches what the TPM reports for the indices it holds.
@Suite("The device-lock layout against the TPM", .offThePool)
struct DeviceLockLayoutTests {
    @Test func theOfflineNamesOfAllFourIndicesMatchTheTPMs() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes("2580"))  // provisions, and writes every index
        try await f.device.lock()
        let context = try TPMContext(device: f.tpm.device)
        let descriptor = try #require(LockDescriptor(decoding: try context.readNV(
            try context.resource(forPersistent: DeviceLockLayout.descriptorIndex), size: DeviceLockLayout.descriptorSize)))
        let expected: [(UInt32, NVPublic)] = [
            (DeviceLockLayout.pinIndex, DeviceLockLayout.pinPublic),
            (DeviceLockLayout.stateIndex, DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)),
            (DeviceLockLayout.epochIndex, DeviceLockLayout.epochPublic),
            (DeviceLockLayout.descriptorIndex, DeviceLockLayout.descriptorPublic),
        ]
        for (index, pub) in expected {
            let tpmName = try context.name(of: try context.resource(forPersistent: index))
            #expect(tpmName == pub.name(written: true), "index 0x\(String(index, radix: 16))")
        }
    }
}
