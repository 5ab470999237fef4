import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

/// The boot state `ThisDeviceOnly` items are bound to, and its approval (docs/boot-state.md).
public struct BootStateStatus: Sendable, Hashable, Codable {
    /// The PCRs of the store's selection (SHA-256 bank).
    public var pcrs: [Int]
    /// The values this store approved last, hex by PCR; nil when the approval index holds a state
    /// approved elsewhere (another store on this TPM, or a tool) or none.
    public var approved: [Int: String]?
    /// Whether the approval index holds a state at all.
    public var approvalIndexWritten: Bool
    /// The values the PCRs hold now.
    public var current: [Int: String]
    /// Whether the current values are the approved state: ThisDeviceOnly items open and can be written.
    public var matches: Bool
    /// The PCRs whose current value differs from `approved`.
    public var differing: [Int]
    /// `local` (approved with the passcode or owner authorization), `vendor` (signed policies) or `set-up`
    /// (a TPM without PolicyAuthorizeNV: the state recorded when the keychain was set up, and no other).
    public var mode: String = "local"
    /// Vendor mode: the generations of the installed signed policies, and those revoked among them.
    public var installedGenerations: [Int]?
    public var revokedGenerations: [Int]?
}

extension KeychainAdministration {
    /// The selection, the approved and current PCR values, and whether they match.
    public func bootState() async throws(KeychainError) -> BootStateStatus { try await engine.bootState() }

    /// Approves a boot state for `ThisDeviceOnly` items, revoking the one approved before: the current
    /// values of the store's PCR selection, with `predicted` values in place of some (after an update,
    /// before its reboot). Authorized by the device passcode (nil when none is set), checked by the TPM.
    public func approveBootState(predicted: [Int: [UInt8]] = [:], passcode: SecureBytes?) async throws(KeychainError) -> BootStateStatus {
        try await engine.approveBootState(predicted: predicted, passcode: passcode, owner: false)
    }

    /// As `approveBootState(predicted:passcode:)`, authorized by the configuration's owner authorization.
    public func approveBootStateAsOwner(predicted: [Int: [UInt8]] = [:]) async throws(KeychainError) -> BootStateStatus {
        try await engine.approveBootState(predicted: predicted, passcode: nil, owner: true)
    }
}

extension KeychainAdministration {
    /// Makes this store's `ThisDeviceOnly` keys accept any boot policy signed by the vendor's key (a PEM
    /// P-256 public key): keys sealed from now on need an installed signed policy, not a local approval.
    /// Needs the owner authorization once per TPM (the generation index).
    public func useBootPolicyKey(publicKeyPEM: [UInt8]) async throws(KeychainError) {
        try await engine.useBootPolicyKey(publicKeyPEM)
    }

    /// Installs a policy made by `signBootPolicy` (its signature is checked by the TPM, its ticket kept).
    public func installBootPolicy(_ policy: [UInt8]) async throws(KeychainError) -> BootStateStatus {
        try await engine.installBootPolicy(policy)
    }

    /// Revokes every signed policy of a generation below `generation`, for good (passcode, nil when none is set).
    public func revokeBootPolicies(before generation: Int, passcode: SecureBytes?) async throws(KeychainError) {
        try await engine.revokeBootPolicies(before: generation, passcode: passcode, owner: false)
    }

    /// As `revokeBootPolicies(before:passcode:)`, authorized by the configuration's owner authorization.
    public func revokeBootPoliciesAsOwner(before generation: Int) async throws(KeychainError) {
        try await engine.revokeBootPolicies(before: generation, passcode: nil, owner: true)
    }

