import KeychainCore
import KeychainBasics
/// Every name this library keeps in the store's meta table, in one place (KeychainStore keeps its
/// own, `Store.identityMeta`).
///
/// - Important: the strings are on disk. Renaming one makes existing stores lose what it names
///   (StoreMetaTests pins each byte).
enum StoreMeta {
    // MARK: TPM
    /// The SRK's serialized ESAPI resource, so opening the keyring needs no CreatePrimary.
    static let srkTR = "tpm.srk.tr"
    /// The SRK's name when the store was first opened: a different one is another TPM (or a cleared one).
    static let srkName = "tpm.srk.name"
    /// The device-lock state NV index's serialized ESAPI resource.
    static let stateTR = "tpm.state.tr"
    /// The device-lock epoch NV index's serialized ESAPI resource.
    static let epochTR = "tpm.epoch.tr"
    /// The passcode (PIN) NV index's serialized ESAPI resource.
    static let pinTR = "tpm.pin.tr"
    /// The device-lock layout (LockDescriptor) the store was created with.
    static let lockDescriptor = "tpm.lock.descriptor"
    /// The TPM's manufacturer (4 bytes); 'IBM ' means a software TPM.
    static let manufacturer = "tpm.manufacturer"
    /// The boot PCR values (BootState) seen at the last open, to tell a changed boot from tampering.
    static let bootState = "tpm.boot-state"
    /// [mark][epoch, 8 bytes]: an interrupted passcode change's mark that this store found to mean "set".
    static let passcodeKnownSet = "tpm.passcode.known-set"
    /// The passcode epoch after this store's last passcode removal (8 bytes, big-endian): a key of an
    /// older epoch is dead in the TPM, so its read is KEY_INVALIDATED before any prompt.
    static let passcodeRemovedEpoch = "tpm.passcode.removed-epoch"
    /// The descriptor NV index's serialized ESAPI resource, so reading the passcode mark is one command.
    static let descriptorTR = "tpm.descriptor.tr"
    /// The boot-state approval index's serialized ESAPI resource (BootApprovalLayout); present once
    /// the index exists and holds a state.
    static let bootApprovalTR = "tpm.boot-approval.tr"
    /// The PCR values (BootState) this store approved last; the index holds only their policy digest.
    static let bootApproved = "tpm.boot-approved"
    /// The values an approval is writing to the index (BootState), until the store records them as approved.
    static let bootApprovedPending = "tpm.boot-approved.pending"
    /// Vendor-signed boot states: the vendor's public key (marshalled TPM2B_PUBLIC); present makes the store vendor-signed.
    static let bootVendorKey = "tpm.boot-vendor.key"
    /// The installed signed boot policies with their TPM tickets (InstalledBootPolicy list, JSON).
    static let bootVendorPolicies = "tpm.boot-vendor.policies"
    /// The generation bit-field index's serialized ESAPI resource.
    static let bootGenerationTR = "tpm.boot-generation.tr"
    /// Whether the TPM implements PolicyAuthorizeNV ([1] or [0]), asked once (GetCapability) before the
    /// first approval index: a revision 1.16 TPM lacks it, and its ThisDeviceOnly keys use PolicyPCR.
    static let policyAuthorizeNV = "tpm.has-policy-authorize-nv"
    /// The PCR selection (one byte per PCR) the store was set up with; every later call uses it.
    static let pcrSelection = "tpm.pcr-selection"
    /// The store's rollback counter (RollbackBinding): its NV index, window and authValue.
    static let rollbackCounter = "rollback.counter"
    /// The counter's value and the TPM's clock counts at the last committing write (RollbackRecord).
    static let rollbackValue = "rollback.counter.value"
    /// A counter being replaced by `acceptStore` (RollbackBinding), until its index is undefined.
    static let rollbackRetired = "rollback.counter.retired"
    /// The attestation key (`attest init`): its TPM2B_PUBLIC then its TPM2B_PRIVATE, loadable under the RSA EK.
    static let attestationKey = "tpm.attestation-key"

    // MARK: Engine
    /// How many times the device was locked (UInt64, big endian): a `whenUnlocked` key cached
    /// before the last lock is not used after it.
    static let lockGeneration = "lock.generation"
    /// Present once the first format's "<service>@strongbox" items joined their service (`mergeTokenNamespace`).
    static let oneNamespace = "items.one-namespace"
    /// The token PIN's attempt limiter (PINAttemptLimiter, JSON).
    static let tokenPINAttempts = "pkcs11.pin-attempts"
    /// keychaind's count of wrong passcodes per uid that is neither root nor admin (PasscodeBudget, JSON).
    static let passcodeBudget = "passcode.budget"
    /// Wrong passcodes in a row this store has seen the TPM refuse (4 bytes, big-endian), so that a
    /// refusal can say how many tries are left: the PIN index's count itself is readable only with
    /// the passcode. Back to 0 at a passcode the TPM accepts (which zeroes its count too) or a reset.
    static let wrongPasscodes = "passcode.wrong-in-a-row"
    /// The enrolled fingerprint readers' keys (ReaderKeys.Entry list, JSON).
    static let readerKeys = "reader.keys"
    /// The enrollment changes of the reader whose TPM key has this name (UInt64, big endian), recorded
    /// by a counted write after each (`Engine.recordGeneration(of:)`); present in bound stores only.
    static func readerGeneration(keyName: [UInt8]) -> String { "reader.generation:" + Hex.encode(keyName) }
    /// The failed touches of that reader by account (JSON `[String: Int]`: `owner` for the in-process
    /// caller, keychaind's `uid:N`), recorded by a counted write before its file (`Engine.touch`);
    /// present in bound stores only, so a copy of the file put back does not end a lockout.
    static func readerFailures(keyName: [UInt8]) -> String { "reader.failures:" + Hex.encode(keyName) }

    /// A TPM ticket (TPMKeyring.StoredTicket, JSON) for one wrapping key, kept for its authValidity window.
    static func ticket(service: String, protection: String) -> String { "\(ticketPrefix)\(service)/\(protection)" }
    static let ticketPrefix = "ticket:"

    /// [retired public key][item nonce]: the item at (service, key) still uses a retired wrapping key.
    /// The service's length comes first, so no (service, key) pair names another's marker.
    static func retired(service: String, key: String) -> String { "\(retiredPrefix)\(service.utf8.count):\(service)/\(key)" }
    static let retiredPrefix = "retired:"
}
