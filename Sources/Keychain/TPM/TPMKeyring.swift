import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

/// The TPM side of the keychain: the SRK, the device lock, and sealing/unsealing wrapping keys.
///
/// Owned by the engine actor (ESAPI contexts are not thread-safe). Every transient object and
/// session is flushed on every path: a TPM without a resource manager (swtpm) has 3 object slots.
final class TPMKeyring {
    static let srkHandle: UInt32 = 0x8100_0001

    let context: TPMContext
    let store: Store
    private(set) var srk: TPMHandle
    private var stateNV: TPMHandle
    private(set) var epochNV: TPMHandle
    /// The descriptor as this operation last read or wrote it (its mark may be an interrupted change's).
    var descriptor: LockDescriptor
    /// Set when this operation finished an interrupted passcode removal (the engine drops its caches).
    var finishedRemoval = false
    /// The passcode state as this operation read or wrote it.
    var knownPasscodeSet: Bool?
    /// Manufacturer 'IBM ' is the reference implementation that swtpm runs: a software TPM.
    let isSoftwareTPM: Bool
    /// The PCRs `ThisDeviceOnly` keys are bound to: the selection the store recorded when it was set up.
    let pcrSelection: [Int]
    /// keychaind's saved contexts of wrapping keys (`Engine.savedContexts`): a Load becomes a ContextLoad.
    var savedContexts: [TPMContext.SealedBlob: TPMContext.SavedContext] = [:]
    /// Set when the TPM refused a saved context (it was reset since): the engine drops them all.
    private(set) var refusedContext = false


    /// - Parameters:
    ///   - answerTimeout: how long one TPM exchange may wait (the call's deadline less what it spent
    ///     before); errors name `configuration.tpmTimeout`, the call's whole deadline.
    ///   - flushLeftovers: flush what killed processes left (only while holding the TPM's turn).
    convenience init(device: TPMDevice, store: Store, configuration: KeychainConfiguration, answerTimeout: Duration? = nil,
                     flushLeftovers: Bool = false) throws(KeychainError) {
        try self.init(context: Self.connect(device, configuration: configuration, answerTimeout: answerTimeout),
                      store: store, configuration: configuration, flushLeftovers: flushLeftovers)
    }

