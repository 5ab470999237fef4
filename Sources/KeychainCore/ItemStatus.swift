import FoundationEssentials

// The values the keychain's calls answer with (`getItemInfo`, `status`, `canUseAccessControl`, the token's
// state): no TPM, store or daemon in them; the engine fills them, the wire carries them as JSON.

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

    package init(key: String, service: String, accessible: Accessible, accessControl: AccessControl, label: String? = nil,
                 created: Date, modified: Date, securityLevel: SecurityLevel, token: String? = nil) {
        (self.key, self.service, self.accessible, self.accessControl, self.label) = (key, service, accessible, accessControl, label)
        (self.created, self.modified, self.securityLevel, self.token) = (created, modified, securityLevel, token)
    }
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

    package init(passcodeSet: Bool, lockState: LockState, securityLevel: ItemInfo.SecurityLevel, tpm: String,
                 ownerAuthorizationSet: Bool, lockoutAuthorizationSet: Bool, storageRootKey: StorageRootKey, warnings: [String],
                 rollbackCounter: RollbackCounterStatus? = nil, reader: ReaderStatus? = nil) {
        (self.passcodeSet, self.lockState, self.securityLevel, self.tpm) = (passcodeSet, lockState, securityLevel, tpm)
        (self.ownerAuthorizationSet, self.lockoutAuthorizationSet) = (ownerAuthorizationSet, lockoutAuthorizationSet)
        (self.storageRootKey, self.warnings, self.rollbackCounter, self.reader) = (storageRootKey, warnings, rollbackCounter, reader)
    }
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

    package init(state: State, directory: String, enrolled: Int? = nil, generation: UInt64? = nil, recordedGeneration: UInt64? = nil) {
        (self.state, self.directory, self.enrolled, self.generation, self.recordedGeneration) = (state, directory, enrolled, generation, recordedGeneration)
    }
}

/// The rollback counter as `status` shows it.
public struct RollbackCounterStatus: Sendable, Hashable, Codable {
    public enum State: String, Sendable, Hashable, Codable {
        /// The store has no counter: copies put back go unnoticed (`init` with the owner authorization binds it).
        case unbound
        /// A binding was interrupted (`init` again finishes it).
        case interrupted
        /// The store holds the counter's value.
        case current
        /// A write's NV_Increment did not happen: the next write catches up.
        case oneAhead = "one-ahead"
        /// Behind within the window after a TPM restart: the next operation accepts it.
        case restartWindow = "restart-window"
        /// Behind the counter: a copy was put back; every operation refuses it (`accept-store` to keep it).
        case rolledBack = "rolled-back"
        /// Ahead by more than one: the record was edited; every operation refuses it.
        case forged
        /// The TPM does not hold the store's counter (undefined, or the TPM cleared).
        case missing
        /// The counter at the store's handle refuses its authorization: a copy older than the store's
        /// last binding (`accept-store`), or a counter someone with the owner authorization replaced.
        case replaced
    }
    public var state: State
    /// The counter's NV index, when bound.
    public var index: UInt32?
    public var storeValue: UInt64?
    public var tpmValue: UInt64?
    /// How far the counter may jump ahead after a TPM restart without TPM2_Shutdown.
    public var window: UInt32?

    package init(state: State, index: UInt32? = nil, storeValue: UInt64? = nil, tpmValue: UInt64? = nil, window: UInt32? = nil) {
        (self.state, self.index, self.storeValue, self.tpmValue, self.window) = (state, index, storeValue, tpmValue, window)
    }
}

/// A PKCS#11 token as `status` shows it.
public struct TokenStatus: Sendable, Hashable, Codable {
    public var label, manufacturer, model, serial: String
    public var userPinLocked, userPinFinalTry, userPinCountLow: Bool

    package init(label: String, manufacturer: String, model: String, serial: String,
                 userPinLocked: Bool, userPinFinalTry: Bool, userPinCountLow: Bool) {
        (self.label, self.manufacturer, self.model, self.serial) = (label, manufacturer, model, serial)
        (self.userPinLocked, self.userPinFinalTry, self.userPinCountLow) = (userPinLocked, userPinFinalTry, userPinCountLow)
    }
}

/// The answer of `canUseAccessControl` (seed: `{ available, reason }`).
public struct AccessControlCheck: Sendable, Hashable, Codable {
    public enum Reason: String, Sendable, Hashable, Codable {
        case notAvailable, notEnrolled, passcodeNotSet, unsupportedOS
        /// Linux: the backend in use cannot give the value.
        case unsupported
        /// Linux: the device can give the value, but no prompt can reach a person to read it (no
        /// terminal or password agent: the authenticator's `reachability()`).
        case noPrompt
    }
    public var available: Bool
    public var reason: Reason?
    public init(available: Bool, reason: Reason? = nil) { self.available = available; self.reason = reason }
}

/// Biometric sensors (seed: `BiometryType`); Linux offers a (simulated) fingerprint reader.
public enum BiometryType: String, Sendable, Hashable, Codable { case fingerprint }
