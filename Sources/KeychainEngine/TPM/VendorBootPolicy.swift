import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

/// Vendor-signed boot states (issue 12, docs/boot-state.md): a store set up with the vendor's public
/// key (`init --boot-policy-key`) seals `ThisDeviceOnly` keys to "any PCR policy that key signed"
/// (TPM2_PolicyAuthorize). The signed policy is PolicyPCR over the expected values, then PolicyNV
/// BITCLEAR on a bit-field index: bit g set means generation g is revoked (`revoke-before N` sets bits
/// 0…N−1; a bit field only grows, so the TPM keeps revocations monotonic, unlike a counter whose first
/// value a hardware TPM chooses). The TPM checks each installed policy's signature once
/// (VerifySignature); its ticket is kept, so a read presents it without loading the key.
enum VendorBootLayout {
    static let generationIndex: UInt32 = 0x0100_4B55
    static let policyRef = Array("keychain-boot-policy".utf8)
    static let maxGeneration = 63

    /// Set with the passcode (PolicySecret on the PIN index + PolicyCommandCode(NV_SetBits)) or the owner.
    static let generationPublic = NVPublic(
        index: generationIndex,
        attributes: NVAttributes.typeBits | NVAttributes.policyWrite | NVAttributes.ownerWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: DeviceLockLayout.passcodePolicy(CommandCode.nvSetBits),
        size: 8)

    static var generationName: [UInt8] { generationPublic.name(written: true) }

    /// "Generation g is not revoked."
    static func generationStep(_ generation: Int) -> PolicyStep {
        .nv(index: generationIndex, name: generationName, operand: (UInt64(1) << UInt64(generation)).bigEndianBytes,
            offset: 0, comparison: .bitClear)
    }

    /// The policy the vendor signs for `state` at `generation` (offline: no TPM involved).
    static func approvedPolicy(_ state: BootState, generation: Int) -> [UInt8] {
        let selection = state.values.keys.sorted()
        return PolicyDigest.compute([.pcr(selection: PCRSelection(selection), digest: sha256(selection.flatMap { state.values[$0]! })),
                                     generationStep(generation)])
    }

    /// What the key signs: aHash = SHA-256(approvedPolicy || policyRef) (Part 3, 23.16).
    static func signedDigest(_ state: BootState, generation: Int) -> [UInt8] {
        sha256(approvedPolicy(state, generation: generation), policyRef)
    }
}

/// A signed boot policy as `boot-state sign` writes it and `boot-state install` reads it (JSON).
struct SignedBootPolicy: Codable, Equatable {
    /// PCR number → SHA-256 value, hex.
    var pcrs: [String: String]
    var generation: Int
    /// Marshalled TPMT_SIGNATURE (ECDSA-SHA256), hex.
    var signature: String

    var state: BootState? {
        var values: [Int: [UInt8]] = [:]
        for (key, value) in pcrs {
            guard let pcr = Int(key), (0...15).contains(pcr), let bytes = value.hexBytes, bytes.count == 32 else { return nil }
            values[pcr] = bytes
        }
        return values.isEmpty ? nil : BootState(values: values)
    }

    static func sign(_ state: BootState, generation: Int, privatePEM: SecureBytes) throws(KeychainError) -> SignedBootPolicy {
        guard (0...VendorBootLayout.maxGeneration).contains(generation) else {
            throw .invalidArgument("Invalid generation \(generation): expected 0 to \(VendorBootLayout.maxGeneration)")
        }
        let (r, s) = try VendorKey.sign(digest: VendorBootLayout.signedDigest(state, generation: generation), privatePEM: privatePEM)
        return SignedBootPolicy(pcrs: Dictionary(uniqueKeysWithValues: state.values.map { (String($0.key), Hex.encode($0.value)) }),
                                generation: generation, signature: Hex.encode(TPMContext.ecdsaSignature(r: r, s: s)))
    }
}

/// An installed policy and the TPM's ticket for its signature.
struct InstalledBootPolicy: Codable, Equatable {
    var policy: SignedBootPolicy
    var ticket: String
}

extension TPMKeyring {
    func vendorKeyPublic() -> [UInt8]? { (try? store.meta(StoreMeta.bootVendorKey)).flatMap { $0 } }

