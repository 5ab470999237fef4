import KeychainCore
import FoundationEssentials
import KeychainStore
import TPM2
import KeychainBasics

extension LocalService {
    package func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation {
        if let refusal { throw refusal }
        return try await engine.attestKey(storeName: storage.storeName, service: storage.service,
                                          protection: try storage.options.resolved(for: nil), nonce: nonce)
    }
}

extension Engine {
    /// - Parameters:
    ///   - storeName: the service's name in the store (its scope's: the caller's uid under keychaind).
    ///   - service: as the caller names it, for the claim and the messages.
    func attestKey(storeName: String, service: String, protection: ItemProtection, nonce: [UInt8]) throws(KeychainError) -> KeyAttestation {
        guard (1...32).contains(nonce.count) else { throw KeychainError.invalidArgument("The nonce is 1 to 32 bytes") }
        let tag = protection.storageTag
        return try withKeyring { keyring throws(KeychainError) -> KeyAttestation in
            guard let akBlob = try Self.attestationKey(keyring), let akName = DeviceIdentity.name(ofPublic: akBlob.publicArea) else {
                throw Self.noAttestationKey()
            }
            let stored: WrappingKeyRecord?
            do { stored = try keyring.store.wrappingKey(service: storeName, protection: tag) } catch let error as StoreError {
                throw KeychainError(store: error)
            } catch {
                throw KeychainError(.internal, "\(error)")
            }
            guard let record = stored else {
                throw KeychainError.invalidArgument("Service '\(service)' has no key for items of \(tag): store an item with that protection first")
            }
            guard record.backend == .tpm, !record.sealedPublic.isEmpty else {
                throw KeychainError(.unsupported, "The key of '\(service)' (\(tag)) is held by a token: the TPM cannot attest it")
            }
            guard let policy = SealPolicy.decode(record.policy, withCreation: true) else { throw KeychainError(.dataCorrupted, "The stored policy of '\(service)' (\(tag)) is malformed") }
            guard let creation = policy.creation else {
                throw KeychainError(.unsupported, "The key of '\(service)' (\(tag)) was sealed before key attestation and has no creation "
                                    + "ticket: a new key of that protection (clear the service's items and store them again) can be attested")
            }
            let context = keyring.context
            do throws(TPMError) {
                return try context.withTransient { () throws(TPMError) -> KeyAttestation in
                    let object = try context.load(TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), parent: keyring.srk)
                    // Three object slots: the key, the EK while it loads the AK (its scope's), then the AK.
                    let ak = try context.withTransient(keeping: { $0 }) { () throws(TPMError) -> TPMHandle in
                        try context.load(akBlob, endorsementKey: try context.endorsementKey(.rsa2048))
                    }
                    let certification = try context.certifyCreation(object, ak: ak, creation: creation, nonce: nonce)
                    var approval: TPMContext.SignedAttestation?
                    if policy.pcrs != nil, policy.bootApprovalName != nil {
                        approval = try context.certifyNV(try keyring.bootApprovalIndex(), size: BootApprovalLayout.size, ak: ak, nonce: nonce)
                    }
                    func signed(_ s: TPMContext.SignedAttestation) -> AttestationAnswer.Signed {
                        .init(attest: Data(s.attest).base64EncodedString(), signature: Data(s.signature).base64EncodedString())
                    }
                    return KeyAttestation(
                        format: KeyAttestation.formatName, version: 1,
                        claim: .init(service: service, accessible: protection.accessible, accessControl: protection.accessControl,
                                     authValidity: protection.accessControl.takesWindow ? protection.authValidity : nil),
                        attestationKeyName: akName, nonce: Data(nonce).base64EncodedString(),
                        publicArea: Data(record.sealedPublic).base64EncodedString(), policy: Data(record.policy).base64EncodedString(),
                        creationData: Data(creation.data).base64EncodedString(), creationCertification: signed(certification),
                        bootApprovalCertification: approval.map(signed))
                }
            } catch {
                throw keyring.diagnose(error, doing: "attest the key of '\(service)' (\(tag))")
            }
        }
    }
}
