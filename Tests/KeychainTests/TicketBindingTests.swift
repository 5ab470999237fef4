import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// authValidity tickets (PolicyTicket) name the policyRef they were made for: each wrapping key's
/// access-control branch has its own, so a ticket stands in for the key it was made for only.
@Suite("authValidity tickets are bound to their key", .offThePool)
struct TicketBindingTests {
    static let pin = AccessControlTests.pin
    typealias Device = AccessControlTests.Device

    struct Stolen {
        let blob: TPMContext.SealedBlob
        let policy: SealPolicy
    }

    func steal(_ d: Device, service: String) throws -> Stolen {
        let store = try Store(directory: d.configuration.storeDirectory)
        let record = try #require(try store.wrappingKeys(service: service).first)
        return Stolen(blob: .init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate),
                      policy: try #require(SealPolicy.decode(record.policy)))
    }

    func storedTicket(_ d: Device, service: String) throws -> TPMKeyring.StoredTicket? {
        let store = try Store(directory: d.configuration.storeDirectory)
        let tag = try #require(try store.wrappingKeys(service: service).first).protection
        return try store.meta("ticket:\(service)/\(tag)").map { try JSONDecoder().decode(TPMKeyring.StoredTicket.self, from: Data($0)) }
    }

    /// The attacker's own ESAPI calls: the key's common steps, PolicyTicket with a stolen ticket,
    /// PolicyOR when the key has two branches, Unseal. Nil when it unsealed.
    func unseal(_ d: Device, _ stolen: Stolen, with ticket: PolicyTicket) throws -> TPMError? {
        let context = try TPMContext(device: d.tpm.device)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
        let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
        defer { context.flush(session) }
        let object = try context.load(stolen.blob, parent: srk)
        defer { context.flush(object) }
        do {
            let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            let approval = try context.resource(forPersistent: BootApprovalLayout.index)
            // The key's own steps, the ticket in place of its access-control branch (then PolicyOR).
            try context.run(stolen.policy.allSteps, on: session, nvIndex: { index in
                index == DeviceLockLayout.stateIndex ? state : index == DeviceLockLayout.epochIndex ? epoch : approval
            }, other: { _ throws(TPMError) in try context.policyTicket(session, ticket) })
            _ = try context.unseal(object, session: session)
            return nil
        } catch {
            return error
        }
    }

    @Test(arguments: [AccessControl.passcode, .biometryAny, .biometryAnyOrPasscode])
    func aTicketOfOneServiceIsRefusedByTheTPMForAnyOtherKey(control: AccessControl) async throws {
        let d = try await Device()
        let a = try d.storage(control, authValidity: 300, service: "A")
        try await a.setItem("k", "a")
        let targets = ["B": control, "CurrentSetOrPasscode": .biometryCurrentSetOrPasscode,
                       "CurrentSet": .biometryCurrentSet, "Passcode": .passcode]
        for (service, targetControl) in targets {
            try await d.storage(targetControl, service: service).setItem("k", service)
        }
        d.answers.push(control == .biometryAny ? .finger("thumb") : .passcode(bytes(Self.pin)))
        #expect(try await a.getItem("k") == "a")
        let stored = try #require(try storedTicket(d, service: "A"), "a read with authValidity keeps a ticket")
        #expect(stored.ticket.policyRef.count == 32, "the ticket names its key")
        // The control: the stolen ticket does open A's stored blob with raw ESAPI.
        #expect(try unseal(d, try steal(d, service: "A"), with: stored.ticket) == nil)
        for service in targets.keys.sorted() {
            let target = try steal(d, service: service)
            #expect(try unseal(d, target, with: stored.ticket) != nil, "A's ticket opened \(service)")
            // Relabelled with the target's own policyRef, the ticket's HMAC no longer verifies.
            var relabelled = stored.ticket
            relabelled.policyRef = target.policy.step(for: target.policy.branches[0]).policyRef
            let refused = try unseal(d, target, with: relabelled)
            #expect(refused?.code.is(.ticket) == true, "\(service): \(String(describing: refused?.code))")
        }
    }