    func installedBootPolicies() -> [InstalledBootPolicy] {
        (try? store.meta(StoreMeta.bootVendorPolicies)).flatMap { $0 }
            .flatMap { try? JSONDecoder().decode([InstalledBootPolicy].self, from: Data($0)) } ?? []
    }

    func generationIndex() throws(TPMError) -> TPMHandle {
        if let tr = try? store.meta(StoreMeta.bootGenerationTR), let handle = try? context.deserialize(tr) { return handle }
        return try context.resource(forPersistent: VendorBootLayout.generationIndex)
    }

    /// Makes this store vendor-signed: the generation index (owner authorization; made once per TPM,
    /// written with no bit set) and the key, recorded in the store. Crash-safe: redone until recorded.
    func configureVendorKey(_ keyPublic: [UInt8]) throws(KeychainError) {
        let tr: [UInt8]
        do throws(TPMError) {
            tr = try makeGenerationIndex()
        } catch {
            if error.code.is(.badAuth) || error.code.is(.authFail) {
                throw KeychainError(.authenticationFailed, "Setting up vendor-signed boot states needs the owner authorization "
                                    + "(--owner-auth-file FILE)", underlying: .tpm(error))
            }
            throw diagnose(error, doing: "set up the boot-policy generation index")
        }
        do {
            try store.write { tx in
                try tx.setMeta(StoreMeta.bootGenerationTR, tr)
                try tx.setMeta(StoreMeta.bootVendorKey, keyPublic)
            }
        } catch {
            throw (error as? StoreError).map { KeychainError(store: $0) } ?? KeychainError(.internal, "\(error)")
        }
    }

    /// Defines the generation index if missing (or someone else's), writes it with no bit set; returns its resource.
    private func makeGenerationIndex() throws(TPMError) -> [UInt8] {
        var index = try? context.resource(forPersistent: VendorBootLayout.generationIndex)
        if let existing = index {
            let name = try context.name(of: existing)
            if name != VendorBootLayout.generationPublic.name(written: true) && name != VendorBootLayout.generationPublic.name(written: false) {
                try context.undefineNV(existing)
                index = nil
            }
        }
        let handle: TPMHandle
        if let index { handle = index } else { handle = try context.defineNV(VendorBootLayout.generationPublic, auth: nil) }
        do throws(TPMError) { _ = try context.readNV(handle, size: 8) } catch where error.code.is(.nvUninitialized) {
            try context.setBitsNV(handle, bits: 0, authHandle: TPMContext.owner, session: nil)
        }
        return try context.serialize(try context.resource(forPersistent: VendorBootLayout.generationIndex))
    }

    /// Checks the policy's signature in the TPM and keeps it with its ticket (replacing one for the same values).
    func installBootPolicy(_ policy: SignedBootPolicy) throws(KeychainError) {
        guard let keyPublic = vendorKeyPublic() else {
            throw KeychainError(.invalidArgument, "This keychain takes no signed boot policies: it was not set up with "
                                + "keychainctl init --boot-policy-key VENDOR.pub")
        }
        guard let state = policy.state, (0...VendorBootLayout.maxGeneration).contains(policy.generation),
              let signature = policy.signature.hexBytes else {
            throw KeychainError.invalidArgument("The boot policy is malformed: expected pcrs (0–15, 64 hex digits each), a generation 0–63 and a signature")
        }
        let ticket: [UInt8]
        do {
            ticket = try context.verifySignature(keyPublic: keyPublic, digest: VendorBootLayout.signedDigest(state, generation: policy.generation),
                                                 signature: signature)
        } catch {
            if error.isConnectionFailure { throw diagnose(error, doing: "check the boot policy's signature") }
            throw KeychainError(.authenticationFailed, "The TPM refused the boot policy's signature: it was not signed by "
                                + "this keychain's boot-policy key (or was changed since)", underlying: .tpm(error))
        }
        var installed = installedBootPolicies().filter { $0.policy.pcrs != policy.pcrs }
        installed.append(InstalledBootPolicy(policy: policy, ticket: Hex.encode(ticket)))
        try writeMeta { tx in try tx.setMeta(StoreMeta.bootVendorPolicies, Array(try JSONEncoder().encode(installed))) }
    }

