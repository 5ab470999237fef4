import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

// MARK: The device

extension KeychainAdministration {
    /// Makes the attestation key (`attest init`), or returns the one the store keeps.
    public func makeAttestationKey() async throws(KeychainError) -> (name: String, created: Bool) {
        try await engine.makeAttestationKey()
    }

    /// The request a provisioning server challenges (`attest request`).
    /// - Parameter endorsementKey: the EK the server is to make the credential for (its certificate
    ///   goes in the request): the RSA EK the AK is a child of, or one of the TPM's ECC EKs.
    public func attestationRequest(endorsementKey: EndorsementKeyType = .rsa2048) async throws(KeychainError) -> AttestationRequest {
        try await engine.attestationRequest(endorsementKey: endorsementKey)
    }

    /// The answer to a server's challenge (`attest respond`).
    public func answer(_ challenge: AttestationChallenge) async throws(KeychainError) -> AttestationAnswer {
        try await engine.answer(challenge)
    }
}

extension Engine {
    /// The AK blob in the store: its TPM2B_PUBLIC (self-sized) then its TPM2B_PRIVATE.
    static func attestationKey(_ keyring: TPMKeyring) throws(KeychainError) -> TPMContext.SealedBlob? {
        let stored: [UInt8]?
        do { stored = try keyring.store.meta(StoreMeta.attestationKey) } catch { throw KeychainError(store: error) }
        guard let stored else { return nil }
        guard stored.count > 2, case let publicCount = 2 + (Int(stored[0]) << 8 | Int(stored[1])), stored.count > publicCount else {
            throw KeychainError(.dataCorrupted, "The store's attestation key is malformed")
        }
        return .init(publicArea: Array(stored[..<publicCount]), privateArea: Array(stored[publicCount...]))
    }

    func makeAttestationKey() throws(KeychainError) -> (name: String, created: Bool) {
        try withKeyring { keyring throws(KeychainError) -> (name: String, created: Bool) in
            if let blob = try Self.attestationKey(keyring) { return (DeviceIdentity.name(ofPublic: blob.publicArea) ?? "", false) }
            let context = keyring.context
            let blob: TPMContext.SealedBlob
            do throws(TPMError) {
                blob = try context.withTransient { () throws(TPMError) -> TPMContext.SealedBlob in
                    try context.createAttestationKey(endorsementKey: try context.endorsementKey(.rsa2048))
                }
            } catch {
                throw keyring.diagnose(error, doing: "make the attestation key under the RSA endorsement key")
            }
            do { try keyring.store.write { tx in try tx.setMeta(StoreMeta.attestationKey, blob.publicArea + blob.privateArea) } } catch let error as StoreError {
                throw KeychainError(store: error)
            } catch {
                throw KeychainError(.internal, "\(error)")
            }
            return (DeviceIdentity.name(ofPublic: blob.publicArea) ?? "", true)
        }
    }

    /// The store's wrapping keys the TPM holds and made with a creation ticket (sealed since key
    /// attestation), sorted by service then protection: the ones an answer certifies.
    static func certifiableWrappingKeys(_ keyring: TPMKeyring) throws(KeychainError) -> [(WrappingKeyRecord, TPMContext.Creation)] {
        let records: [WrappingKeyRecord]
        do { records = try keyring.store.wrappingKeys(whereProtectionHasPrefix: "") } catch { throw KeychainError(store: error) }
        return records.compactMap { record in
            guard record.backend == .tpm, !record.sealedPublic.isEmpty, let creation = SealPolicy.decode(record.policy, withCreation: true)?.creation else { return nil }
            return (record, creation)
        }
    }

    static func noAttestationKey() -> KeychainError {
        KeychainError(.invalidArgument, "This device has no attestation key: make one with keychainctl attest init (where the store is, as its user)")
    }