    /// Signs a boot policy offline (no TPM, no store): the PCR values a release leaves and its generation
    /// (0–63), with the vendor's PEM P-256 private key. Returns the policy file (JSON).
    public static func signBootPolicy(pcrs: [Int: [UInt8]], generation: Int, privateKeyPEM: SecureBytes) throws(KeychainError) -> [UInt8] {
        guard !pcrs.isEmpty, pcrs.keys.allSatisfy({ (0...15).contains($0) }), pcrs.values.allSatisfy({ $0.count == 32 }) else {
            throw .invalidArgument("A boot policy needs PCRs 0–15 with SHA-256 values (64 hex digits): --pcr N=HEX")
        }
        let policy = try SignedBootPolicy.sign(BootState(values: pcrs), generation: generation, privatePEM: privateKeyPEM)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Array((try? encoder.encode(policy)) ?? Data())
    }
}

extension Engine {
    func useBootPolicyKey(_ pem: [UInt8]) throws(KeychainError) {
        let (x, y) = try VendorKey.publicPoint(pem: pem)
        let keyPublic: [UInt8]
        do { keyPublic = try TPMContext.eccVerificationPublic(x: x, y: y) } catch {
            throw KeychainError(.invalidArgument, "The boot-policy key cannot be encoded for the TPM", underlying: .tpm(error))
        }
        try withKeyring { keyring throws(KeychainError) in try keyring.configureVendorKey(keyPublic) }
    }

    func installBootPolicy(_ bytes: [UInt8]) throws(KeychainError) -> BootStateStatus {
        guard let policy = try? JSONDecoder().decode(SignedBootPolicy.self, from: Data(bytes)) else {
            throw .invalidArgument("The boot policy file is not one keychainctl boot-state sign wrote")
        }
        let status = try withKeyring { keyring throws(KeychainError) in
            try keyring.installBootPolicy(policy)
            return try Self.bootState(keyring, selection: keyring.pcrSelection)
        }
        dropUnsealedThisDeviceOnly()
        return status
    }

