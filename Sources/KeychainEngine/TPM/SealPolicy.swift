import KeychainCore
import FoundationEssentials
import TPM2

/// What a wrapping key is sealed to, derived from its item protection in exactly one place.
///
/// Stored next to the sealed blob (JSON); before use its digest is recomputed and compared with
/// the blob's authPolicy, so an edited policy is `DATA_CORRUPTED`, not a misleading TPM error.
struct SealPolicy: Codable, Equatable {
    enum Availability: String, Codable { case always, afterFirstUnlock, whenUnlocked }
    var availability: Availability
    /// `ThisDeviceOnly`: the PCRs and the SHA-256 of their values when the key was sealed.
    var pcrs: [Int]?
    /// Keys sealed before boot-state approval: the literal digest (`PolicyPCR`); nil in approved keys.
    var pcrDigest: [UInt8]?
    /// Approved keys: the boot-state approval index's name (`PolicyAuthorizeNV`, BootApprovalLayout).
    var bootApprovalName: [UInt8]?
    /// Vendor-signed keys: the name of the vendor's boot-policy key (`PolicyAuthorize`, VendorBootLayout).
    var bootVendorKeyName: [UInt8]?
    /// `whenPasscodeSet`: the passcode epoch the key belongs to.
    var passcodeEpoch: UInt64?
    /// Name of the state index (depends on the TPM's lock approval key).
    var stateName: [UInt8]
    /// The fingerprint reader's signature (PolicySigned), for the biometric access controls.
    var biometry: BiometryBinding?
    /// The device passcode (PolicySecret on the PIN index), for `passcode` and the `…OrPasscode` values.
    var passcode: Bool?
    /// This key's own reference (`keyRef(service:protection:publicKey:)`), in the policyRef of its
    /// access-control branch: a ticket (authValidity) names the policyRef it was made for, so it stands
    /// in for that branch of this key only. Absent in keys sealed before (an empty policyRef, shared by
    /// all of them): such a key gets no ticket and is sealed again with one when it next opens.
    var keyRef: [UInt8]?
    /// The item window (authValidity, seconds) of keys whose tag stores one (`ItemProtection.storageTag`).
    /// In the reader's policyRef, so a PolicySigned ticket longer than it needs a signature the reader
    /// refuses to make; 0 means no ticket at all. Nil in keys sealed before windows were stored.
    var authValidity: Int?
    /// What TPM2_Create said of this key (`attest key` certifies it with TPM2_CertifyCreation); not
    /// part of the digest. Nil in keys sealed before key attestation.
    var creation: TPMContext.Creation?

    struct BiometryBinding: Codable, Equatable {
        /// The reader's verification key (its TPM name) and persistent handle.
        var keyName: [UInt8]
        var tpmHandle: UInt32
        /// The enrollment set for `biometryCurrentSet*`, empty for `biometryAny*` (stored as `policyRef`,
        /// which it was alone before keys had a `keyRef`).
        var enrollmentSet: [UInt8]
        var currentSet: Bool

        enum CodingKeys: String, CodingKey { case keyName, tpmHandle, enrollmentSet = "policyRef", currentSet }
    }

    /// SHA-256 over a domain string, the service, the protection tag (length-prefixed) and the
    /// wrapping public key, made before the key is sealed: unique to this wrapping key.
    static func keyRef(service: String, protection: String, publicKey: [UInt8]) -> [UInt8] {
        func field(_ text: String) -> [UInt8] { UInt32(text.utf8.count).bigEndianBytes + Array(text.utf8) }
        return sha256(Array("keychain-linux/wrapping-key-ref/v1".utf8), field(service), field(protection), publicKey)
    }

    /// Whether a ticket may ever stand in for this key's access control: never for the CurrentSet
    /// values (seed: no authValidity window), nor for keys without their own `keyRef` or of window 0.
    var acceptsTickets: Bool { keyRef != nil && biometry?.currentSet != true && authValidity != 0 }

    /// PolicySigned's policyRef: the enrollment set and this key, as the reader signs it.
    var signedRef: [UInt8] {
        guard let biometry else { return [] }
        return FingerprintReader.policyRef(currentSet: biometry.currentSet, enrollmentSet: biometry.enrollmentSet, keyRef: keyRef,
                                           window: authValidity)
    }

    enum Branch: Equatable { case biometry, passcode }

    /// Who may open the key; two branches are joined by PolicyOR.
    var branches: [Branch] { (biometry != nil ? [.biometry] : []) + (passcode == true ? [.passcode] : []) }

    var fixedToThisTPM: Bool { pcrs != nil }

    /// Sealed to literal PCR values by a version before boot-state approval: re-sealed when next opened.
    var isLiteralBootBinding: Bool { pcrs != nil && pcrDigest != nil && bootApprovalName == nil && bootVendorKeyName == nil }

    func step(for branch: Branch) -> PolicyStep {
        switch branch {
        case .biometry: .signed(keyName: biometry!.keyName, policyRef: signedRef)
        case .passcode: .secret(index: DeviceLockLayout.pinIndex, name: DeviceLockLayout.pinName, policyRef: keyRef ?? [])
        }
    }

    /// The access-control branch as one step: PolicySigned, PolicySecret, or PolicyOR of both.
    var accessControl: PolicyStep? {
        branches.isEmpty ? nil : .anyOf(branches.map { [step(for: $0)] })
    }

    /// Every step a session runs, in order, and the digest's whole definition: `steps`, then `accessControl`.
    var allSteps: [PolicyStep] { steps + (accessControl.map { [$0] } ?? []) }

