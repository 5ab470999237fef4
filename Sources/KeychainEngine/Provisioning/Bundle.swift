import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

extension ProvisioningBundle {
    public func json() -> Data { ProvisioningJSON.document(self) }

    /// Every field but the value's, length-prefixed, and the sealed object's name.
    func associatedData(objectName: [UInt8]) -> [UInt8] {
        var ad = Array("keychain-linux bundle v1".utf8)
        func field(_ bytes: some Collection<UInt8>) { ad += UInt32(bytes.count).bigEndianBytes; ad += bytes }
        field(parent.utf8); field(target.utf8); field(service.utf8); field(key.utf8)
        if let label { ad.append(1); field(label.utf8) } else { ad.append(0) }
        field(accessible.rawValue.utf8); field(accessControl.rawValue.utf8)
        ad += itemVersion.bigEndianBytes
        field((pcrs ?? []).map { UInt8(clamping: $0) })
        field(objectName)
        // After the object's name, so that a bundle without it authenticates as before.
        if credential == true { field("systemd credential".utf8) }
        if let attested { field((attested ? "attested identity" : "unattested SRK").utf8) }
        return ad
    }

    /// The policy the object is sealed under: the protection as `SealPolicy` makes it for the
    /// device's own keys, with its state index name and, for ThisDeviceOnly, its boot-state approval.
    static func policy(accessible: Accessible, accessControl: AccessControl, stateName: [UInt8],
                       pcrs: [Int]?, bootApprovalName: [UInt8]) -> SealPolicy {
        SealPolicy(availability: .init(accessible), pcrs: pcrs, pcrDigest: nil, bootApprovalName: pcrs == nil ? nil : bootApprovalName,
                   passcodeEpoch: nil, stateName: stateName, biometry: nil, passcode: accessControl == .passcode ? true : nil,
                   keyRef: nil, authValidity: nil)
    }

    /// Where the import puts the item: `scope`, the importer's, or the system manager's credentials
    /// for a credential bundle (an import through keychaind is an administrator's).
    func scope(importedIn scope: ItemScope) -> ItemScope {
        credential == true ? .credentials(.system) : scope
    }

    /// The names a bundle can carry: a caller's service (never keychaind's namespace), key and label.
    static func checkNames(service: String, key: String, label: String?) throws(KeychainError) {
        if let problem = ItemNames.serviceProblem(service) ?? ItemNames.keyProblem(key) ?? ItemNames.labelProblem(label) {
            throw KeychainError.invalidArgument(problem)
        }
    }

    /// The protections a bundle can carry; the others are refused with the reason.
    static func check(_ accessible: Accessible, _ accessControl: AccessControl) throws(KeychainError) {
        guard accessControl == .none || accessControl == .passcode else {
            throw KeychainError(.unsupported, "accessControl '\(accessControl.rawValue)' cannot be sealed for another device: its "
                                + "protection belongs to that device's fingerprint reader; use 'passcode' or 'none'")
        }
        guard accessible != .whenPasscodeSetThisDeviceOnly else {
            throw KeychainError(.unsupported, "accessible 'whenPasscodeSetThisDeviceOnly' cannot be sealed offline: its key is bound "
                                + "to the device's passcode epoch, which the identity does not carry; use 'whenUnlockedThisDeviceOnly' with accessControl 'passcode'")
        }
    }
}

/// Seals a value for one device's TPM; needs no TPM.
public enum Provisioning {
    /// What a bundle is duplicated to.
    public enum Parent: String, Sendable, CaseIterable {
        /// The endorsement key (RSA 2048, template L-1), which an EK certificate can vouch for.
        case endorsementKey = "ek"
        /// The keychain's storage root key (ECC P-256 at 0x81000001).
        case storageRootKey = "srk"

        public init(parsing text: String) throws(KeychainError) {
            guard let parent = Parent(rawValue: text) else { throw KeychainError.invalidArgument("Invalid parent '\(text)': expected ek or srk") }
            self = parent
        }
    }

    /// What a bundle is sealed to, from a device identity or a verified identity.
    struct Target {
        var rsaEK: DeviceIdentity.EndorsementKey?
        var srk: DeviceIdentity.PersistentKey
        var nvIndices: [String: DeviceIdentity.NVIndex]
        var pcrs: [Int]
        /// The SRK was proved to be in the EK's TPM (a verified identity).
        var attested: Bool
    }