    /// The same attack through the library: A's ticket copied into B's slot of the store.
    @Test func aTicketCopiedToAnotherServiceIsRefusedAndTheReadAsks() async throws {
        let d = try await Device()
        let a = try d.storage(.passcode, authValidity: 300, service: "A")
        let b = try d.storage(.passcode, authValidity: 300, service: "B")
        try await a.setItem("k", "a")
        try await b.setItem("k", "b")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await a.getItem("k") == "a")
        let store = try Store(directory: d.configuration.storeDirectory)
        let tag = try #require(try store.wrappingKeys(service: "A").first).protection
        let ticket = try #require(try store.meta("ticket:A/\(tag)"))
        try store.write { try $0.setMeta("ticket:B/\(tag)", ticket) }
        await d.device.dropCaches()
        let asked = d.answers.requests.count
        d.answers.push(.cancel)
        #expect(await code { try await b.getItem("k") } == .userCanceled, "B opened without its own authentication")
        #expect(d.answers.requests.count == asked + 1)
        // A's own ticket still opens A without a prompt: the window is real.
        #expect(try await a.getItem("k") == "a")
        #expect(d.answers.requests.count == asked + 1)
    }

    /// A passcode ticket from an item read must not stand in for the passcode of the device lock: the
    /// unlock branch and the epoch counter's policy use PolicySecret on the same PIN index.
    @Test func anItemsPasscodeTicketNeitherUnlocksTheDeviceNorBumpsTheEpoch() async throws {
        let d = try await Device()
        let a = try d.storage(.passcode, accessible: .afterFirstUnlock, authValidity: 300, service: "A")
        try await a.setItem("k", "a")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await a.getItem("k") == "a")
        let stored = try #require(try storedTicket(d, service: "A")).ticket
        try await d.device.lock()

        func attack(_ ticket: PolicyTicket) throws -> (unlock: TPMError?, bump: TPMError?) {
            let context = try TPMContext(device: d.tpm.device)
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
            let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            let descriptor = try #require(LockDescriptor(decoding: try context.readNV(
                try context.resource(forPersistent: DeviceLockLayout.descriptorIndex), size: DeviceLockLayout.descriptorSize)))
            let lockBranch = PolicyStep.authorizeDigest(keyName: descriptor.approval.keyName, policyRef: DeviceLockLayout.lockPolicyRef)
            var unlock: TPMError?, bump: TPMError?
            let s1 = try context.startSession(.policy, saltKey: nil, continueSession: true)
            do {
                try context.policyTicket(s1, ticket)
                try context.policyCommandCode(s1, CommandCode.nvWrite)
                try context.policyOR(s1, [DeviceLockLayout.unlockBranch, lockBranch])
                try context.writeNV(state, data: DeviceLockLayout.unlocked, authHandle: state, session: s1)
            } catch { unlock = error }
            context.flush(s1)
            let s2 = try context.startSession(.policy, saltKey: nil, continueSession: true)
            do {
                try context.policyTicket(s2, ticket)
                try context.policyCommandCode(s2, CommandCode.nvIncrement)
                try context.incrementNV(epoch, session: s2)
            } catch { bump = error }
            context.flush(s2)
            return (unlock, bump)
        }
        let refused = try attack(stored)
        #expect(refused.unlock != nil && refused.bump != nil)
        #expect(try await d.device.status().lockState == .locked)

        // The control: a ticket for the PIN with an empty policyRef (what every passcode ticket was
        // before tickets named their key) does both.
        let emptyRef: PolicyTicket = try {
            let context = try TPMContext(device: d.tpm.device)
            let srk = try context.resource(forPersistent: 0x8100_0001)
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            try context.setAuth(pin, bytes(Self.pin))
            let auth = try context.startSession(.hmac, saltKey: srk, continueSession: true)
            let session = try context.startSession(.policy, saltKey: nil, continueSession: true)
            defer { context.flush(session); context.flush(auth) }
            return try #require(try context.policySecret(session, entity: pin, authSession: auth, expiration: -300))
        }()
        let accepted = try attack(emptyRef)
        #expect(accepted.unlock == nil && accepted.bump == nil, "the control: such a ticket stands in for the passcode")
        #expect(try await d.device.status().lockState == .unlocked)
    }

    @Test func theReaderNeverSignsATicketForACurrentSetKey() async throws {
        let d = try await Device()
        let reader = try FingerprintReader(directory: d.configuration.readerDirectory!)
        let current = SealPolicy.BiometryBinding(keyName: reader.keyName!, tpmHandle: 0, enrollmentSet: reader.enrollmentSet,
                                                 currentSet: true)
        let any = SealPolicy.BiometryBinding(keyName: reader.keyName!, tpmHandle: 0, enrollmentSet: [], currentSet: false)
        let ref = [UInt8](repeating: 1, count: 32)
        #expect(reader.sign(nonceTPM: [1], for: current, keyRef: ref) != nil)
        #expect(reader.sign(nonceTPM: [1], for: current, keyRef: ref, expiration: -300) == nil)
        #expect(reader.sign(nonceTPM: [1], for: any, keyRef: ref, expiration: -300) != nil)
        // CurrentSet items take no authValidity window at all.
        #expect(throws: KeychainError.self) { try d.storage(.biometryCurrentSetOrPasscode, authValidity: 300) }
    }

    @Test func theKeyReferenceIsPinned() {
        // SHA-256("keychain-linux/wrapping-key-ref/v1" ‖ u32 len ‖ "svc" ‖ u32 len ‖ tag ‖ public key 32 × 0x42)
        let ref = SealPolicy.keyRef(service: "svc", protection: "whenUnlocked/passcode", publicKey: [UInt8](repeating: 0x42, count: 32))
        let domain = Array("keychain-linux/wrapping-key-ref/v1".utf8)
        let expected = sha256(domain + [0, 0, 0, 3] + Array("svc".utf8) + [0, 0, 0, 21] + Array("whenUnlocked/passcode".utf8)
                              + [UInt8](repeating: 0x42, count: 32))
        #expect(ref == expected)
        #expect(ref != SealPolicy.keyRef(service: "svc/whenUnlocked", protection: "passcode", publicKey: [UInt8](repeating: 0x42, count: 32)))
    }

    /// A key sealed before tickets were bound (empty policyRef) still opens, gets no ticket, and is
    /// sealed again with its own reference when it opens; then tickets work for it.
    @Test func aLegacyKeyOpensAndIsReboundToItsOwnReference() async throws {
        let d = try await Device()
        let tag = "whenUnlocked/passcode/300"  // where a write with a 300 s window goes
        let pair = Sodium.generateX25519()
        do {
            let store = try Store(directory: d.configuration.storeDirectory)
            let keyring = try TPMKeyring(device: d.tpm.device, store: store, configuration: d.configuration)
            let legacy = SealPolicy(availability: .whenUnlocked, stateName: keyring.stateName, passcode: true)
            let blob = try keyring.seal(pair.secretKey, policy: legacy)
            try store.write {
                try $0.putWrappingKey(WrappingKeyRecord(service: "legacy", protection: tag, publicKey: pair.publicKey,
                                                        sealedPublic: blob.publicArea, sealedPrivate: blob.privateArea,
                                                        policy: legacy.encoded(), created: 0))
            }
        }
        let storage = try d.storage(.passcode, accessible: .whenUnlocked, authValidity: 300, service: "legacy")
        try await storage.setItem("k", "v")
        let before = try steal(d, service: "legacy")
        #expect(before.policy.keyRef == nil, "the item was written under the legacy key")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await storage.getItem("k") == "v")
        #expect(try storedTicket(d, service: "legacy") == nil, "no ticket for a key that every legacy ticket opens")
        let after = try steal(d, service: "legacy")
        #expect(after.policy.keyRef == SealPolicy.keyRef(service: "legacy", protection: tag, publicKey: pair.publicKey))
        #expect(after.blob.privateArea != before.blob.privateArea)
        await d.device.dropCaches()
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await storage.getItem("k") == "v")
        #expect(try storedTicket(d, service: "legacy") != nil)
        await d.device.dropCaches()
        let asked = d.answers.requests.count
        #expect(try await storage.getItem("k") == "v")
        #expect(d.answers.requests.count == asked, "the ticket of the rebound key stands in for the passcode")
    }
}

extension PolicyStep {
    var policyRef: [UInt8] {
        switch self {
        case .secret(_, _, let ref), .signed(_, let ref): ref
        default: []
        }
    }
}
