import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

// Wrapping keys sealed to their policy and unsealed through it, with the access-control branch proven.
extension TPMKeyring {
    // MARK: Wrapping keys

    /// Seals a wrapping key's secret half for `accessible` (one salted session, one Create).
    /// `keyRef` names the key in its access-control branch (`SealPolicy.keyRef`).
    func seal(_ secret: SecureBytes, accessible: Accessible, pcrs: [Int], biometry: SealPolicy.BiometryBinding? = nil,
              passcode: Bool = false, keyRef: [UInt8], authValidity: Int? = nil) throws(KeychainError) -> (TPMContext.SealedBlob, SealPolicy) {
        return try diagnosing("seal a wrapping key") { () throws -> (TPMContext.SealedBlob, SealPolicy) in
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
}