    /// A new connection to the TPM at `device`.
    static func connect(_ device: TPMDevice, configuration: KeychainConfiguration,
                        answerTimeout: Duration? = nil) throws(KeychainError) -> TPMContext {
        do {
            return try TPMContext(device: device, timeout: answerTimeout ?? configuration.tpmTimeout)
        } catch {
            if error.timedOut { throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout, error) }
            throw KeychainError(.hardwareUnavailable,
                                "Cannot reach the TPM at \(device): check that it exists and that this user may open it "
                                + "(or pass --tcti / set KEYCHAIN_TCTI)", underlying: .tpm(error))
        }
    }

    /// One operation's keyring on `context`, a new connection or one kept from an earlier operation
    /// (keychaind's, `Engine.withKeyring`); the handles it uses are read from the store again.
    init(context: TPMContext, store: Store, configuration: KeychainConfiguration, flushLeftovers: Bool = false) throws(KeychainError) {
        self.context = context
        let device = context.device
        self.store = store
        if flushLeftovers {
            // Another process had a turn: its leftover check flushed every session, ours too, or this
            // one will. Forgotten, not flushed: the handle may be someone else's session by now.
            context.forgetKeptSession()
            do { try context.flushLeftovers() } catch {
                throw KeychainError(.hardwareUnavailable, "The TPM at \(device) refused to list or flush the sessions "
                                    + "and objects left by killed processes (\(error.command))", underlying: .tpm(error))
            }
        }
        // The owner authorization (device provisioning's), for what needs the owner hierarchy:
        // provisioning, the reader's persistent key, resetting the passcode count.
        do { try context.setAuth(TPMContext.owner, configuration.ownerAuthorization) } catch {
            throw KeychainError.invalidArgument("The owner authorization is longer than the TPM accepts")
        }
        let given = configuration.validPCRSelection
        var recorded = try Self.recordedPCRSelection(store)
        // A store that knows its TPM needs no TPM command to start: its handles are deserialized.
        if let srkTR = try Self.meta(store, StoreMeta.srkTR), let stateTR = try Self.meta(store, StoreMeta.stateTR),
           let epochTR = try Self.meta(store, StoreMeta.epochTR),
           let desc = try Self.meta(store, StoreMeta.lockDescriptor).flatMap(LockDescriptor.init(decoding:)),
           let manufacturer = try Self.meta(store, StoreMeta.manufacturer) {
            do {
                srk = try context.deserialize(srkTR)
                stateNV = try context.deserialize(stateTR)
                epochNV = try context.deserialize(epochTR)
                context.ownerSaltKey = srk  // owner commands in a session salted to the pinned SRK
            } catch {
                throw KeychainError(.dataCorrupted, "The store's TPM handles cannot be read", underlying: .tpm(error))
            }
            descriptor = desc
            isSoftwareTPM = manufacturer.starts(with: Array("IBM".utf8))
            if recorded == nil {
                // Set up before the selection was recorded: the PCRs it approved, else the given ones.
                let approved = (try Self.meta(store, StoreMeta.bootApproved)).flatMap(BootState.init(decoding:))?.values.keys.sorted()
                recorded = approved?.isEmpty == false ? approved : given ?? [7]
                do { try store.write { tx in try tx.setMeta(StoreMeta.pcrSelection, recorded!.map(UInt8.init)) } }
                catch let error as StoreError { throw KeychainError(store: error) } catch { throw KeychainError(.internal, "\(error)") }
            }
            pcrSelection = try Self.selection(recorded: recorded!, given: given)
            return
        }
        let selection = try Self.selection(recorded: recorded ?? given ?? [7], given: given)
        pcrSelection = selection
        (srk, stateNV, epochNV, descriptor, isSoftwareTPM) = try Self.provision(
            context: context, store: store, configuration: configuration, pcrSelection: selection)
        // The boot-state approval index, approving the boot state just recorded (BootApproval.swift).
        _ = try ensureBootApproval(selection: selection, initial: recordedBootState(selection))
    }

    /// The selection recorded at set-up, nil before it is (a new store, or one of an older version).
    static func recordedPCRSelection(_ store: Store) throws(KeychainError) -> [Int]? {
        guard let bytes = try meta(store, StoreMeta.pcrSelection), !bytes.isEmpty else { return nil }
        return bytes.map(Int.init)
    }

    /// The recorded selection, unless another was given: that is refused, naming both.
    static func selection(recorded: [Int], given: [Int]?) throws(KeychainError) -> [Int] {
        if let given, given != recorded {
            let (was, now) = (recorded.map(String.init).joined(separator: ","), given.map(String.init).joined(separator: ","))
            throw KeychainError.invalidArgument(
                "This keychain's PCR selection is \(was) (recorded when it was set up), not \(now): leave --pcrs out (or give "
                + "--pcrs \(was)); a keychain's ThisDeviceOnly items are bound to the one selection it was set up with")
        }
        return recorded
    }

    private static func meta(_ store: Store, _ name: String) throws(KeychainError) -> [UInt8]? {
        do { return try store.meta(name) } catch { throw KeychainError(store: error) }
    }

    // MARK: Provisioning

    /// Makes the SRK and the device-lock indices when absent, and records them in the store.
    private static func provision(context: TPMContext, store: Store, configuration: KeychainConfiguration, pcrSelection: [Int])
        throws(KeychainError) -> (TPMHandle, TPMHandle, TPMHandle, LockDescriptor, Bool) {
        do {
            try context.setAuth(TPMContext.owner, configuration.ownerAuthorization)
            let srk: TPMHandle
            if let existing = try? context.resource(forPersistent: srkHandle) {
                srk = existing
            } else {
                srk = try context.provisionSRK(at: srkHandle)
            }
            let srkName = try context.name(of: srk)
            if let pinned = try store.meta(StoreMeta.srkName), pinned != srkName {
                throw KeychainError(.hardwareUnavailable,
                                    "The TPM's storage root key at 0x81000001 is not the one this store was made with: "
                                    + "the TPM was cleared or replaced, and the items sealed to the old one cannot be opened")
            }
            context.ownerSaltKey = srk  // from here, owner commands in a session salted to it
            let descriptor = try provisionDeviceLock(context: context, srk: srk, configuration: configuration)
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
            let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            // Beside our descriptor, the other indices must be ours too (attributes and policies), never
            // someone else's at our handles. The state index is unwritten after each TPM reset.
            let statePublic = DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)
            for (handle, index, names) in [(state, DeviceLockLayout.stateIndex, [statePublic.name(written: true), statePublic.name(written: false)]),
                                           (epoch, DeviceLockLayout.epochIndex, [DeviceLockLayout.epochPublic.name(written: true)]),
                                           (pin, DeviceLockLayout.pinIndex, [DeviceLockLayout.pinPublic.name(written: true)])]
            where try !names.contains(context.name(of: handle)) {
                throw KeychainError(.hardwareUnavailable,
                                    "The TPM's NV index 0x0\(String(index, radix: 16)) is not the device-lock index this library "
                                    + "defines (other attributes or policy): someone else's index at our handle; the owner must "
                                    + "undefine it (tpm2_nvundefine) before this TPM can hold a keychain")
            }
            let manufacturer = try context.property(TPMContext.propertyManufacturer).bigEndianBytes
            let srkTR = try context.serialize(srk)
            let stateTR = try context.serialize(state)
            let epochTR = try context.serialize(epoch)
            let pinTR = try context.serialize(pin)
            let bootState = try BootState.read(context, pcrSelection)
            try store.write { tx in
                try tx.setMeta(StoreMeta.bootState, bootState.encoded())
                try tx.setMeta(StoreMeta.pcrSelection, pcrSelection.map(UInt8.init))
                try tx.setMeta(StoreMeta.srkTR, srkTR)
                try tx.setMeta(StoreMeta.srkName, srkName)
                try tx.setMeta(StoreMeta.stateTR, stateTR)
                try tx.setMeta(StoreMeta.epochTR, epochTR)
                try tx.setMeta(StoreMeta.pinTR, pinTR)
                try tx.setMeta(StoreMeta.lockDescriptor, descriptor.encoded())
                try tx.setMeta(StoreMeta.manufacturer, manufacturer)
            }
            return (srk, state, epoch, descriptor, manufacturer.starts(with: Array("IBM".utf8)))
        } catch let error as KeychainError {
            throw error
        } catch let error as TPMError {
            if error.code.is(.badAuth) || error.code.is(.authFail) || error.code.is(.lockout) {
                throw KeychainError(.authenticationFailed,
                                    "The TPM refused the owner authorization (\(error.command)): give the one set at device "
                                    + "provisioning (keychainctl init --owner-auth-file FILE)", underlying: .tpm(error))
            }
            if let full = Self.noRoom(error, doing: "provision the TPM") { throw full }
            throw KeychainError(.hardwareUnavailable,
                                "Cannot provision the TPM (\(error.command)): NV space may be full, or the owner hierarchy disabled",
                                underlying: .tpm(error))
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Defines the four device-lock indices if the descriptor is absent (a crash half-way is redone).
    private static func provisionDeviceLock(context: TPMContext, srk: TPMHandle,
                                            configuration: KeychainConfiguration) throws(TPMError) -> LockDescriptor {
        // Only our descriptor (our attributes and write policy), once written, is read. One defined but
        // never written (a provisioning killed before its NV_Write), or someone else's, is remade.
        if let descriptorNV = try? context.resource(forPersistent: DeviceLockLayout.descriptorIndex),
           try context.name(of: descriptorNV) == DeviceLockLayout.descriptorPublic.name(written: true) {
            let bytes = try context.readNV(descriptorNV, size: DeviceLockLayout.descriptorSize)
            if let descriptor = LockDescriptor(decoding: bytes) { return descriptor }
        }
        // Start clean: without the descriptor the approval key of an old state index is lost for good.
        for index in [DeviceLockLayout.descriptorIndex, DeviceLockLayout.stateIndex,
                      DeviceLockLayout.pinIndex, DeviceLockLayout.epochIndex] {
            if let old = try? context.resource(forPersistent: index) { try context.undefineNV(old) }
        }
        let approval = try context.approveOnce(parent: srk, policyRef: DeviceLockLayout.lockPolicyRef) { keyName in
            [DeviceLockLayout.lockPolicy(state: DeviceLockLayout.statePublic(approvalKeyName: keyName))]
        }
        let pin = try context.defineNV(DeviceLockLayout.pinPublic, auth: nil)
        try context.writeNV(pin, data: UInt32(0).bigEndianBytes + configuration.passcodeRetryLimit.bigEndianBytes,
                            authHandle: TPMContext.owner, session: nil)
        _ = try context.defineNV(DeviceLockLayout.statePublic(approvalKeyName: approval.keyName), auth: nil)
        let epoch = try context.defineNV(DeviceLockLayout.epochPublic, auth: nil)
        // No passcode yet: the empty one satisfies the indices' PolicySecret.
        try withPasscode(nil, command: CommandCode.nvIncrement, context: context, srk: srk) { policy throws(TPMError) in
            try context.incrementNV(epoch, session: policy)
        }
        let descriptor = LockDescriptor(mark: .none, approval: approval)
        let descriptorNV = try context.defineNV(DeviceLockLayout.descriptorPublic, auth: nil)
        try withPasscode(nil, command: CommandCode.nvWrite, context: context, srk: srk) { policy throws(TPMError) in
            try context.writeNV(descriptorNV, data: descriptor.encoded(), authHandle: descriptorNV, session: policy)
        }
        return descriptor
    }

    /// Runs `body` with a policy session that proved the passcode (PolicySecret on the PIN index,
    /// in a salted HMAC session) for `command`: the write policy of the epoch and descriptor indices.
    static func withPasscode(_ passcode: SecureBytes?, command: UInt32, context: TPMContext, srk: TPMHandle,
                             _ body: (TPMHandle) throws(TPMError) -> Void) throws(TPMError) {
        let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
        try context.setAuth(pin, passcode)
        defer { try? context.setAuth(pin, nil) }
        try context.withSession(.hmac, saltKey: srk) { auth throws(TPMError) in
            try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                try context.run(DeviceLockLayout.passcodeSteps(command), on: policy, nvIndex: Self.noIndex,
                                other: { _ throws(TPMError) in try context.policySecret(policy, entity: pin, authSession: auth) })
                try body(policy)
            }
        }
    }

    /// The device-lock policies name no NV index in a step.
    static func noIndex(_ index: UInt32) throws(TPMError) -> TPMHandle {
        throw TPMError(command: "policy step on NV index 0x\(String(index, radix: 16))", code: .handle)
    }

    var stateName: [UInt8] { DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName).name(written: true) }

    // MARK: Wrapping keys

    /// Seals a wrapping key's secret half for `accessible` (one salted session, one Create).
    /// `keyRef` names the key in its access-control branch (`SealPolicy.keyRef`).
    func seal(_ secret: SecureBytes, accessible: Accessible, pcrs: [Int], biometry: SealPolicy.BiometryBinding? = nil,
              passcode: Bool = false, keyRef: [UInt8], authValidity: Int? = nil) throws(KeychainError) -> (TPMContext.SealedBlob, SealPolicy) {
        do {
            var policy = SealPolicy(availability: .init(accessible), stateName: stateName, biometry: biometry,
                                    passcode: passcode ? true : nil, keyRef: keyRef, authValidity: authValidity)
            if accessible.isThisDeviceOnly {
                let selection = PCRSelection(pcrs).indices
                policy.pcrs = selection
                if let vendorKey = vendorKeyPublic() {
                    try checkVendorBootState(selection: selection)
                    policy.bootVendorKeyName = try TPMContext.name(ofPublic: vendorKey)
                } else if let name = try ensureBootApproval(selection: selection, initial: recordedBootState(selection)) {
                    try checkApprovedBootState(selection: selection)
                    policy.bootApprovalName = name
                } else {
                    // No approval index and no owner authorization to make one: literal values, as before.
                    let current = try BootState.read(context, pcrs)
                    try checkBootState(current)
                    policy.pcrDigest = sha256(selection.flatMap { current.values[$0]! })
                }
            }
            if accessible.requiresPasscode {
                guard try passcodeIsSet() else {
                    throw KeychainError(.passcodeNotSet,
                                        "accessible 'whenPasscodeSetThisDeviceOnly' needs a device passcode: "
                                        + "set one first (keychainctl passcode set)")
                }
                policy.passcodeEpoch = try currentPasscodeEpoch()
            } else if !policy.branches.isEmpty {
                // Every access control needs the passcode (seed: PASSCODE_NOT_SET for every value), and
                // removing it ends them all, as Android's lock-screen removal and iOS do: the key is
                // bound to the passcode epoch that the removal bumps, so it dies in the TPM.
                policy.passcodeEpoch = try currentPasscodeEpoch()
            }
            let blob = try seal(secret, policy: policy)
            policy.creation = blob.creation
            return (blob, policy)
        } catch let error as KeychainError {
            throw error
        } catch let error as TPMError {
            throw diagnose(error, doing: "seal a wrapping key")
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Seals `secret` to a policy as it is (one salted session, one Create). The blob carries the
    /// key's creation, which the caller stores in the policy (`SealPolicy.creation`).
    func seal(_ secret: SecureBytes, policy: SealPolicy) throws(KeychainError) -> TPMContext.SealedBlob {
        let digest = policy.digest
        do {
            return try context.withSession(.hmac, saltKey: srk, decryptCommand: true) { session throws(TPMError) in
                try context.seal(secret, parent: srk, policy: digest, fixed: policy.fixedToThisTPM,
                                 userWithAuth: digest.isEmpty, session: session)
            }
        } catch {
            throw diagnose(error, doing: "seal a wrapping key")
        }
    }

    /// The boot state recorded when the store was set up, over `selection` (nil when a PCR is missing).
    func recordedBootState(_ selection: [Int]) -> BootState? {
        guard let recorded = (try? store.meta(StoreMeta.bootState)).flatMap({ $0 }).flatMap(BootState.init(decoding:)),
              selection.allSatisfy({ recorded.values[$0] != nil }) else { return nil }
        return BootState(values: recorded.values.filter { selection.contains($0.key) })
    }

    /// Never seals to a state the device does not boot into (seed: never store an item with less): PCRs
    /// extended since boot would make the key die at the next reboot. A PCR first selected after
    /// provisioning (or a store provisioned before this check) is recorded at its first seal.
    private func checkBootState(_ current: BootState) throws(KeychainError) {
        var expected = try Self.meta(store, StoreMeta.bootState).flatMap(BootState.init(decoding:)) ?? BootState(values: [:])
        let changed = current.values.keys.sorted().filter { pcr in
            expected.values[pcr].map { $0 != current.values[pcr] } ?? false
        }
        guard changed.isEmpty else {
            let list = changed.map(String.init).joined(separator: ", ")
            throw KeychainError(.deviceStateChanged,
                                "PCR \(list) no longer holds the value recorded when this keychain was set up: it was extended "
                                + "since boot, or the boot configuration changed. A ThisDeviceOnly item sealed now would be lost "
                                + "at the next reboot, so nothing was stored. Reboot and write again; items written before are kept")
        }
        let unrecorded = current.values.filter { expected.values[$0.key] == nil }
        guard !unrecorded.isEmpty else { return }
        expected.values.merge(unrecorded) { old, _ in old }
        do { try store.write { tx in try tx.setMeta(StoreMeta.bootState, expected.encoded()) } } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Unseals a wrapping key: StartAuthSession, Load, the policy steps, Unseal, FlushContext.
    /// The session is salted with the SRK and encrypts the response: the key never crosses the bus in clear.
    /// What proves the user for a key behind an access control.
    enum Authorization {
        case none
        /// The reader matched a finger; it signs the session nonce. With `window` > 0 seconds, the
        /// TPM also returns a ticket that stands in for this signature until then (`authValidity`),
        /// for this key only (its policyRef names it); never for a key that `acceptsTickets` not.
        case finger(FingerprintReader, window: Int32)
        case passcode(SecureBytes, window: Int32)
        /// A ticket from an earlier authentication, still in its window.
        case ticket(StoredTicket)
    }

    /// A policy ticket as the store keeps it, with the branch it stands for.
    struct StoredTicket: Codable {
        var branch: String
        var ticket: PolicyTicket
        /// When the window ends (ms since 1970): a hint; the TPM decides.
        var expires: Int64
        /// When it was made (ms since 1970), so a read asking for a shorter window uses it only within
        /// that; absent in tickets saved before.
        var issued: Int64?
    }

    /// The ticket the last `unseal` obtained, if its authorization asked for one.
    private(set) var issuedTicket: StoredTicket?

    /// - Parameter load: loads the object under another parent than the SRK (an imported bundle under the EK).
    func unseal(_ blob: TPMContext.SealedBlob, policy: SealPolicy, authorization: Authorization = .none,
                load: ((TPMContext) throws(TPMError) -> TPMHandle)? = nil) throws(KeychainError) -> SecureBytes {
        do {
            guard try TPMContext.authPolicy(ofPublic: blob.publicArea) == policy.digest else {
                throw KeychainError(.dataCorrupted, "A wrapping key's stored policy does not match its sealed object")
            }
        } catch let error as KeychainError { throw error } catch {
            throw KeychainError(.dataCorrupted, "A wrapping key's sealed object cannot be decoded", underlying: .other("\(error)"))
        }
        // keychaind on a chip: the answer encrypted by the kept session instead of a salted policy
        // session of its own. A key with no policy keeps its salted HMAC session per read: libtpms
        // drops a second session after an Unseal authorized by an HMAC session (seen in 4e90ffd).
        guard context.keepsSession && !policy.digest.isEmpty && load == nil else {
            return try unsealOnce(blob, policy: policy, authorization: authorization, load: load, kept: false)!
        }
        if let secret = try unsealOnce(blob, policy: policy, authorization: authorization, load: nil, kept: true) {
            return secret
        }
        // The TPM refused the kept session before the Unseal ran (flushed by another process's turn or
        // a reset, or replaced at its handle by another program's): once more, with a new one.
        context.forgetKeptSession()
        guard let secret = try unsealOnce(blob, policy: policy, authorization: authorization, load: nil, kept: true) else {
            context.forgetKeptSession()
            throw KeychainError(.hardwareUnavailable, "The TPM refused keychaind's new salted session for the Unseal twice")
        }
        return secret
    }

    /// One Load (or ContextLoad), policy and Unseal. With `kept`, nil when the TPM refused the kept
    /// session: the Unseal did not run, and nothing was answered.
    private func unsealOnce(_ blob: TPMContext.SealedBlob, policy: SealPolicy, authorization: Authorization,
                            load: ((TPMContext) throws(TPMError) -> TPMHandle)?, kept: Bool) throws(KeychainError) -> SecureBytes? {
        var step = "StartAuthSession"
        do throws(TPMError) {
            // The session and the object are flushed at the end of this scope, but a session the Unseal
            // closed (continueSession clear); the kept session is the connection's, in no scope.
            return try context.withTransient { () throws(TPMError) -> SecureBytes? in
                let session = try context.startSession(policy.digest.isEmpty ? .hmac : .policy, saltKey: kept ? nil : srk,
                                                       encryptResponse: !kept)
                step = "Load"
                let object = try loadForUnseal(blob, load: load, step: &step)
                try context.run(policy.allSteps, on: session, nvIndex: { index throws(TPMError) in
                    switch index {
                    case DeviceLockLayout.epochIndex: epochNV
                    case DeviceLockLayout.stateIndex: stateNV
                    default: try bootApprovalIndex()
                    }
                }, willRun: { policyStep in
                    switch policyStep {
                    case .authorize, .signed, .secret: return  // named by their runners, once they reach the TPM
                    case .or: step = "PolicyOR"
                    case .pcr: step = "PolicyPCR"
                    case .authorizeNV: step = "PolicyAuthorizeNV"
                    case .nv(let index, _, _, _, _): step = index == DeviceLockLayout.epochIndex ? "PolicyNV(epoch)" : "PolicyNV(state)"
                    default: step = "policy"
                    }
                }, branch: { _ throws(TPMError) in
                    try branch(proving: authorization, policy: policy)
                }, other: { policyStep throws(TPMError) in
                    if case .authorize(let keyName, _) = policyStep {
                        try runVendorSteps(session, policy: policy, keyName: keyName, step: &step)
                    } else {
                        try prove(policyStep, on: session, policy: policy, authorization: authorization, step: &step)
                    }
                })
                var encryptSession: TPMHandle?
                if kept {
                    step = "StartAuthSession"
                    encryptSession = try context.keptSession(saltKey: srk)
                }
                // A ticket of another key (or an ended window) passes PolicyTicket but leaves another digest.
                if case .ticket = authorization { step = "Unseal(ticket)" } else { step = "Unseal" }
                do throws(TPMError) {
                    return try context.unseal(object, session: session, encryptSession: encryptSession)
                } catch where kept && TPMContext.refusedKeptSession(error) {
                    return nil
                }
            }
        } catch {
            throw mapUnsealError(error, step: step, policy: policy)
        }
    }

    /// The sealed object loaded for an Unseal: by `load` (another parent), from its context saved at
    /// keychaind's start (ContextLoad, on a chip), or from its blob under the SRK.
    private func loadForUnseal(_ blob: TPMContext.SealedBlob, load: ((TPMContext) throws(TPMError) -> TPMHandle)?,
                               step: inout String) throws(TPMError) -> TPMHandle {
        if let load { return try load(context) }
        guard let saved = savedContexts[TPMContext.SealedBlob(publicArea: blob.publicArea, privateArea: blob.privateArea)] else {
            return try context.load(blob, parent: srk)
        }
        step = "ContextLoad"
        do {
            return try context.loadContext(saved)
        } catch where !error.timedOut && !error.isConnectionFailure {
            // Saved before a TPM reset: refused by the TPM's integrity check. The blob loads as always.
            refusedContext = true
            savedContexts = [:]  // saved before the same reset: a retry in this operation loads
            step = "Load"
            return try context.load(blob, parent: srk)
        }
    }

    /// Which branch of the access-control step `authorization` proves (a ticket stands in for the
    /// branch it was made for); the policy's branches are the step's, in order.
    private func branch(proving authorization: Authorization, policy: SealPolicy) throws(TPMError) -> Int {
        issuedTicket = nil
        switch authorization {
        case .finger:
            guard let i = policy.branches.firstIndex(of: .biometry) else { throw TPMError(command: "reader signature", code: .policyFail) }
            return i
        case .passcode:
            guard let i = policy.branches.firstIndex(of: .passcode) else { throw TPMError(command: "passcode branch", code: .policyFail) }
            return i
        case .ticket(let stored):
            guard policy.acceptsTickets else { throw TPMError(command: "ticket for a key that takes none", code: .policyFail) }
            return policy.branches.firstIndex(of: stored.branch == "passcode" ? .passcode : .biometry) ?? 0
        case .none:
            throw TPMError(command: "authorization", code: .policyFail)
        }
    }

    /// Runs the chosen branch's step with what `authorization` holds: the reader's signature
    /// (PolicySigned), the passcode (PolicySecret), or a ticket standing in for either (PolicyTicket).
    private func prove(_ proof: PolicyStep, on session: TPMHandle, policy: SealPolicy, authorization: Authorization,
                       step: inout String) throws(TPMError) {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        switch (proof, authorization) {
        case (.signed(_, let policyRef), .finger(let reader, let window)):
            let window = policy.acceptsTickets ? window : 0
            guard let binding = policy.biometry, let keyTR = reader.state?.keyTR,
                  let hmac = reader.sign(nonceTPM: try context.nonceTPM(session), for: binding, keyRef: policy.keyRef,
                                         window: policy.authValidity, expiration: -window) else {
                throw TPMError(command: "reader signature", code: .policyFail)
            }
            step = "PolicySigned"
            let readerKey = try context.deserialize(keyTR)
            let ticket = try context.policySigned(session, authObject: readerKey, nonceTPM: try context.nonceTPM(session),
                                                  policyRef: policyRef, hmac: hmac, expiration: -window)
            issuedTicket = ticket.map { StoredTicket(branch: "biometry", ticket: $0, expires: now + Int64(window) * 1000, issued: now) }
        case (.secret(_, _, let policyRef), .passcode(let pin, let window)):
            let window = policy.acceptsTickets ? window : 0
            step = "PolicySecret"
            let pinIndex = try pinResource()
            try context.setAuth(pinIndex, pin)
            defer { try? context.setAuth(pinIndex, nil) }
            // A salted HMAC session: the passcode is the HMAC key, never sent, and a capture can't be brute-forced.
            // Started with continueSession clear: the PolicySecret closes it, or the caller's scope flushes it.
            let auth = try context.startSession(.hmac, saltKey: srk)
            let ticket = try context.policySecret(session, entity: pinIndex, authSession: auth, policyRef: policyRef,
                                                  expiration: -window)
            issuedTicket = ticket.map { StoredTicket(branch: "passcode", ticket: $0, expires: now + Int64(window) * 1000, issued: now) }
        case (.signed, .ticket(let stored)), (.secret, .ticket(let stored)):
            step = "PolicyTicket"
            try context.policyTicket(session, stored.ticket)
        default:
            throw TPMError(command: "authorization", code: .policyFail)
        }
    }

    /// Whether the persistent object at `handle` is the one named `name` (one ReadPublic).
    func holdsPersistent(_ handle: UInt32, named name: [UInt8]) -> Bool {
        guard let object = try? context.resource(forPersistent: handle) else { return false }
        return (try? context.name(of: object)) == name
    }

    private func pinResource() throws(TPMError) -> TPMHandle {
        if let tr = try? store.meta(StoreMeta.pinTR), let handle = try? context.deserialize(tr) { return handle }
        return try context.resource(forPersistent: DeviceLockLayout.pinIndex)
    }

    private func mapUnsealError(_ error: TPMError, step: String, policy: SealPolicy) -> KeychainError {
        let code = error.code
        switch step {
        case "PolicySecret" where code.is(.badAuth) || code.is(.authFail):
            return KeychainError(.authenticationFailed, "Wrong passcode", underlying: .tpm(error))
        case "PolicySecret" where code.is(.authUnavailable):
            return KeychainError(.lockout, "Too many wrong passcodes: the TPM refuses the passcode until the owner "
                                 + "resets its count (keychainctl passcode reset-tries)", underlying: .tpm(error))
        case "PolicyTicket", "Unseal(ticket)":
            return KeychainError(.authenticationFailed, "The authentication window has ended (or the TPM was reset)",
                                 underlying: .tpm(error))
        case "PolicySigned":
            // Not KEY_INVALIDATED: that removes the item, and a changed reader is found before this.
            return KeychainError(.authenticationFailed, "The TPM refused the fingerprint reader's signature",
                                 underlying: .tpm(error))
        case "PolicyPCR" where code.is(.value):
            return KeychainError(.deviceStateChanged,
                                 "The device state changed: PCRs this ThisDeviceOnly item is bound to no longer hold "
                                 + "the values it was sealed to. The item is kept; it opens again if they return",
                                 underlying: .tpm(error))
        case "PolicyAuthorize(choice)":
            return vendorStateError("no installed boot policy was signed for the current PCR values", reading: true, underlying: error)
        case "PolicyNV(generation)" where code.is(.policy):
            return vendorStateError("the installed boot policy's generation was revoked (boot-state revoke-before)", reading: true,
                                    underlying: error)
        case "PolicyAuthorize" where code.is(.value) || code.is(.policyFail):
            return vendorStateError("the PCRs do not hold the values of the installed signed policy", reading: true, underlying: error)
        case "PolicyAuthorizeNV" where code.is(.value):
            return unapprovedBootState(current: try? BootState.read(context, policy.pcrs ?? []), reading: true, underlying: error)
        case "PolicyAuthorizeNV" where code.is(.commandCode):
            // Sealed before this version asked the TPM (implementsPolicyAuthorizeNV): no TPM of that model opens it.
            return KeychainError(.unsupported,
                                 "This ThisDeviceOnly item was sealed to an approved boot state (TPM2_PolicyAuthorizeNV), a "
                                 + "command this TPM does not implement (a TPM of spec revision 1.16): it cannot be opened on "
                                 + "this TPM. Delete it and write it again: ThisDeviceOnly items written now are sealed to the "
                                 + "boot state recorded at set-up", underlying: .tpm(error))
        case "PolicyAuthorizeNV" where code.is(.nvUninitialized) || code.is(.handle):
            return KeychainError(.deviceStateChanged,
                                 "No boot state is approved on this TPM (its approval index is missing or empty): the "
                                 + "ThisDeviceOnly item is kept; approve the current state if you trust it: keychainctl "
                                 + "--owner-auth-file FILE boot-state approve", underlying: .tpm(error))
        case "PolicyNV(state)" where code.is(.nvUninitialized):
            return KeychainError(.interactionNotAllowed,
                                 "The device has not been unlocked since the TPM started: unlock it first (keychainctl unlock)",
                                 underlying: .tpm(error))
        case "PolicyNV(state)" where code.is(.policy):
            return KeychainError(.interactionNotAllowed, "The device is locked: unlock it first (keychainctl unlock)",
                                 underlying: .tpm(error))
        case "PolicyNV(epoch)" where code.is(.policy) && !policy.branches.isEmpty:
            return KeychainError(.keyInvalidated,
                                 "The device passcode was removed since this item was written, which ends every item "
                                 + "behind an access control (and the enrolled fingers); the item was removed",
                                 underlying: .tpm(error))
        case "PolicyNV(epoch)" where code.is(.policy):
            return KeychainError(.keyInvalidated,
                                 "The device passcode was removed since this item was written, which destroys "
                                 + "'whenPasscodeSetThisDeviceOnly' items; the item was removed", underlying: .tpm(error))
        case "Load" where code.is(.integrity) || code.is(.size) || code.is(.value):
            if srkChanged() { return srkError(error) }
            return KeychainError(.dataCorrupted, "A wrapping key's sealed object failed the TPM's integrity check",
                                 underlying: .tpm(error))
        case "Unseal" where code.is(.policyFail):
            return KeychainError(.dataCorrupted, "A wrapping key's policy did not verify", underlying: .tpm(error))
        default:
            return diagnose(error, doing: step)
        }
    }

    /// For failures that may mean the TPM is not the one we provisioned: check the SRK's name.
    func diagnose(_ error: TPMError, doing what: String) -> KeychainError {
        if error.isConnectionFailure {
            return KeychainError(.hardwareUnavailable, "Lost the connection to the TPM at \(context.device) while trying to \(what)",
                                 underlying: .tpm(error))
        }
        if error.code.is(.commandCode) {
            return KeychainError(.unsupported, "The TPM does not implement \(error.command), needed to \(what) (TPM_RC_COMMAND_CODE: "
                                 + "a TPM of an older spec revision)", underlying: .tpm(error))
        }
        if let full = Self.noRoom(error, doing: what) { return full }
        if srkChanged() { return srkError(error) }
        if error.command.hasPrefix("EvictControl"), error.code.is(.badAuth) || error.code.is(.authFail) {
            // A reader's persistent key needs the owner authorization init set; keychaind has it only when given.
            return KeychainError(.authenticationFailed,
                                 "The TPM refused the owner authorization to \(what) (\(error.command)): init set one, and this "
                                 + "process was not given it. Give the file init wrote (--owner-auth-out): keychainctl "
                                 + "--owner-auth-file FILE reader …; through keychaind, start it with --owner-auth-file FILE "
                                 + "(under systemd: LoadCredential=owner.auth:FILE in keychaind.service)", underlying: .tpm(error))
        }
        return KeychainError(.hardwareUnavailable, "The TPM refused to \(what) (\(error.command))", underlying: .tpm(error))
    }

    /// OBJECT_MEMORY or SESSION_MEMORY: from the TPM (other programs hold its slots), or from a resource
    /// manager that allows one client fewer than the keychain holds at once. Nil for other codes.
    static func noRoom(_ error: TPMError, doing what: String) -> KeychainError? {
        guard error.code.is(.objectMemory) || error.code.is(.sessionMemory) else { return nil }
        let kind = error.code.is(.objectMemory) ? "objects" : "sessions"
        if error.code.isResourceManagerRefusal {
            return KeychainError(.hardwareUnavailable, "The TPM's resource manager allows this process fewer \(kind) at once than it "
                                 + "needs to \(what) (\(error.command)): the keychain holds up to 3 objects and 3 sessions at once, "
                                 + "as the kernel's /dev/tpmrm0 allows; start tpm2-abrmd with --max-transients and --max-sessions "
                                 + "of 3 or more", underlying: .tpm(error))
        }
        return KeychainError(.hardwareUnavailable, "The TPM has no room for more \(kind) to \(what) (\(error.command)): "
                             + "other programs hold its slots", underlying: .tpm(error))
    }

    private func srkError(_ error: TPMError) -> KeychainError {
        KeychainError(.hardwareUnavailable,
                      "The TPM's storage root key at 0x81000001 is missing or not the one this store was made with: "
                      + "the TPM was cleared or replaced, and items sealed to the old one cannot be opened",
                      underlying: .tpm(error))
    }

    private func srkChanged() -> Bool { srkState() != .pinned }

    /// The persistent SRK compared with the name pinned in the store at provisioning.
    func srkState() -> DeviceStatus.StorageRootKey {
        guard let pinned = try? store.meta(StoreMeta.srkName) else { return .pinned }
        do throws(TPMError) {
            let current = try context.resource(forPersistent: Self.srkHandle)
            return (try? context.name(of: current)) == pinned ? .pinned : .replaced
        } catch {
            // The TPM's HANDLE error: nothing there. Anything else: ESAPI, which already holds the pinned
            // SRK (deserialized from the store), refused a second name for the same handle: replaced.
            return error.code.is(.handle) ? .missing : .replaced
        }
    }

    // MARK: The device lock

    func currentPasscodeEpoch() throws(TPMError) -> UInt64 {
        UInt64(bigEndianBytes: try context.readNV(epochNV, size: 8)) ?? 0
    }

    enum LockState: String { case beforeFirstUnlock, locked, unlocked }

    func lockState() throws(KeychainError) -> LockState {
        do {
            let bytes = try context.readNV(stateNV, size: 1)
            return bytes == DeviceLockLayout.unlocked ? .unlocked : .locked
        } catch where error.code.is(.nvUninitialized) {
            return .beforeFirstUnlock
        } catch {
            throw diagnose(error, doing: "read the lock state")
        }
    }

    /// Without a passcode the device counts as unlocked (as on iOS): unlocks it with the empty passcode.
    /// - Returns: false, and nothing done, when a passcode is set.
    func unlockIfNoPasscode() throws(KeychainError) -> Bool {
        guard try !passcodeIsSet() else { return false }
        try unlock(passcode: nil)
        return true
    }

    /// Writes "unlocked", authorized by the passcode through PolicySecret in a salted session:
    /// the TPM checks the PIN and counts wrong ones on its PIN index.
    func unlock(passcode: SecureBytes?) throws(KeychainError) {
        do {
            try attemptUnlock(passcode)
        } catch where error.command == "NV_Write" && error.code.is(.badAuth) {
            // The passcode was accepted (PolicySecret passed), but another process wrote the state
            // index between our reading its public area and our write: its name (TPMA_NV_WRITTEN)
            // changed under the session's HMAC. Once more, with the public area read again.
            do { try attemptUnlock(passcode) } catch { throw passcodeError(error, doing: "unlock") }
        } catch {
            throw passcodeError(error, doing: "unlock")
        }
    }

    private func attemptUnlock(_ passcode: SecureBytes?) throws(TPMError) {
        do {
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)  // reads the public area now
            try context.setAuth(pin, passcode)
            defer { try? context.setAuth(pin, nil) }
            try context.withSession(.hmac, saltKey: srk) { auth throws(TPMError) in
                try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                    try context.run(DeviceLockLayout.unlockSteps(approvalKeyName: descriptor.approval.keyName), on: policy,
                                    nvIndex: Self.noIndex,
                                    other: { _ throws(TPMError) in try context.policySecret(policy, entity: pin, authSession: auth) })
                    try context.writeNV(state, data: DeviceLockLayout.unlocked, authHandle: state, session: policy)
                }
            }
        }
    }

    /// Writes "locked" through the once-approved policy: no secret needed, and none could unlock.
    func lock() throws(KeychainError) {
        do {
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
            do {
                _ = try context.readNV(state, size: 1)
            } catch where error.code.is(.nvUninitialized) {
                return  // before the first unlock: locked already
            }
            let statePublic = DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)
            let approval = descriptor.approval
            try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                try context.run(DeviceLockLayout.lockSteps(approvalKeyName: approval.keyName), on: policy, nvIndex: Self.noIndex,
                                other: { _ throws(TPMError) in
                    try context.policyAuthorize(policy, approvedPolicy: DeviceLockLayout.lockPolicy(state: statePublic),
                                                policyRef: DeviceLockLayout.lockPolicyRef, keyPublic: approval.keyPublic,
                                                keyName: approval.keyName, signature: approval.signatures[0])
                })
                try context.writeNV(state, data: DeviceLockLayout.locked, authHandle: state, session: policy)
            }
        } catch {
            throw diagnose(error, doing: "lock the device")
        }
    }

    /// Resets the TPM's count of wrong passcodes (needs the owner authorization).
    func resetPasscodeTries(limit: UInt32) throws(KeychainError) {
        do {
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            try context.writeNV(pin, data: UInt32(0).bigEndianBytes + limit.bigEndianBytes,
                                authHandle: TPMContext.owner, session: nil)
        } catch {
            throw KeychainError(.authenticationFailed, "Cannot reset the passcode tries: the owner authorization was refused",
                                underlying: .tpm(error))
        }
    }

    func passcodeError(_ error: TPMError, doing what: String) -> KeychainError {
        if error.code.is(.badAuth) || error.code.is(.authFail) {
            return KeychainError(.authenticationFailed, "Wrong passcode: could not \(what)", underlying: .tpm(error))
        }
        if error.code.is(.authUnavailable) {
            return KeychainError(.lockout,
                                 "Too many wrong passcodes: the TPM refuses the passcode until the owner resets its "
                                 + "count (keychainctl passcode reset-tries)", underlying: .tpm(error))
        }
        return diagnose(error, doing: what)
    }
}

/// PCR values (SHA-256 bank) by index: the boot state a `ThisDeviceOnly` key may be sealed to.
struct BootState: Codable, Equatable {
    var values: [Int: [UInt8]]

    static func read(_ context: TPMContext, _ pcrs: [Int]) throws(TPMError) -> BootState {
        let selection = PCRSelection(pcrs)
        let values = try context.readPCRs(selection)
        return BootState(values: Dictionary(uniqueKeysWithValues: zip(selection.indices, values)))
    }

    init(values: [Int: [UInt8]]) { self.values = values }
    init?(decoding bytes: [UInt8]) {
        guard let state = try? JSONDecoder().decode(BootState.self, from: Data(bytes)) else { return nil }
        self = state
    }
    func encoded() -> [UInt8] { Array((try? JSONEncoder().encode(self)) ?? Data()) }
}
