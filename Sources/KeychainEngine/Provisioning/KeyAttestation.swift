import KeychainCore
import FoundationEssentials
import KeychainStore
import TPM2
import KeychainBasics

extension KeyAttestation: AttestationDocument {}
extension KeyAttestationReport: AttestationDocument {}

extension AttestationServer {
    /// Verifies `attestation` against the device `identity` proved, for the caller's `nonce`, and says
    /// what the TPM enforces on the key.
    /// - Throws: `AUTHENTICATION_FAILED` when the statement is not this device's AK's, over this nonce,
    ///   of this key, made by the TPM under the attested SRK, or when a ThisDeviceOnly key is not
    ///   fixedTPM and fixedParent; `DATA_CORRUPTED` for a malformed document. A key whose policy is
    ///   other than claimed is no error: the report says so (`matchesClaim` false, `differences`).
    public static func verifyKey(_ attestation: KeyAttestation, identity: VerifiedIdentity,
                                 nonce: [UInt8]) throws(KeychainError) -> KeyAttestationReport {
        func refuse(_ why: String) -> KeychainError { KeychainError(.authenticationFailed, "The key attestation does not verify: \(why)") }
        guard attestation.attestationKeyName == identity.attestationKey.name else {
            throw refuse("it is signed by another attestation key than the verified identity's")
        }
        guard try decoded(attestation.nonce, "key attestation's nonce") == nonce else { throw refuse("it is over another nonce (replayed or stale)") }
        let ak = try decoded(identity.attestationKey.publicArea, "identity's AK public area")
        let publicArea = try decoded(attestation.publicArea, "key's public area")
        let creationData = try decoded(attestation.creationData, "key's creation data")
        let signedCreation = try signed(attestation.creationCertification, "creation certification")
        let certification: Attestation.CreationCertification
        let object: Attestation.SealedObject
        let parent: [UInt8]
        do throws(AttestationError) {
            certification = try Attestation.verifyCreationCertification(signedCreation, akPublic: ak)
            object = try Attestation.sealedObject(publicArea)
            parent = try Attestation.creationParent(creationData, hash: certification.creationHash)
        } catch {
            throw refuse(error.description)
        }
        guard certification.nonce == nonce else { throw refuse("the certification is over another nonce") }
        guard let name = DeviceIdentity.name(ofPublic: publicArea), hexBytes(name) == certification.name else {
            throw refuse("the certified key is not the one whose public area the statement carries")
        }
        guard Hex.encode(parent) == identity.storageRootKey.name else { throw refuse("the key was made under another parent than the attested SRK") }
        let claim = attestation.claim
        let thisDeviceOnly = claim.accessible.isThisDeviceOnly
        guard !thisDeviceOnly || (object.fixedTPM && object.fixedParent) else {
            throw refuse("the key claims \(claim.accessible.rawValue) but its public area lacks fixedTPM or fixedParent: it could leave its TPM")
        }
        guard let policy = SealPolicy.decode(try decoded(attestation.policy, "key's policy"), withCreation: true, strictly: true) else {
            throw KeychainError(.dataCorrupted, "The key attestation's policy is not a keychain policy")
        }

        var differences = differences(policy, claim: claim, identity: identity)
        if policy.digest != object.authPolicy {
            differences.append("the key's authPolicy is not the digest of the policy it claims: what the TPM enforces on it is not known from this statement")
        }
        if object.userWithAuth && !object.authPolicy.isEmpty {
            differences.append("the key also opens with its empty authValue (userWithAuth): its policy guards nothing")
        }
        if !thisDeviceOnly && object.fixedTPM { differences.append("the key is fixedTPM although its level moves through backups") }

        var approves: Bool?
        if policy.pcrs != nil, policy.bootApprovalName != nil {
            guard let signedApproval = attestation.bootApprovalCertification else {
                throw refuse("the key is bound to the approved boot state, and the statement carries no certification of the approval index")
            }
            approves = try approvalApprovesBootState(signedApproval, akPublic: ak, nonce: nonce, bootState: identity.bootState, refuse: refuse)
                && policy.pcrs == identity.bootState.pcrs
        }
        let enforced = differences.isEmpty ? conditions(policy, object: object) : []
        let statement = differences.isEmpty ? "opens " + enforced.joined(separator: ", ")
            : "does not match its claim: " + differences.joined(separator: "; ")
        return KeyAttestationReport(format: KeyAttestationReport.formatName, version: 1, claim: claim, keyName: name, matchesClaim: differences.isEmpty,
                                    enforced: enforced, statement: statement, differences: differences,
                                    approvesVerifiedBootState: approves)
    }

