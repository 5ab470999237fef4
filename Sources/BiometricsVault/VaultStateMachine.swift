public import Keychain

/// The BiometricsVault of the seed as a value: states, transitions, and the keychain operations
/// they need. It does no I/O of its own.
///
/// ## Design
///
/// A driver (the vault) calls a transition, such as `upgradeKeychainWithBiometrics()`. The call
/// either throws a `VaultError` and changes nothing, or returns the `Action` the driver performs on
/// the keychain. The driver then reports the outcome with `operationSucceeded()`,
/// `credentialsRead(_:)` or `operationFailed(_:)`, which returns the next `Action`, until `.none`.
/// Until then the transition is `pending`, `state` is still the state it started from, and every
/// other transition throws `operationInProgress`. `lock()` needs no keychain operation and takes
/// effect at once.
///
/// The two transitions that put the credentials behind biometrics verify the user as the seed's
/// library does (it asks for the finger before it stores): the biometric copy is written, then read
/// back, which prompts (`verify`), and only a finger that opens it completes the transition. A
/// failed or canceled touch removes the copy again, so the credentials are never left behind a
/// finger the user cannot give, and the transition ends where it started.
///
/// States (`VaultState`): `unavailable` and `ready` (nothing stored), `keychainSecured` and
/// `biometricsSecured` (signed in, credentials in memory), `locked` (stored behind biometrics, not
/// in memory). The state always matches what is stored:
///
/// | stored                         | state                                        |
/// |--------------------------------|----------------------------------------------|
/// | nothing                        | `ready`, or `unavailable` without biometrics |
/// | the keychain item              | `keychainSecured`                            |
/// | the biometric item             | `biometricsSecured` or `locked`              |
/// | both (a step failed half-way)  | `keychainSecured` (1)                        |
///
/// (1) The copy that opens without a prompt is what protects the credentials, so the state says
/// so; the biometric copy holds the same credentials and is overwritten by the next upgrade or
/// removed by a reset.
///
/// The start-up state comes from that table (`init(startupFound:biometricsAvailable:)`): the driver
/// reads the keychain item and asks `hasItem` for the biometric one, neither of which prompts.
///
/// Every transition of the seed's two diagrams, plus what the seed leaves open ("Ready" stands for
/// `ready` or `unavailable`, as the availability says):
///
/// ```mermaid
/// stateDiagram-v2
///     [*] --> Unavailable: nothing stored, no biometrics
///     [*] --> Ready: nothing stored
///     [*] --> KeychainSecured: keychain item
///     [*] --> Locked: biometric item only
///     Unavailable --> Ready: biometricsAvailabilityChanged(true)
///     Ready --> Unavailable: biometricsAvailabilityChanged(false)
///     Ready --> KeychainSecured: enableKeychainVault
///     Unavailable --> KeychainSecured: enableKeychainVault
///     Ready --> BiometricsSecured: enableSecureVaultWithBiometrics (a finger opens the copy)
///     KeychainSecured --> BiometricsSecured: upgradeKeychainWithBiometrics (a finger opens the copy)
///     Ready --> Ready: enableSecureVaultWithBiometrics, the touch fails or is canceled
///     KeychainSecured --> KeychainSecured: upgradeKeychainWithBiometrics, the touch fails or is canceled
///     BiometricsSecured --> KeychainSecured: downgradeBiometricsToKeychain
///     BiometricsSecured --> Locked: lock
///     Locked --> BiometricsSecured: unlockWithBiometrics
///     Locked --> Locked: unlock canceled / locked out
///     Locked --> Ready: unlockWithBiometrics fails with KEY_INVALIDATED
///     BiometricsSecured --> Ready: disableBiometricsSecureVault
///     KeychainSecured --> Ready: resetEverything
///     BiometricsSecured --> Ready: resetEverything
///     Locked --> Ready: resetEverything
/// ```
///
/// Where the seed is silent:
/// - `resetEverything()` is allowed from every state: it is sign-out and "change account", and
///   removing what isn't there does no harm.
/// - `enableKeychainVault(saving:)` is allowed in `unavailable`: the keychain item needs no
///   biometrics, so a device without a sensor can still keep the user signed in.
/// - `reauthenticateOwner()` is allowed in every state and leaves it as it was: a lockout can follow any
///   touch (enabling and upgrading verify with a finger as unlocking does), and the seed's answer to a
///   lockout is this call, whatever the vault's state.
/// - A failed transition settles in the state that matches what is stored (see each outcome).
///   `BIOMETRY_NOT_AVAILABLE`, `BIOMETRY_NOT_ENROLLED` and `PASSCODE_NOT_SET` also mark biometrics
///   unavailable: the keychain has just said so.
public struct VaultStateMachine<Credentials: Codable & Sendable>: Sendable {
    /// The keychain operation the driver performs next; the machine waits for its outcome.
    public enum Action: Sendable {
        /// Nothing to do: the transition is complete.
        case none
        /// Write the item of `protection` (no prompt). A write replaces the item atomically.
        case store(Credentials, protection: VaultProtection)
        /// Read the item of `protection` (a biometric read prompts), then `credentialsRead(_:)`.
        case read(VaultProtection)
        /// Read the item of `protection` just written, to prove the user can open it (a biometric
        /// read prompts); then `operationSucceeded()` when it opened, `operationFailed(_:)` when it
        /// did not (a read that finds no item is a failure too).
        case verify(VaultProtection)
        /// Remove the item of `protection` (no prompt); removing an absent item succeeds.
        case remove(VaultProtection)
        /// Ask for the device passcode, which ends a biometric lockout (the seed's `reauthenticateOwner`).
        case authenticateOwner
    }