    /// To the EK (RSA 2048) when the identity has one, else to the SRK (`parent` chooses). With `ekCA`
    /// (PEM, the TPM maker's CA), the EK certificate must verify against it and certify that EK, or
    /// nothing is sealed. Nothing ties a plain identity's SRK to its EK: an SRK bundle from it is
    /// sealed only with `unattestedSRK` (and says so); seal from a `VerifiedIdentity` instead.
    /// - Throws: `UNSUPPORTED` for a biometric access control or `whenPasscodeSetThisDeviceOnly`;
    ///   `INVALID_ARGUMENT` for an SRK bundle without `unattestedSRK`; `DATA_CORRUPTED` for an
    ///   identity whose SRK is not an ECC P-256 storage key.
    public static func seal(_ value: SecureBytes, service: String, key: String, accessible: Accessible = .afterFirstUnlock,
                            accessControl: AccessControl = .none, label: String? = nil, version: UInt64 = 0, credential: Bool = false,
                            for identity: DeviceIdentity, parent chosen: Parent? = nil, ekCA: [UInt8]? = nil,
                            unattestedSRK: Bool = false) throws(KeychainError) -> ProvisioningBundle {
        let target = Target(rsaEK: identity.endorsementKeys.first(where: { $0.type == TPMContext.EndorsementKeyType.rsa2048.rawValue }),
                            srk: identity.storageRootKey, nvIndices: identity.nvIndices, pcrs: identity.bootState.pcrs, attested: false)
        let toSRK = chosen == .storageRootKey || (chosen == nil && target.rsaEK == nil)
        if toSRK && !unattestedSRK {
            throw KeychainError(.invalidArgument, "This identity's SRK is not attested: nothing ties it to the device's EK, so a bundle "
                                + "sealed to it is only as trustworthy as the channel that delivered the identity. Seal for the verified "
                                + "identity 'keychainctl attest verify' wrote, or accept that with --unattested-srk")
        }
        if unattestedSRK && !toSRK {
            throw KeychainError.invalidArgument("--unattested-srk is for a bundle sealed to the SRK (--parent srk)")
        }
        return try seal(value, service: service, key: key, accessible: accessible, accessControl: accessControl, label: label,
                        version: version, credential: credential, to: target, parent: chosen, ekCA: ekCA)
    }

    /// To the device `verified` proved (`AttestationServer.verify`): its SRK is in the TPM of its EK,
    /// so an SRK bundle (`parent` `.storageRootKey`) opens in that TPM only. The bundle says it was
    /// sealed from a verified identity (`attested`). The default parent is the EK, as for an identity.
    /// - Throws: as `seal(_:…for:)`; `DATA_CORRUPTED` for a verified identity without its NV indices
    ///   (one from a first request: verify the device again).
    public static func seal(_ value: SecureBytes, service: String, key: String, accessible: Accessible = .afterFirstUnlock,
                            accessControl: AccessControl = .none, label: String? = nil, version: UInt64 = 0, credential: Bool = false,
                            for verified: VerifiedIdentity, parent chosen: Parent? = nil, ekCA: [UInt8]? = nil) throws(KeychainError) -> ProvisioningBundle {
        guard let nvIndices = verified.nvIndices else {
            throw KeychainError(.dataCorrupted, "This verified identity lacks the keychain's NV indices (its request came from an "
                                + "earlier keychain): attest the device again")
        }
        // A credential activated with an ECC EK leaves no RSA EK to seal to: the attested SRK is the parent.
        let rsaEK = verified.endorsementKey.type == TPMContext.EndorsementKeyType.rsa2048.rawValue ? verified.endorsementKey : nil
        let target = Target(rsaEK: rsaEK, srk: verified.storageRootKey, nvIndices: nvIndices,
                            pcrs: verified.bootState.pcrs, attested: true)
        return try seal(value, service: service, key: key, accessible: accessible, accessControl: accessControl, label: label,
                        version: version, credential: credential, to: target, parent: chosen, ekCA: ekCA)
    }

