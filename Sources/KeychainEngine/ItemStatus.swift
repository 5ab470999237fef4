import KeychainCore
import FoundationEssentials

/// What `getItemInfo` returns.
public struct ItemInfo: Sendable, Hashable, Codable {
    public enum SecurityLevel: String, Sendable, Hashable, Codable {
        /// Sealed by a hardware TPM.
        case hardwareTPM
        /// Sealed by a software TPM (swtpm): no protection against someone who can read its state files.
        case softwareTPM
        /// Its wrapping key is on a PKCS#11 token (`keyStorage: 'strongbox'`); SoftHSM2 is software too.
        case pkcs11Token
    }
    public var key: String
    public var service: String
    public var accessible: Accessible
    public var accessControl: AccessControl
    public var label: String?
    public var created: Date
    public var modified: Date
    public var securityLevel: SecurityLevel
    /// The label of the token that holds its key (`pkcs11Token`), when known.
    public var token: String?
}

/// The device lock as the TPM sees it.
public struct DeviceStatus: Sendable, Hashable, Codable {
    public enum LockState: String, Sendable, Hashable, Codable { case beforeFirstUnlock, locked, unlocked }
    public var passcodeSet: Bool
    public var lockState: LockState
    public var securityLevel: ItemInfo.SecurityLevel
    public var tpm: String
    /// Whether the TPM's owner and lockout authorizations are set (TPM_PT_PERMANENT): empty ones let
    /// anyone with TPM access get round the passcode or clear the TPM (see `warnings`).
    public var ownerAuthorizationSet: Bool
    public var lockoutAuthorizationSet: Bool
    /// The persistent storage root key compared with the one this store pinned at provisioning.
    public enum StorageRootKey: String, Sendable, Hashable, Codable { case pinned, missing, replaced }
    public var storageRootKey: StorageRootKey
    /// What is weak or wrong, in words: empty authorizations and what they cost, a missing or replaced
    /// SRK, a store with no rollback counter or one behind it.
    public var warnings: [String]
    /// The TPM monotonic counter the store is bound to (nil from a keychaind of an older version).
    public var rollbackCounter: RollbackCounterStatus?
    /// The fingerprint reader against the store's record of it (nil: no reader is configured, or a
    /// keychaind of an older version).
    public var reader: ReaderStatus? = nil
}

/// The fingerprint reader's directory as `status` shows it: a copy put back is reported (a
/// warning with the recovery), not refused, so the rest of the status is still seen.
public struct ReaderStatus: Sendable, Hashable, Codable {
    public enum State: String, Sendable, Hashable, Codable {
        /// No reader yet: nothing was enrolled.
        case absent
        /// The file holds the enrollment changes the store recorded (or more; or the store records none).
        case current
        /// The file is behind the store's record: an older copy was put back; every use of the reader refuses it.
        case rolledBack = "rolled-back"
        /// The file cannot be read or trusted (see the warning).
        case unreadable
    }
    public var state: State
    public var directory: String
    /// Enrolled fingers, when the file was read.
    public var enrolled: Int?
    /// The enrollment changes counted in the file, and those the store recorded (bound stores only).
    public var generation: UInt64?
    public var recordedGeneration: UInt64?
}