    /// What the driver found at start-up without a prompt.
    public struct Stored: Sendable {
        /// The credentials in the keychain item, which has no access control; nil when there is none.
        public var keychainItem: Credentials?
        /// Whether the biometric item exists (`hasItem`, which doesn't prompt).
        public var biometricItemExists: Bool

        public init(keychainItem: Credentials? = nil, biometricItemExists: Bool = false) {
            self.keychainItem = keychainItem
            self.biometricItemExists = biometricItemExists
        }
    }

    /// The state the last transition settled in; a pending transition hasn't changed it yet.
    public private(set) var state: VaultState<Credentials>
    /// Whether the device can put an item behind biometrics now (`canUseAccessControl`).
    public private(set) var biometricsAvailable: Bool
    private var operation: Operation?

    /// The transition waiting for the outcome of its keychain operation, if any.
    public var pending: VaultEvent? { operation?.event }

    /// The state of what is stored, as in the table of the type's documentation.
    public init(startupFound stored: Stored, biometricsAvailable: Bool) {
        self.biometricsAvailable = biometricsAvailable
        if let credentials = stored.keychainItem {
            state = .keychainSecured(credentials)
        } else if stored.biometricItemExists {
            state = .locked
        } else {
            state = .ready
        }
        normalize()
    }

    // MARK: Transitions

    /// `ready` or `unavailable` → `keychainSecured`: stores the credentials without biometrics.
    public mutating func enableKeychainVault(saving credentials: Credentials) throws(VaultError) -> Action {
        try checkIdle(.enableKeychainVault)
        switch state {
        case .ready, .unavailable:
            operation = .enablingKeychainVault(credentials)
            return .store(credentials, protection: .keychain)
        default:
            throw refusal(.enableKeychainVault)
        }
    }

    /// `keychainSecured` → `biometricsSecured`: stores a biometric copy, reads it back with the
    /// user's finger (`verify`), then removes the keychain item.
    ///
    /// The copy comes first, so the user stays signed in whatever fails; a touch that fails or is
    /// canceled removes the copy and stays `keychainSecured`.
    public mutating func upgradeKeychainWithBiometrics() throws(VaultError) -> Action {
        try checkIdle(.upgradeKeychainWithBiometrics)
        guard case .keychainSecured(let credentials) = state else {
            throw refusal(.upgradeKeychainWithBiometrics)
        }
        try checkBiometrics(.upgradeKeychainWithBiometrics)
        operation = .upgrading(credentials, step: .storing)
        return .store(credentials, protection: .biometrics)
    }

    /// `ready` → `biometricsSecured`: stores the credentials behind biometrics and reads them back
    /// with the user's finger (`verify`); a touch that fails or is canceled removes them again.
    public mutating func enableSecureVaultWithBiometrics(saving credentials: Credentials) throws(VaultError) -> Action {
        try checkIdle(.enableSecureVaultWithBiometrics)
        guard case .ready = state else { throw refusal(.enableSecureVaultWithBiometrics) }
        try checkBiometrics(.enableSecureVaultWithBiometrics)
        operation = .enablingSecureVault(credentials, step: .storing)
        return .store(credentials, protection: .biometrics)
    }

    /// `biometricsSecured` → `locked` at once: the credentials leave memory, the item stays.
    public mutating func lock() throws(VaultError) -> Action {
        try checkIdle(.lock)
        guard case .biometricsSecured = state else { throw refusal(.lock) }
        state = .locked
        return .none
    }

    /// `locked` → `biometricsSecured`: reads the biometric item, which prompts.
    ///
    /// Not refused when biometrics looks unavailable: the item is there, and the keychain's answer
    /// (settled by `operationFailed(_:)`) is better than a guess.
    public mutating func unlockWithBiometrics() throws(VaultError) -> Action {
        try checkIdle(.unlockWithBiometrics)
        guard case .locked = state else { throw refusal(.unlockWithBiometrics) }
        operation = .unlocking
        return .read(.biometrics)
    }