    func revokeBootPolicies(before generation: Int, passcode: SecureBytes?, owner: Bool) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in try keyring.revokeBootPolicies(before: generation, passcode: passcode, owner: owner) }
        dropUnsealedThisDeviceOnly()
    }

    func bootState() throws(KeychainError) -> BootStateStatus {
        try configuration.checkPCRSelection()
        return try withKeyring { keyring throws(KeychainError) in try Self.bootState(keyring, selection: keyring.pcrSelection) }
    }

    private static func bootState(_ keyring: TPMKeyring, selection: [Int]) throws(KeychainError) -> BootStateStatus {
        let current: BootState
        let approvedPolicy: [UInt8]?
        do {
            current = try BootState.read(keyring.context, selection)
            approvedPolicy = try keyring.approvedBootPolicy()
        } catch {
            throw keyring.diagnose(error, doing: "read the boot state")
        }
        if keyring.vendorKeyPublic() != nil {
            let installed = keyring.installedBootPolicies()
            let bits: UInt64
            do { bits = UInt64(bigEndianBytes: try keyring.context.readNV(try keyring.generationIndex(), size: 8)) ?? .max } catch {
                throw keyring.diagnose(error, doing: "read the boot-policy generations")
            }
            let revoked = installed.map(\.policy.generation).filter { bits & (UInt64(1) << UInt64($0)) != 0 }
            let match = installed.first { $0.policy.state == current }
            return BootStateStatus(pcrs: current.values.keys.sorted(), approved: match?.policy.state?.hexValues,
                                   approvalIndexWritten: !installed.isEmpty, current: current.hexValues,
                                   matches: match.map { !revoked.contains($0.policy.generation) } ?? false,
                                   differing: match == nil ? current.values.keys.sorted() : [], mode: "vendor",
                                   installedGenerations: installed.map(\.policy.generation).sorted(), revokedGenerations: revoked.sorted())
        }
        if try !keyring.implementsPolicyAuthorizeNV() {
            // No approval on this TPM: keys are sealed (PolicyPCR) to the state recorded at set-up.
            let recorded = keyring.recordedBootState(selection)
            return BootStateStatus(pcrs: current.values.keys.sorted(), approved: recorded?.hexValues, approvalIndexWritten: false,
                                   current: current.hexValues, matches: recorded == current,
                                   differing: current.values.keys.sorted().filter { recorded?.values[$0] != current.values[$0] },
                                   mode: "set-up")
        }
        let recorded = keyring.recordedApproval(matching: approvedPolicy)
        let differing = current.values.keys.sorted().filter { recorded?.values[$0] != current.values[$0] }
        return BootStateStatus(pcrs: current.values.keys.sorted(), approved: recorded.map(\.hexValues),
                               approvalIndexWritten: approvedPolicy != nil, current: current.hexValues,
                               matches: approvedPolicy == BootApprovalLayout.approvedPolicy(current), differing: differing)
    }

    func approveBootState(predicted: [Int: [UInt8]], passcode: SecureBytes?, owner: Bool) throws(KeychainError) -> BootStateStatus {
        try configuration.checkPCRSelection()
        let status = try withKeyring { keyring throws(KeychainError) in
            let selection = keyring.pcrSelection
            for (pcr, value) in predicted {
                guard selection.contains(pcr) else {
                    throw KeychainError.invalidArgument("Invalid --pcr \(pcr): this keychain's PCR selection is \(selection.map(String.init).joined(separator: ",")); "
                                                        + "approve values of those PCRs only")
                }
                guard value.count == 32 else {
                    throw KeychainError.invalidArgument("Invalid --pcr \(pcr) value: expected a SHA-256 value (64 hex digits), got \(value.count) bytes")
                }
            }
            var state: BootState
            state = try keyring.readBootState(selection)
            state.values.merge(predicted) { _, new in new }
            try keyring.approveBootState(state, passcode: passcode, owner: owner)
            return try Self.bootState(keyring, selection: selection)
        }
        // The state approved before is revoked: keys opened under it are opened again, under the new one.
        dropUnsealedThisDeviceOnly()
        return status
    }

    /// A key sealed to literal PCR values by an earlier version, just opened (so the PCRs hold the values
    /// it was sealed to): sealed again to the approved form, once the approval index holds that very
    /// state. Best effort, crash-safe as `reseal` (the old blob stays until one transaction replaces it).
    func migrateBootBinding(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        guard let pcrs = policy.pcrs, let pcrDigest = policy.pcrDigest else { return }
        let literal = BootApprovalLayout.approvedPolicy(selection: pcrs, pcrDigest: pcrDigest)
        let name: [UInt8]? = try? withKeyring { keyring throws(KeychainError) -> [UInt8]? in
            // A new index approves the state this key was sealed to (the recorded boot state when they agree).
            let recorded = keyring.recordedBootState(pcrs).flatMap { BootApprovalLayout.approvedPolicy($0) == literal ? $0 : nil }
            var initial: BootState
            if let recorded { initial = recorded } else {
                initial = try keyring.readBootState(pcrs)
            }
            guard BootApprovalLayout.approvedPolicy(initial) == literal,
                  let name = try keyring.ensureBootApproval(selection: pcrs, initial: initial) else { return nil }
            // Only when the index approves what the key was sealed to: never to a state nobody approved.
            let approved: [UInt8]?
            do { approved = try keyring.approvedBootPolicy() } catch { return nil }
            return approved == literal ? name : nil
        }
        guard let name = name ?? nil else { return }
        var upgraded = policy
        upgraded.pcrDigest = nil
        upgraded.bootApprovalName = name
        reseal(secret, wrapping, upgraded, store: store)
    }
}

extension Engine {
    /// After a new boot state is approved: ThisDeviceOnly keys open again under it.
    func dropUnsealedThisDeviceOnly() { unsealed = unsealed.filter { !$0.key.protection.contains("ThisDeviceOnly") } }
}

extension BootState {
    var hexValues: [Int: String] { values.mapValues { Hex.encode($0) } }
}
