import KeychainCore
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

/// Local approval of boot states (issue 12): `ThisDeviceOnly` keys are sealed not to PCR values but to
/// "whatever PCR policy the approval index holds" (TPM2_PolicyAuthorizeNV), so a trusted firmware or
/// Secure Boot update is approved once, before or after the reboot, and no key is sealed again.
///
/// The index (owner range, next to the device lock's) holds a TPMT_HA: SHA-256 and the PolicyPCR digest
/// of the approved values. Writing it needs the passcode (PolicySecret on the PIN index, as the
/// descriptor) or the owner authorization (TPMA_NV_OWNERWRITE); anyone may read it, and a new value
/// replaces the old at once: a state approved before is revoked by the next approval.
enum BootApprovalLayout {
    static let index: UInt32 = 0x0100_4B54
    static let size: UInt16 = 34

    static let publicArea = NVPublic(
        index: index,
        attributes: NVAttributes.policyWrite | NVAttributes.ownerWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: DeviceLockLayout.passcodePolicy(CommandCode.nvWrite),
        size: size)

    /// The name every key's PolicyAuthorizeNV step extends with (the index is always written when used).
    static var name: [UInt8] { publicArea.name(written: true) }

    /// The policy an approved state stands for: PolicyPCR over `selection` with these values.
    static func approvedPolicy(selection: [Int], pcrDigest: [UInt8]) -> [UInt8] {
        PolicyDigest.compute([.pcr(selection: PCRSelection(selection), digest: pcrDigest)])
    }

    static func approvedPolicy(_ state: BootState) -> [UInt8] {
        let selection = state.values.keys.sorted()
        return approvedPolicy(selection: selection, pcrDigest: sha256(selection.flatMap { state.values[$0]! }))
    }

    /// The index's contents: TPMT_HA (hashAlg SHA-256, digest).
    static func contents(_ policy: [UInt8]) -> [UInt8] { [0x00, 0x0B] + policy }

    /// The step a `ThisDeviceOnly` key's policy starts with: the PCRs as they are now, approved by the index.
    static func step(selection: [Int]) -> PolicyStep {
        .authorizeNV(index: index, name: name, approving: [.pcr(selection: PCRSelection(selection), digest: [])])
    }
}

extension TPMKeyring {
    /// The approval index's ESAPI resource: the store's serialized one (no command), else one ReadPublic.
    func bootApprovalIndex() throws(TPMError) -> TPMHandle {
        if let tr = try? store.meta(StoreMeta.bootApprovalTR), let handle = try? context.deserialize(tr) { return handle }
        return try context.resource(forPersistent: BootApprovalLayout.index)
    }

    func readBootState(_ selection: [Int]) throws(KeychainError) -> BootState {
        do { return try BootState.read(context, selection) } catch { throw diagnose(error, doing: "read the PCRs") }
    }

    /// The approved policy the index holds; nil when the index is missing or unwritten.
    func approvedBootPolicy() throws(TPMError) -> [UInt8]? {
        do {
            let bytes = try context.readNV(try bootApprovalIndex(), size: BootApprovalLayout.size)
            return bytes.count == 34 && bytes.starts(with: [0x00, 0x0B]) ? Array(bytes.dropFirst(2)) : nil
        } catch where error.code.is(.nvUninitialized) || error.code.is(.handle) {
            return nil
        }
    }

    /// The values this store approved that the index holds (it holds only their digest): the last
    /// approval, or one being written when a process was killed between its NV_Write and the store.
    func recordedApproval(matching approvedPolicy: [UInt8]?) -> BootState? {
        [StoreMeta.bootApproved, StoreMeta.bootApprovedPending]
            .compactMap { (try? store.meta($0)).flatMap { $0 }.flatMap(BootState.init(decoding:)) }
            .first { BootApprovalLayout.approvedPolicy($0) == approvedPolicy }
    }