    /// `biometricsSecured` → `keychainSecured`: stores a keychain copy, then removes the biometric item.
    public mutating func downgradeBiometricsToKeychain() throws(VaultError) -> Action {
        try checkIdle(.downgradeBiometricsToKeychain)
        guard case .biometricsSecured(let credentials) = state else {
            throw refusal(.downgradeBiometricsToKeychain)
        }
        operation = .downgrading(credentials, removingBiometricItem: false)
        return .store(credentials, protection: .keychain)
    }

    /// `biometricsSecured` → `ready`: removes the biometric item, forgetting the credentials.
    public mutating func disableBiometricsSecureVault() throws(VaultError) -> Action {
        try checkIdle(.disableBiometricsSecureVault)
        guard case .biometricsSecured = state else { throw refusal(.disableBiometricsSecureVault) }
        operation = .disabling
        return .remove(.biometrics)
    }

    /// Any state → `ready`: removes the biometric item, then the keychain item.
    ///
    /// In that order, so that a failure half-way never leaves a biometric item alone with
    /// credentials the user meant to forget: see `operationFailed(_:)`.
    public mutating func resetEverything() throws(VaultError) -> Action {
        try checkIdle(.resetEverything)
        operation = .resetting(removingKeychainItem: false)
        return .remove(.biometrics)
    }

    /// Any state → the same state: asks for the device passcode after a biometric lockout.
    ///
    /// The state doesn't change either way; after a success the app tries its touch again
    /// (`unlockWithBiometrics()`, `upgradeKeychainWithBiometrics()`, …).
    public mutating func reauthenticateOwner() throws(VaultError) -> Action {
        try checkIdle(.reauthenticateOwner)
        operation = .reauthenticating
        return .authenticateOwner
    }

    // MARK: Inputs from the driver

    /// Records whether the device can use biometrics; `ready` and `unavailable` follow it at once.
    ///
    /// Never refused, even with a transition pending: the other states keep the credentials where they are.
    public mutating func biometricsAvailabilityChanged(_ available: Bool) {
        biometricsAvailable = available
        normalize()
    }

    /// The `store`, `verify`, `remove` or `authenticateOwner` action succeeded.
    public mutating func operationSucceeded() throws(VaultError) -> Action {
        switch operation {
        case .enablingKeychainVault(let credentials):
            settle(.keychainSecured(credentials))
        case .enablingSecureVault(let credentials, .storing):
            operation = .enablingSecureVault(credentials, step: .verifying)
            return .verify(.biometrics)
        case .enablingSecureVault(let credentials, .verifying):
            settle(.biometricsSecured(credentials))
        case .enablingSecureVault(_, .removingCopy):
            settle(.ready)
        case .upgrading(let credentials, .storing):
            operation = .upgrading(credentials, step: .verifying)
            return .verify(.biometrics)
        case .upgrading(let credentials, .verifying):
            operation = .finishingUpgrade(credentials)
            return .remove(.keychain)
        case .finishingUpgrade(let credentials):
            settle(.biometricsSecured(credentials))
        case .upgrading(let credentials, .removingCopy):
            settle(.keychainSecured(credentials))
        case .downgrading(let credentials, removingBiometricItem: false):
            operation = .downgrading(credentials, removingBiometricItem: true)
            return .remove(.biometrics)
        case .downgrading(let credentials, removingBiometricItem: true):
            settle(.keychainSecured(credentials))
        case .disabling:
            settle(.ready)
        case .resetting(removingKeychainItem: false):
            operation = .resetting(removingKeychainItem: true)
            return .remove(.keychain)
        case .resetting(removingKeychainItem: true):
            settle(.ready)
        case .reauthenticating:
            settle(state)
        case .unlocking, nil:
            throw .unexpectedOutcome(.operationSucceeded, pending: pending)
        }
        return .none
    }

    /// The `read` action succeeded: the credentials, or nil when the item was gone.
    public mutating func credentialsRead(_ credentials: Credentials?) throws(VaultError) -> Action {
        guard case .unlocking = operation else {
            throw .unexpectedOutcome(.credentialsRead, pending: pending)
        }
        settle(credentials.map { .biometricsSecured($0) } ?? .ready)
        return .none
    }