    /// Revokes every signed policy of a generation below `generation` (sets bits 0…generation−1).
    func revokeBootPolicies(before generation: Int, passcode: SecureBytes?, owner: Bool) throws(KeychainError) {
        guard (1...VendorBootLayout.maxGeneration + 1).contains(generation) else {
            throw KeychainError.invalidArgument("Invalid generation \(generation): revoke-before takes 1 to \(VendorBootLayout.maxGeneration + 1)")
        }
        let bits: UInt64 = generation > VendorBootLayout.maxGeneration ? .max : (UInt64(1) << UInt64(generation)) - 1
        try writeIndex(VendorBootLayout.generationIndex, command: CommandCode.nvSetBits, owner: owner, passcode: passcode, nothing: "revoked",
                       failure: { error in
            guard error.code.is(.handle) else { return passcodeError(error, doing: "revoke boot policies") }
            return KeychainError(.invalidArgument, "This TPM has no boot-policy generation index: set up vendor-signed boot states first "
                                 + "(keychainctl init --boot-policy-key VENDOR.pub)", underlying: .tpm(error))
        }) { index, auth, session throws(TPMError) in
            try context.setBitsNV(index, bits: bits, authHandle: auth, session: session)
        }
    }

    /// The installed policy for the state the PCRs hold (no PCR_Read when only one is installed).
    func bootPolicyForNow(selection: [Int]) throws(TPMError) -> InstalledBootPolicy? {
        let installed = installedBootPolicies()
        if installed.count == 1 { return installed[0] }
        let current = try BootState.read(context, selection)
        return installed.first { $0.policy.state == current }
    }

    /// Refuses a vendor-mode seal unless a signed policy for this state is installed and not revoked.
    func checkVendorBootState(selection: [Int]) throws(KeychainError) {
        try diagnosing("check the signed boot state") {
            let current = try BootState.read(context, selection)
            guard let installed = installedBootPolicies().first(where: { $0.policy.state == current }) else {
                throw vendorStateError("no boot policy signed for the current values of PCR "
                                       + selection.map(String.init).joined(separator: ", ") + " is installed", reading: false)
            }
            let bits = UInt64(bigEndianBytes: try context.readNV(try generationIndex(), size: 8)) ?? .max
            guard bits & (UInt64(1) << UInt64(installed.policy.generation)) == 0 else {
                throw vendorStateError("the boot policy for this state (generation \(installed.policy.generation)) was revoked", reading: false)
            }
        }
    }

    /// Runs the signed policy before PolicyAuthorize: PolicyPCR (values now), PolicyNV (generation), PolicyAuthorize.
    func runVendorSteps(_ session: TPMHandle, policy: SealPolicy, keyName: [UInt8], step: inout String) throws(TPMError) {
        let selection = policy.pcrs ?? []
        step = "PolicyAuthorize(choice)"
        guard let installed = try bootPolicyForNow(selection: selection), let state = installed.policy.state,
              let ticket = installed.ticket.hexBytes else {
            throw TPMError(command: "no installed boot policy", code: .value)
        }
        step = "PolicyPCR"
        try context.policyPCR(session, selection: PCRSelection(state.values.keys.sorted()), digest: [])
        step = "PolicyNV(generation)"
        guard case .nv(_, _, let operand, let offset, let comparison) = VendorBootLayout.generationStep(installed.policy.generation) else { return }
        try context.policyNV(session, index: try generationIndex(), operand: operand, offset: offset, comparison: comparison)
        step = "PolicyAuthorize"
        try context.policyAuthorize(session, approvedPolicy: VendorBootLayout.approvedPolicy(state, generation: installed.policy.generation),
                                    policyRef: VendorBootLayout.policyRef, keyName: keyName, ticket: ticket)
    }

    func vendorStateError(_ why: String, reading: Bool, underlying: TPMError? = nil) -> KeychainError {
        let what = reading ? "The ThisDeviceOnly item is kept and opens again once a policy for this state is installed."
                           : "Nothing was stored: a ThisDeviceOnly item is never sealed to a state nobody signed."
        return KeychainError(.deviceStateChanged,
                             "The device's boot state is not one the vendor signed: \(why). \(what) Install the vendor's policy "
                             + "for this release: keychainctl boot-state install POLICY", underlying: underlying.map { .tpm($0) })
    }
}

extension String {
    var hexBytes: [UInt8]? {
        Hex.decode(utf8)
    }
}