    func attestationRequest(endorsementKey type: TPMContext.EndorsementKeyType) throws(KeychainError) -> AttestationRequest {
        try configuration.checkPCRSelection()
        return try withKeyring { keyring throws(KeychainError) -> AttestationRequest in
            guard let blob = try Self.attestationKey(keyring), let akName = DeviceIdentity.name(ofPublic: blob.publicArea) else {
                throw Self.noAttestationKey()
            }
            let context = keyring.context
            do throws(TPMError) {
                let ekArea = try context.endorsementKeyPublic(type)
                let certificate = try context.readWholeNV(type.certificateIndex)
                let srkArea = try context.publicArea(of: keyring.srk)
                return AttestationRequest(
                    format: AttestationRequest.formatName, version: 1,
                    endorsementKey: .init(type: type.rawValue, publicArea: Data(ekArea).base64EncodedString(),
                                          name: DeviceIdentity.name(ofPublic: ekArea) ?? "",
                                          certificate: certificate.map { Data($0).base64EncodedString() },
                                          certificateIndex: hexHandle(type.certificateIndex)),
                    attestationKey: .init(publicArea: Data(blob.publicArea).base64EncodedString(), name: akName),
                    storageRootKey: .init(handle: hexHandle(TPMKeyring.srkHandle), publicArea: Data(srkArea).base64EncodedString(),
                                          name: Hex.encode(try context.name(of: keyring.srk))),
                    pcrs: keyring.pcrSelection, nvIndices: try keyring.nvIndexNames())
            } catch {
                throw keyring.diagnose(error, doing: "read the attestation request")
            }
        }
    }