    /// The action failed with `code`; the transition ends in the state that matches what is stored.
    ///
    /// - A failed write or removal changed nothing (the keychain's writes are atomic), so the
    ///   transition ends where it started, except after its first step:
    ///   - upgrade or enabling biometrics: the biometric copy didn't open with the user's finger
    ///     (`verify`: `USER_CANCELED`, `AUTHENTICATION_FAILED`, `LOCKOUT`, …) → it is removed
    ///     (`remove(.biometrics)`), then the state it started from; if that removal fails too, the
    ///     copy stays: → `keychainSecured` after an upgrade (both are stored), `locked` after
    ///     enabling (only the copy is);
    ///   - upgrade: the keychain item couldn't be removed, so both are stored → `keychainSecured`;
    ///   - downgrade: the biometric item couldn't be removed, so both are stored → `keychainSecured`;
    ///   - reset: the biometric item is gone, the keychain item may remain → `keychainSecured` from
    ///     `keychainSecured`, `ready` otherwise (those states had no keychain item).
    /// - Unlock: `KEY_INVALIDATED` means the keychain removed the biometric item (the enrolled
    ///   biometrics changed), and `locked` has no keychain copy → `ready`. Every other code
    ///   (`USER_CANCELED`, `USER_FALLBACK`, `SYSTEM_CANCELED`, `AUTHENTICATION_FAILED`, `LOCKOUT`,
    ///   `LOCKOUT_PERMANENT`, …) leaves the item → `locked`; after a lockout, `reauthenticateOwner()`.
    public mutating func operationFailed(_ code: KeychainError.Code) throws(VaultError) -> Action {
        guard let operation else { throw .unexpectedOutcome(.operationFailed, pending: nil) }
        if [.biometryNotAvailable, .biometryNotEnrolled, .passcodeNotSet].contains(code) {
            biometricsAvailable = false
        }
        switch operation {
        case .upgrading(let credentials, .verifying):
            self.operation = .upgrading(credentials, step: .removingCopy)
            return .remove(.biometrics)
        case .enablingSecureVault(let credentials, .verifying):
            self.operation = .enablingSecureVault(credentials, step: .removingCopy)
            return .remove(.biometrics)
        case .enablingSecureVault(_, .removingCopy):
            settle(.locked)
        case .finishingUpgrade(let credentials), .upgrading(let credentials, .removingCopy),
             .downgrading(let credentials, removingBiometricItem: true):
            settle(.keychainSecured(credentials))
        case .resetting(removingKeychainItem: true):
            if case .keychainSecured = state { settle(state) } else { settle(.ready) }
        case .unlocking where code == .keyInvalidated:
            settle(.ready)
        case .enablingKeychainVault, .enablingSecureVault, .upgrading, .downgrading, .disabling,
             .resetting, .unlocking, .reauthenticating:
            settle(state)
        }
        return .none
    }

    // MARK: Private

    /// A transition waiting for its keychain operation, with what its next steps need.
    fileprivate enum Operation: Sendable {
        case enablingKeychainVault(Credentials)
        case enablingSecureVault(Credentials, step: BiometricWrite)
        case upgrading(Credentials, step: BiometricWrite)
        /// The finger opened the biometric copy; the keychain item is being removed.
        case finishingUpgrade(Credentials)
        case downgrading(Credentials, removingBiometricItem: Bool)
        case disabling
        case unlocking
        case resetting(removingKeychainItem: Bool)
        case reauthenticating

        var event: VaultEvent {
            switch self {
            case .enablingKeychainVault: .enableKeychainVault
            case .enablingSecureVault: .enableSecureVaultWithBiometrics
            case .upgrading, .finishingUpgrade: .upgradeKeychainWithBiometrics
            case .downgrading: .downgradeBiometricsToKeychain
            case .disabling: .disableBiometricsSecureVault
            case .unlocking: .unlockWithBiometrics
            case .resetting: .resetEverything
            case .reauthenticating: .reauthenticateOwner
            }
        }
    }

    /// Where a transition that puts the credentials behind biometrics is.
    fileprivate enum BiometricWrite: Sendable, Equatable {
        /// The biometric copy is being written.
        case storing
        /// The copy is being read back with the user's finger.
        case verifying
        /// The finger did not open the copy; it is being removed again.
        case removingCopy
    }

    private func checkIdle(_ event: VaultEvent) throws(VaultError) {
        if let operation {
            throw .operationInProgress(pending: operation.event, event: event)
        }
    }

    private func checkBiometrics(_ event: VaultEvent) throws(VaultError) {
        if !biometricsAvailable {
            throw .biometricsUnavailable(event: event)
        }
    }

    private func refusal(_ event: VaultEvent) -> VaultError {
        .transitionNotAllowed(from: state.kind, event: event)
    }

    /// Ends the pending transition in `new`.
    private mutating func settle(_ new: VaultState<Credentials>) {
        operation = nil
        state = new
        normalize()
    }

    /// With nothing stored, `ready` needs biometrics and `unavailable` means there are none.
    private mutating func normalize() {
        switch state {
        case .ready where !biometricsAvailable: state = .unavailable
        case .unavailable where biometricsAvailable: state = .ready
        default: break
        }
    }
}

extension VaultStateMachine.Action: Equatable where Credentials: Equatable {}
extension VaultStateMachine.Operation: Equatable where Credentials: Equatable {}
extension VaultStateMachine: Equatable where Credentials: Equatable {}