    /// Makes sure the approval index exists and holds a state, for a store that seals `ThisDeviceOnly`
    /// keys over `selection`. A new index (defined with the owner authorization) first approves
    /// `initial`: the boot state recorded when the store was set up, or the values an old key was sealed
    /// to. Returns the index's name; nil when the index cannot be made (no owner authorization): the
    /// caller then keeps to literal PCR values. Crash-safe: each step is redone until the store records
    /// the index (define, write, record; an index found half-made is completed or remade).
    func ensureBootApproval(selection: [Int], initial: BootState?) throws(KeychainError) -> [UInt8]? {
        // A TPM without PolicyAuthorizeNV can hold the index (a store set up before this check made one),
        // but no key sealed to it would ever open.
        guard try implementsPolicyAuthorizeNV() else { return nil }
        if (try? store.meta(StoreMeta.bootApprovalTR)).flatMap({ $0 }) != nil { return BootApprovalLayout.name }
        do {
            var index = try? context.resource(forPersistent: BootApprovalLayout.index)
            if let existing = index {
                let name = try context.name(of: existing)
                if name != BootApprovalLayout.publicArea.name(written: true)
                    && name != BootApprovalLayout.publicArea.name(written: false) {
                    // Someone else's index at our handle (other attributes or policy): it can never approve
                    // for our keys' policy, so it goes (owner authorization).
                    try context.undefineNV(existing)
                    index = nil
                }
            }
            if index == nil { index = try context.defineNV(BootApprovalLayout.publicArea, auth: nil) }
            var approvedValues: BootState?
            if try approvedBootPolicy() == nil {
                let state = try initial ?? BootState.read(context, selection)
                try context.writeNV(index!, data: BootApprovalLayout.contents(BootApprovalLayout.approvedPolicy(state)),
                                    authHandle: TPMContext.owner, session: nil)
                approvedValues = state
            } else if let initial, try approvedBootPolicy() == BootApprovalLayout.approvedPolicy(initial) {
                approvedValues = initial
            }
            // A fresh resource: its name has TPMA_NV_WRITTEN, as the keys' policies do.
            let tr = try context.serialize(try context.resource(forPersistent: BootApprovalLayout.index))
            try store.write { tx in
                try tx.setMeta(StoreMeta.bootApprovalTR, tr)
                if let approvedValues { try tx.setMeta(StoreMeta.bootApproved, approvedValues.encoded()) }
            }
            return BootApprovalLayout.name
        } catch let error as TPMError {
            if error.code.is(.badAuth) || error.code.is(.authFail) || error.code.is(.lockout) || error.code.is(.authUnavailable) {
                return nil
            }
            throw diagnose(error, doing: "provision the boot-state approval index")
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Whether the TPM implements PolicyAuthorizeNV: the store's record, else one GetCapability, recorded.
    /// False on a TPM of spec revision 1.16 (Infineon SLB9665 5.x, ST33TPHF2ESPI 73.x): its
    /// `ThisDeviceOnly` keys are sealed with PolicyPCR to the boot state recorded at set-up, and
    /// approving another state is `UNSUPPORTED` (docs/security.md).
    func implementsPolicyAuthorizeNV() throws(KeychainError) -> Bool {
        if let recorded = (try? store.meta(StoreMeta.policyAuthorizeNV)).flatMap({ $0 }), recorded.count == 1 { return recorded[0] == 1 }
        let implements: Bool
        do { implements = try context.implements(command: CommandCode.policyAuthorizeNV) } catch {
            throw diagnose(error, doing: "list the commands the TPM implements")
        }
        try writeMeta { tx in try tx.setMeta(StoreMeta.policyAuthorizeNV, [implements ? 1 : 0]) }
        return implements
    }

    /// UNSUPPORTED for what needs a boot-state approval (`what`) on a TPM without PolicyAuthorizeNV.
    func approvalUnsupported(_ what: String) -> KeychainError {
        KeychainError(.unsupported,
                      "\(what) needs TPM2_PolicyAuthorizeNV, which this TPM does not implement (a TPM of spec revision 1.16): "
                      + "on it, ThisDeviceOnly items are sealed to the boot state recorded when this keychain was set up (PCR "
                      + pcrSelection.map(String.init).joined(separator: ",") + ") and open only in that state; no other "
                      + "state can be approved. A vendor's signed boot policies (keychainctl init --boot-policy-key) work on it")
    }

    /// Refuses a `ThisDeviceOnly` seal in a state nobody approved (it would be sealed to nothing that opens).
    func checkApprovedBootState(selection: [Int]) throws(KeychainError) {
        try diagnosing("read the approved boot state") {
            let current = try BootState.read(context, selection)
            let approved = try approvedBootPolicy()
            if approved != BootApprovalLayout.approvedPolicy(current) {
                throw unapprovedBootState(current: current, reading: false)
            }
        }
    }

    /// DEVICE_STATE_CHANGED naming the PCRs that differ from this store's approved values and the command
    /// that approves the current state.
    func unapprovedBootState(current: BootState?, reading: Bool, underlying: TPMError? = nil) -> KeychainError {
        func list(_ pcrs: some Collection<Int>) -> String { "PCR " + pcrs.sorted().map(String.init).joined(separator: ", ") }
        // Never an empty list: the selection itself when no value differs.
        var which = list(pcrSelection)
        if let current, !current.values.isEmpty {
            let approvedPolicy = (try? approvedBootPolicy()) ?? nil
            if let approved = recordedApproval(matching: approvedPolicy) {
                let differing = current.values.keys.sorted().filter { approved.values[$0] != current.values[$0] }
                which = differing.isEmpty
                    ? "the selection \(list(current.values.keys)) (the approved state covers \(list(approved.values.keys)))"
                    : differing.map { "PCR \($0) (approved \(approved.values[$0].map { Hex.encode($0) } ?? "none"), now \(current.values[$0].map { Hex.encode($0) } ?? "none"))" }
                        .joined(separator: ", ")
            } else {
                which = "PCR " + current.values.keys.sorted().map(String.init).joined(separator: ", ")
                    + " (the approved values were set by another store or tool)"
            }
        }
        let what = reading ? "The ThisDeviceOnly item is kept and opens again in an approved state."
                           : "Nothing was stored: a ThisDeviceOnly item is never sealed to a state nobody approved."
        return KeychainError(.deviceStateChanged,
                             "The device's boot state is not approved: \(which) differs. \(what) If this boot follows a firmware "
                             + "or Secure Boot update you trust, approve it: keychainctl boot-state approve (the passcode on "
                             + "stdin, or --owner-auth-file FILE); otherwise boot the approved configuration",
                             underlying: underlying.map { .tpm($0) })
    }

    /// Writes the approved state: with the passcode (PolicySecret on the PIN index; the empty one when
    /// none is set), or with the owner authorization when `passcode` is nil and `owner` is set.
    func approveBootState(_ state: BootState, passcode: SecureBytes?, owner: Bool) throws(KeychainError) {
        guard try implementsPolicyAuthorizeNV() else { throw approvalUnsupported("Approving a boot state") }
        guard try ensureBootApproval(selection: state.values.keys.sorted(), initial: nil) != nil else {
            throw KeychainError(.authenticationFailed,
                                "The boot-state approval index does not exist yet, and making it needs the owner authorization "
                                + "(keychainctl --owner-auth-file FILE boot-state approve)")
        }
        let data = BootApprovalLayout.contents(BootApprovalLayout.approvedPolicy(state))
        // Recorded before the TPM write, so a kill after it leaves the values known (crash-safe display).
        try writeMeta { tx in try tx.setMeta(StoreMeta.bootApprovedPending, state.encoded()) }
        try writeIndex(BootApprovalLayout.index, command: CommandCode.nvWrite, owner: owner, passcode: passcode, nothing: "approved",
                       failure: { error in passcodeError(error, doing: "approve the boot state") }) { index, auth, session throws(TPMError) in
            try context.writeNV(index, data: data, authHandle: auth, session: session)
        }
        try writeMeta { tx in
            try tx.setMeta(StoreMeta.bootApproved, state.encoded())
            _ = try tx.deleteMeta(StoreMeta.bootApprovedPending)
        }
    }

    /// Runs an owner-or-passcode write of the boot-state index at `persistent`: with the owner authorization,
    /// or with the index's passcode branch (PolicySecret on the PIN index, for `command`). An owner
    /// authorization the TPM refused is AUTHENTICATION_FAILED ("nothing was `what`"), any other error `failure`'s.
    func writeIndex(_ persistent: UInt32, command: UInt32, owner: Bool, passcode: SecureBytes?, nothing what: String,
                    failure: (TPMError) -> KeychainError,
                    _ write: (_ index: TPMHandle, _ authHandle: TPMHandle, _ session: TPMHandle?) throws(TPMError) -> Void) throws(KeychainError) {
        do {
            let index = try context.resource(forPersistent: persistent)
            if owner { return try write(index, TPMContext.owner, nil) }
            try Self.withPasscode(passcode, command: command, context: context, srk: srk) { policy throws(TPMError) in
                try write(index, index, policy)
            }
        } catch {
            if owner, let refused = Self.ownerRefused(error, nothing: what) { throw refused }
            throw failure(error)
        }
    }

    /// AUTHENTICATION_FAILED for an owner authorization the TPM refused; nil for any other error.
    static func ownerRefused(_ error: TPMError, nothing what: String) -> KeychainError? {
        guard error.code.is(.badAuth) || error.code.is(.authFail) else { return nil }
        return KeychainError(.authenticationFailed, "The TPM refused the owner authorization: nothing was \(what)", underlying: .tpm(error))
    }

    func writeMeta(_ body: (Transaction) throws -> Void) throws(KeychainError) {
        do { try store.write(body) } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }
}