    /// Where the stored policy is not what the claimed protection seals (`TPMKeyring.seal`).
    private static func differences(_ policy: SealPolicy, claim: KeyAttestation.Claim, identity: VerifiedIdentity) -> [String] {
        var out: [String] = []
        let control = claim.accessControl
        if policy.availability != SealPolicy.Availability(claim.accessible) {
            out.append("the key opens \(policy.availability.rawValue), the claim is \(claim.accessible.rawValue)")
        }
        if claim.accessible.isThisDeviceOnly {
            if policy.pcrs == nil { out.append("the claim is ThisDeviceOnly, and the key has no boot-state binding") }
            if let pcrs = policy.pcrs, pcrs != identity.bootState.pcrs {
                out.append("the key binds PCRs \(pcrs), the device's selection is \(identity.bootState.pcrs)")
            }
            if let approval = policy.bootApprovalName, approval != BootApprovalLayout.name {
                out.append("the key names another boot-state approval index than the keychain's")
            }
        } else if policy.pcrs != nil {
            out.append("the key is bound to a boot state, which the claimed level is not")
        }
        if (claim.accessible.requiresPasscode || !policy.branches.isEmpty) && policy.passcodeEpoch == nil {
            out.append("the key is not bound to the passcode epoch: removing the passcode would not end it")
        }
        if control.needsBiometry && policy.biometry == nil { out.append("the claim needs a finger, and the key has no reader branch") }
        if policy.biometry != nil && !control.usesBiometry { out.append("the key has a reader branch the claim does not name") }
        if let biometry = policy.biometry, biometry.currentSet != control.isCurrentSet {
            out.append(biometry.currentSet ? "the key is bound to one enrollment set, the claim to any finger" : "the key opens with any finger, the claim is the enrollment set it was made with")
        }
        if control.allowsPasscode != (policy.passcode == true) {
            out.append(control.allowsPasscode ? "the claim opens with the passcode, and the key has no passcode branch" : "the key has a passcode branch the claim does not name")
        }
        if control.takesWindow, policy.authValidity != claim.authValidity {
            out.append("the key's item window is \(policy.authValidity.map { "\($0) s" } ?? "not recorded"), the claim's \(claim.authValidity.map { "\($0) s" } ?? "none")")
        }
        if let state = identity.nvIndices?["state"]?.name, Hex.encode(policy.stateName) != state, policy.availability != .always {
            out.append("the key names another lock-state index than the device reported")
        }
        return out
    }

    /// The conditions a matching key's policy makes the TPM check, in words (docs/security.md's table).
    private static func conditions(_ policy: SealPolicy, object: Attestation.SealedObject) -> [String] {
        var out: [String] = []
        let window = policy.authValidity.flatMap { $0 > 0 ? " (or within \($0) s of one, by a TPM ticket)" : nil } ?? ""
        let reader = policy.biometry.map { "a finger \($0.currentSet ? "of the enrollment set it was made with" : "enrolled") on the reader \(Hex.encode($0.keyName).prefix(16))…" }
        switch (reader, policy.passcode == true) {
        case let (reader?, true): out.append("only with \(reader) or the device passcode\(window)")
        case let (reader?, false): out.append("only with \(reader)\(window)")
        case (nil, true): out.append("only with the device passcode\(window)")
        case (nil, false): break
        }
        switch policy.availability {
        case .whenUnlocked: out.append("while the device is unlocked")
        case .afterFirstUnlock: out.append("after the first unlock since the TPM started")
        case .always: out.append(policy.branches.isEmpty && policy.pcrs == nil ? "at any time, with no condition (its empty authValue)" : "at any time")
        }
        if policy.passcodeEpoch != nil { out.append("until the passcode is removed") }
        if let pcrs = policy.pcrs {
            let list = pcrs.map(String.init).joined(separator: ",")
            if policy.bootVendorKeyName != nil { out.append("in a boot state (PCRs \(list)) the vendor's key signed") }
            else if policy.bootApprovalName != nil { out.append("in the boot state (PCRs \(list)) the device's approval index approves") }
            else { out.append("in the boot state (PCRs \(list)) it was sealed in") }
        }
        out.append(object.fixedTPM && object.fixedParent ? "on this TPM only" : "under the SRK, not fixedTPM (its level moves through backups)")
        return out
    }
}

// MARK: The device