    static func seal(_ value: SecureBytes, service: String, key: String, accessible: Accessible, accessControl: AccessControl,
                     label: String?, version: UInt64, credential: Bool, to target: Target, parent chosen: Parent?,
                     ekCA: [UInt8]?) throws(KeychainError) -> ProvisioningBundle {
        try ProvisioningBundle.check(accessible, accessControl)
        try ProvisioningBundle.checkNames(service: service, key: key, label: label)
        if credential && accessControl != .none {
            throw KeychainError(.invalidArgument, "A systemd credential is read at its unit's start, where nobody can answer a prompt: "
                                + "seal it with accessControl 'none' and choose its protection with --accessible")
        }
        guard value.count <= Engine.maxValueLength else { throw KeychainError.invalidArgument("Invalid value: at most \(Engine.maxValueLength) bytes") }
        guard let stateName = target.nvIndices["state"].flatMap({ bytes(hex: $0.name) }),
              let approvalName = target.nvIndices["bootApproval"].flatMap({ bytes(hex: $0.name) }),
              let srk = Data(base64Encoded: target.srk.publicArea) else {
            throw KeychainError(.dataCorrupted, "The identity lacks its state index, its boot-state approval index or its SRK")
        }
        let thisDeviceOnly = accessible.isThisDeviceOnly
        let policy = ProvisioningBundle.policy(accessible: accessible, accessControl: accessControl, stateName: stateName,
                                               pcrs: thisDeviceOnly ? target.pcrs : nil, bootApprovalName: approvalName)
        var parent = (kind: "srk", name: target.srk.name, publicArea: [UInt8](srk))
        let rsaEK = target.rsaEK
        if chosen == .endorsementKey && rsaEK == nil {
            throw KeychainError.invalidArgument("The identity has no RSA 2048 endorsement key: seal to its SRK (--parent srk)")
        }
        if chosen == .storageRootKey && ekCA != nil {
            throw KeychainError.invalidArgument("--ek-ca vouches for the EK: it cannot be used with --parent srk")
        }
        if chosen != .storageRootKey, let ek = rsaEK, let area = Data(base64Encoded: ek.publicArea) {
            parent = ("ek-rsa2048", ek.name, [UInt8](area))
            if let ekCA {
                guard let certificate = ek.certificate.flatMap({ Data(base64Encoded: $0) }) else {
                    throw KeychainError(.authenticationFailed, "The identity has no EK certificate to check against the CA: nothing was sealed")
                }
                do { try EndorsementCertificate.verify(der: [UInt8](certificate), caPEM: ekCA, endorsementPublic: [UInt8](area)) } catch {
                    throw KeychainError(.authenticationFailed, "This device's EK is not vouched for by the CA (\(error)): nothing was sealed")
                }
            }
        } else if ekCA != nil {
            throw KeychainError(.authenticationFailed, "The identity has no RSA endorsement key to check against the CA: nothing was sealed")
        }
        let k = SecureBytes(random: Sodium.xchachaKeyLength)
        let blob: Duplication.Blob
        do { blob = try Duplication.blob(k, policy: policy.digest, parentPublic: parent.publicArea) } catch {
            throw KeychainError(.dataCorrupted, "Cannot seal to this identity's \(parent.kind): \(error)")
        }
        var bundle = ProvisioningBundle(
            format: ProvisioningBundle.formatName, version: ProvisioningBundle.currentVersion, parent: parent.kind, target: parent.name,
            service: service, key: key, label: label, accessible: accessible, accessControl: accessControl, itemVersion: version,
            pcrs: thisDeviceOnly ? target.pcrs : nil,
            publicArea: Data(blob.publicArea).base64EncodedString(), duplicate: Data(blob.duplicate).base64EncodedString(),
            encryptedSeed: Data(blob.encryptedSeed).base64EncodedString(), nonce: "", ciphertext: "")
        bundle.credential = credential ? true : nil
        bundle.attested = target.attested ? true : parent.kind == "srk" ? false : nil
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        bundle.nonce = Data(nonce).base64EncodedString()
        bundle.ciphertext = Data(Sodium.seal(value, key: k, nonce: nonce, associatedData: bundle.associatedData(objectName: blob.name)))
            .base64EncodedString()
        return bundle
    }
}

func bytes(hex text: String) -> [UInt8]? {
    Hex.decode(text.utf8)
}

extension ProvisioningBundle {
    /// The binary fields, decoded and checked for shape.
    func parts() throws(KeychainError) -> (publicArea: [UInt8], duplicate: [UInt8], seed: [UInt8], nonce: [UInt8], ciphertext: [UInt8]) {
        guard let publicArea = Data(base64Encoded: publicArea).map(Array.init),
              let duplicate = Data(base64Encoded: duplicate).map(Array.init),
              let seed = Data(base64Encoded: encryptedSeed).map(Array.init),
              let nonce = Data(base64Encoded: nonce).map(Array.init), nonce.count == Sodium.xchachaNonceLength,
              let ciphertext = Data(base64Encoded: ciphertext).map(Array.init),
              publicArea.count > 6, pcrs.map({ !$0.isEmpty && $0.allSatisfy { (0..<24).contains($0) } }) ?? true else {
            throw KeychainError(.dataCorrupted, "This bundle's fields are not well-formed")
        }
        return (publicArea, duplicate, seed, nonce, ciphertext)
    }
}