    /// The assertions every reader of the key makes first, in order: PCRs, passcode epoch, lock state.
    var steps: [PolicyStep] {
        var steps: [PolicyStep] = []
        if pcrs != nil, let bootVendorKeyName {
            // First: PolicyAuthorize restarts the digest from itself (the signed PCR and generation steps run before it).
            steps.append(.authorize(keyName: bootVendorKeyName, policyRef: VendorBootLayout.policyRef))
        } else if let pcrs, let bootApprovalName {
            // First: PolicyAuthorizeNV restarts the digest from itself.
            steps.append(.authorizeNV(index: BootApprovalLayout.index, name: bootApprovalName,
                                      approving: [.pcr(selection: PCRSelection(pcrs), digest: [])]))
        } else if let pcrs, let pcrDigest {
            steps.append(.pcr(selection: PCRSelection(pcrs), digest: pcrDigest))
        }
        if let passcodeEpoch {
            steps.append(.nv(index: DeviceLockLayout.epochIndex, name: DeviceLockLayout.epochPublic.name(written: true),
                             operand: passcodeEpoch.bigEndianBytes, offset: 0, comparison: .equal))
        }
        switch availability {
        case .always: break
        case .afterFirstUnlock:
            // Any written value: the index is written only by an unlock since the TPM started.
            steps.append(.nv(index: DeviceLockLayout.stateIndex, name: stateName, operand: DeviceLockLayout.locked,
                             offset: 0, comparison: .unsignedGreaterOrEqual))
        case .whenUnlocked:
            steps.append(.nv(index: DeviceLockLayout.stateIndex, name: stateName, operand: DeviceLockLayout.unlocked,
                             offset: 0, comparison: .equal))
        }
        return steps
    }

    /// Empty when there is nothing to assert: such keys use their (empty) authValue instead.
    var digest: [UInt8] {
        let steps = allSteps
        return steps.isEmpty ? [] : PolicyDigest.compute(steps)
    }

    func encoded() -> [UInt8] { Array((try? JSONEncoder().encode(self)) ?? Data()) }

    /// - Parameter withCreation: also decode `creation`, which only key attestation reads. Left out,
    ///   it is nil: its byte arrays, numbers in JSON, were about a sixth of a cold read's instructions.
    ///   A policy is encoded again only with a new blob's creation (`seal`, `reseal`), so none is lost.
    /// - Parameter strictly: a field this version does not know makes it nil (the verifier's reading of
    ///   a policy sent to it). Before, a policy sent for verification with an optional field's name
    ///   changed (`keyRef`, `creation`: not in the digest) was read without that field and verified as
    ///   matching its claim (`AttestationTests.hostileKeyAttestationsGetAClearErrorNeverAMatchingReport`,
    ///   the CI at 9f50b41). A store's own policies are read as before: a newer version's fields are left.
    static func decode(_ bytes: [UInt8], withCreation: Bool = false, strictly: Bool = false) -> SealPolicy? {
        let decoder = JSONDecoder()
        decoder.userInfo[decodesCreation] = withCreation
        decoder.userInfo[decodesStrictly] = strictly
        return try? decoder.decode(SealPolicy.self, from: Data(bytes))
    }

    fileprivate static let decodesCreation = CodingUserInfoKey(rawValue: "SealPolicy.decodesCreation")!
    fileprivate static let decodesStrictly = CodingUserInfoKey(rawValue: "SealPolicy.decodesStrictly")!
}

/// In an extension, so the memberwise initializer stays.
extension SealPolicy {
    init(from decoder: any Decoder) throws {
        if decoder.userInfo[Self.decodesStrictly] as? Bool == true {
            let unknown = try decoder.container(keyedBy: AnyOptionKey.self).allKeys.first { CodingKeys(stringValue: $0.stringValue) == nil }
            if let unknown {
                throw DecodingError.dataCorrupted(.init(codingPath: [unknown], debugDescription: "a field this version does not know"))
            }
        }
        let c = try decoder.container(keyedBy: CodingKeys.self)
        availability = try c.decode(Availability.self, forKey: .availability)
        pcrs = try c.decodeIfPresent([Int].self, forKey: .pcrs)
        pcrDigest = try c.decodeIfPresent([UInt8].self, forKey: .pcrDigest)
        bootApprovalName = try c.decodeIfPresent([UInt8].self, forKey: .bootApprovalName)
        bootVendorKeyName = try c.decodeIfPresent([UInt8].self, forKey: .bootVendorKeyName)
        passcodeEpoch = try c.decodeIfPresent(UInt64.self, forKey: .passcodeEpoch)
        stateName = try c.decode([UInt8].self, forKey: .stateName)
        biometry = try c.decodeIfPresent(BiometryBinding.self, forKey: .biometry)
        passcode = try c.decodeIfPresent(Bool.self, forKey: .passcode)
        keyRef = try c.decodeIfPresent([UInt8].self, forKey: .keyRef)
        authValidity = try c.decodeIfPresent(Int.self, forKey: .authValidity)
        creation = decoder.userInfo[Self.decodesCreation] as? Bool == false ? nil
            : try c.decodeIfPresent(TPMContext.Creation.self, forKey: .creation)
    }
}

extension SealPolicy.Availability {
    init(_ accessible: Accessible) {
        switch accessible.availability {
        case .always: self = .always
        case .afterFirstUnlock: self = .afterFirstUnlock
        case .whenUnlocked: self = .whenUnlocked
        }
    }
}