    func answer(_ challenge: AttestationChallenge) throws(KeychainError) -> AttestationAnswer {
        try configuration.checkPCRSelection()
        let credentialBlob = try decoded(challenge.credentialBlob, "challenge's credential blob")
        let secret = try decoded(challenge.secret, "challenge's secret")
        let nonce = try decoded(challenge.nonce, "challenge's nonce")
        guard (1...32).contains(nonce.count) else { throw KeychainError(.dataCorrupted, "The challenge's nonce is not 1 to 32 bytes") }
        guard let ekType = TPMContext.EndorsementKeyType(rawValue: challenge.endorsementKey ?? TPMContext.EndorsementKeyType.rsa2048.rawValue) else {
            throw KeychainError(.unsupported, "The challenge is for an EK of type '\(challenge.endorsementKey ?? "")': this keychain "
                                + "activates credentials with rsa2048, eccP256 and eccP384")
        }
        return try withKeyring { keyring throws(KeychainError) -> AttestationAnswer in
            guard let blob = try Self.attestationKey(keyring), let akName = DeviceIdentity.name(ofPublic: blob.publicArea) else {
                throw Self.noAttestationKey()
            }
            guard challenge.attestationKeyName == akName else {
                throw KeychainError(.invalidArgument, "The challenge is for the attestation key \(challenge.attestationKeyName.prefix(16))…, "
                                    + "not this device's (\(akName.prefix(16))…): it was made for another device's request")
            }
            let keys = try Self.certifiableWrappingKeys(keyring)
            let approvalIndexMade = (try? keyring.store.meta(StoreMeta.bootApprovalTR)) != nil
            let context = keyring.context
            let pcrs = PCRSelection(keyring.pcrSelection)
            func signed(_ s: TPMContext.SignedAttestation) -> AttestationAnswer.Signed {
                .init(attest: Data(s.attest).base64EncodedString(), signature: Data(s.signature).base64EncodedString())
            }
            do throws(TPMError) {
                return try context.withTransient { () throws(TPMError) -> AttestationAnswer in
                    let (ak, credential, quote, certification) = try Self.activate(
                        ekType, context: context, ak: blob, srk: keyring.srk, credentialBlob: credentialBlob, secret: secret,
                        pcrs: pcrs, nonce: nonce)
                    var certified: [AttestationAnswer.CertifiedKey] = []
                    for (record, creation) in keys {
                        let statement = try context.withTransient { () throws(TPMError) -> TPMContext.SignedAttestation in
                            let object = try context.load(TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate),
                                                          parent: keyring.srk)
                            return try context.certifyCreation(object, ak: ak, creation: creation, nonce: nonce)
                        }
                        certified.append(.init(service: record.service, protection: record.protection, publicArea: Data(record.sealedPublic).base64EncodedString(),
                                               policy: Data(record.policy).base64EncodedString(), creationData: Data(creation.data).base64EncodedString(),
                                               creationCertification: signed(statement)))
                    }
                    let approval = approvalIndexMade
                        ? try context.certifyNV(try keyring.bootApprovalIndex(), size: BootApprovalLayout.size, ak: ak, nonce: nonce) : nil
                    let values = try context.readPCRs(pcrs)
                    return AttestationAnswer(
                        format: AttestationAnswer.formatName, version: 1, nonce: challenge.nonce,
                        credential: credential.withUnsafeBytes { Data($0).base64EncodedString() },
                        quote: signed(quote), pcrValues: Dictionary(uniqueKeysWithValues: zip(pcrs.indices.map(String.init), values.map { Hex.encode($0) })),
                        storageRootKeyCertification: signed(certification), wrappingKeys: certified,
                        bootApprovalCertification: approval.map(signed))
                }
            } catch where error.command == "ActivateCredential" && !error.isConnectionFailure {
                throw KeychainError(.authenticationFailed, "The TPM refused to activate the credential: the challenge was made for "
                                    + "another TPM's EK or another key, or was changed", underlying: .tpm(error))
            } catch {
                throw keyring.diagnose(error, doing: "answer the attestation challenge")
            }
        }
    }

    /// The AK loaded under the RSA EK, the credential activated, the quote and the SRK's
    /// certification; the EK is its scope's, gone when they are made, so that each wrapping key
    /// loads beside the AK (three object slots). The AK is the caller's scope's.
    private static func activate(_ ekType: TPMContext.EndorsementKeyType, context: TPMContext, ak blob: TPMContext.SealedBlob,
                                 srk: TPMHandle, credentialBlob: [UInt8], secret: [UInt8], pcrs: PCRSelection, nonce: [UInt8])
        throws(TPMError) -> (ak: TPMHandle, credential: SecureBytes, quote: TPMContext.SignedAttestation,
                            certification: TPMContext.SignedAttestation)
    {
        func signing(_ ak: TPMHandle, _ credential: SecureBytes) throws(TPMError)
            -> (ak: TPMHandle, credential: SecureBytes, quote: TPMContext.SignedAttestation, certification: TPMContext.SignedAttestation)
        {
            (ak, credential, try context.quote(ak: ak, selection: pcrs, nonce: nonce), try context.certify(srk, ak: ak, nonce: nonce))
        }
        guard ekType != .rsa2048 else {
            return try context.withTransient(keeping: { $0.ak }) { () throws(TPMError) in
                let ek = try context.endorsementKey(.rsa2048)
                let ak = try context.load(blob, endorsementKey: ek)
                return try signing(ak, try context.activateCredential(ak: ak, endorsementKey: ek, credentialBlob: credentialBlob, secret: secret))
            }
        }
        // The AK is the RSA EK's child, but activation needs only both loaded in one TPM: the RSA EK
        // makes room (three slots) for the ECC EK the secret is sealed to.
        let ak = try context.withTransient(keeping: { $0 }) { () throws(TPMError) -> TPMHandle in
            try context.load(blob, endorsementKey: try context.endorsementKey(.rsa2048))
        }
        let credential = try context.withTransient { () throws(TPMError) -> SecureBytes in
            try context.activateCredential(ak: ak, endorsementKey: try context.endorsementKey(ekType), type: ekType,
                                           credentialBlob: credentialBlob, secret: secret)
        }
        return try signing(ak, credential)
    }
}
