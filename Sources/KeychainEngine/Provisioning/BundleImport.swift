import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

extension KeychainAdministration {
    /// Imports a bundle as `KeychainDevice.importBundle` does, into the items of `uid` in keychaind's
    /// store (this store, opened where it is): the administrator chooses the user, never the bundle.
    public func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes? = nil,
                             forUser uid: UInt32) async throws(KeychainError) -> ImportOutcome {
        try await engine.importBundle(bundle, passcode: passcode, readerDirectory: configuration.readerDirectory, scope: .user(uid))
    }
}

extension Engine {
    static func provisionedMeta(service: String, key: String) -> String { "provisioned:\(service.utf8.count):\(service)/\(key)" }

    func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?, readerDirectory: String?,
                      scope: ItemScope) async throws(KeychainError) -> ImportOutcome {
        try ProvisioningBundle.check(bundle.accessible, bundle.accessControl)
        try ProvisioningBundle.checkNames(service: bundle.service, key: bundle.key, label: bundle.label)
        let service = try bundle.scope(importedIn: scope).storeName(bundle.service)
        let protection = try ItemProtection(accessible: bundle.accessible, accessControl: bundle.accessControl)
        let parts = try bundle.parts()
        let digest = sha256(parts.publicArea, parts.duplicate, parts.seed, parts.nonce, parts.ciphertext)
        let store = try store()
        let metaName = Self.provisionedMeta(service: service, key: bundle.key)
        // version (8) + digest (32), and a 41st byte while the item's write is pending.
        let installed: (version: UInt64, digest: [UInt8], pending: Bool)?
        do {
            installed = try store.meta(metaName).flatMap {
                $0.count == 40 || $0.count == 41 ? (UInt64(bigEndianBytes: Array($0.prefix(8)))!, Array($0[8..<40]), $0.count == 41) : nil
            }
        } catch { throw KeychainError(store: error) }
        if let installed {
            guard bundle.itemVersion >= installed.version else {
                throw KeychainError(.invalidArgument, "This bundle is version \(bundle.itemVersion) of '\(bundle.key)'; version "
                                    + "\(installed.version) is installed: a provisioning bundle never rolls an item back")
            }
            if bundle.itemVersion == installed.version {
                guard installed.digest == digest else {
                    throw KeychainError(.invalidArgument, "Another bundle of version \(bundle.itemVersion) of '\(bundle.key)' is installed: "
                                        + "give each new bundle a higher --version")
                }
                // A pending mark: the write was cut short, and the item there may be the older version's.
                if !installed.pending, try has(service: service, key: bundle.key) { return .alreadyInstalled }
            }
        }
        let value = try openBundle(bundle, passcode: passcode)
        // The version first, marked pending (no rollback even if the write below is cut short); the same
        // bundle imports again until the mark is cleared, after the item is written.
        func record(pending: Bool) throws(KeychainError) {
            do { try store.write { tx in try tx.setMeta(metaName, bundle.itemVersion.bigEndianBytes + digest + (pending ? [1] : [])) } }
            catch let error as StoreError { throw KeychainError(store: error) } catch { throw KeychainError(.internal, "\(error)") }
        }
        try record(pending: true)
        try set(value, service: service, key: bundle.key, protection: protection, label: bundle.label,
                backend: TPMBackend(readerDirectory: readerDirectory), tag: protection.storageTag)
        try record(pending: false)
        return .imported
    }

    /// A bundle's value: TPM2_Import under its parent, K unsealed under the item's policy, the value
    /// opened with K. Stores nothing.
    func openBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?) throws(KeychainError) -> SecureBytes {
        try ProvisioningBundle.check(bundle.accessible, bundle.accessControl)
        guard ["srk", "ek-rsa2048"].contains(bundle.parent) else {
            throw KeychainError(.dataCorrupted, "This bundle names an unknown parent '\(bundle.parent)'")
        }
        let (publicArea, duplicate, seed, nonce, ciphertext) = try bundle.parts()
        let k: SecureBytes = try withKeyring { keyring throws(KeychainError) -> SecureBytes in
            let context = keyring.context
            return try context.withTransient { () throws(KeychainError) -> SecureBytes in
                let stateName = keyring.stateName
                // The parent: the EK (a transient primary, flushed with this scope) or the SRK.
                var ek: TPMHandle?
                let parentName: [UInt8]
                do throws(TPMError) {
                    if bundle.parent == "ek-rsa2048" {
                        ek = try context.endorsementKey(.rsa2048)
                        parentName = try context.name(of: ek!)
                    } else {
                        parentName = try context.name(of: keyring.srk)
                    }
                } catch { throw keyring.diagnose(error, doing: "make the endorsement key") }
                guard Hex.encode(parentName) == bundle.target else {
                    throw KeychainError(.invalidArgument, "This bundle is sealed to another device's TPM (\(bundle.parent) \(bundle.target.prefix(16))…), "
                                        + "not this one (\(Hex.encode(parentName).prefix(16))…): seal it for this device's identity")
                }
                var approvalName = BootApprovalLayout.name
                if let pcrs = bundle.pcrs {
                    // The approval index is one per TPM and approves this keychain's selection: a bundle over other
                    // PCRs must not be the one that defines it (this keychain's own ThisDeviceOnly writes would fail).
                    let own = keyring.pcrSelection
                    guard PCRSelection(pcrs).indices == own else {
                        throw KeychainError(.invalidArgument, "This bundle binds PCRs \(pcrs.map(String.init).joined(separator: ",")); this "
                                            + "keychain binds PCRs \(own.map(String.init).joined(separator: ",")): seal it again from this "
                                            + "device's identity (keychainctl identity)")
                    }
                    // As for a ThisDeviceOnly write: the approval index exists and approves a state (today's if none).
                    // A bundle's policy names the index (it was sealed offline), so a TPM without PolicyAuthorizeNV cannot open it.
                    guard try keyring.implementsPolicyAuthorizeNV() else { throw keyring.approvalUnsupported("A ThisDeviceOnly bundle") }
                    guard let name = try keyring.ensureBootApproval(selection: pcrs, initial: keyring.recordedBootState(pcrs)) else {
                        throw KeychainError(.hardwareUnavailable, "A ThisDeviceOnly bundle needs the boot-state approval index, and "
                                            + "this keychain cannot define it without the owner authorization (--owner-auth-file)")
                    }
                    approvalName = name
                }
                let policy = ProvisioningBundle.policy(accessible: bundle.accessible, accessControl: bundle.accessControl, stateName: stateName,
                                                       pcrs: bundle.pcrs, bootApprovalName: approvalName)
                let privateArea: [UInt8]
                do throws(TPMError) {
                    if let ek {
                        privateArea = try context.importDuplicate(publicArea: publicArea, duplicate: duplicate, encryptedSeed: seed, endorsementKey: ek)
                    } else {
                        privateArea = try context.importDuplicate(publicArea: publicArea, duplicate: duplicate, encryptedSeed: seed, parent: keyring.srk)
                    }
                } catch {
                    throw KeychainError(.dataCorrupted, "The TPM refused this bundle: it was changed, or sealed to another TPM",
                                        underlying: .tpm(error))
                }
                let blob = TPMContext.SealedBlob(publicArea: publicArea, privateArea: privateArea)
                let authorization: TPMKeyring.Authorization = passcode.map { .passcode($0, window: 0) } ?? .none
                var load: ((TPMContext) throws(TPMError) -> TPMHandle)?
                if let ek {
                    load = { (context: TPMContext) throws(TPMError) -> TPMHandle in try context.load(blob, endorsementKey: ek) }
                }
                do throws(KeychainError) {
                    return try keyring.unseal(blob, policy: policy, authorization: authorization, load: load)
                } catch where error.code == .interactionNotAllowed {
                    guard try keyring.unlockIfNoPasscode() else { throw error }
                    return try keyring.unseal(blob, policy: policy, authorization: authorization, load: load)
                }
            }
        }
        do { return try Sodium.open(ciphertext, key: k, nonce: nonce, associatedData: bundle.associatedData(objectName: Duplication.name(ofPublic: publicArea))) } catch {
            throw KeychainError(.dataCorrupted, "This bundle's value failed authentication: a field was changed")
        }
    }
}
