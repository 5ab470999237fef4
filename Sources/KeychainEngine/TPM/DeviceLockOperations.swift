import KeychainCore
import KeychainStore
import SecureMemory
import TPM2

/// The device lock and passcode, as the TPM keeps them (`DeviceLock`, `PasscodeChange`).
extension Engine {
    /// Unlocks; a passcode that the TPM accepted also ends a fingerprint-reader lockout (through
    /// keychaind, the caller's: each uid's failures are its own). A caller through keychaind spends
    /// its own budget of wrong passcodes (`PasscodeBudget`).
    func unlock(passcode: SecureBytes?, readerDirectory: String? = nil, caller: Caller? = nil) throws(KeychainError) {
        let generation = try lockGeneration(try store())
        try spendingPasscodeBudget(of: caller) { () throws(KeychainError) in
            try countingWrongPasscodes { () throws(KeychainError) in
                try withKeyring { keyring throws(KeychainError) in
                    try keyring.unlock(passcode: passcode)
                    if let passcode { try keyring.repairInterruptedMark(with: passcode) }
                }
            }
        }
        seenUnlocked = generation
        startedTPMNeedsUnlock = false
        if passcode != nil, let readerDirectory {
            try resetLockout(of: FingerprintReader(directory: readerDirectory), account: caller?.readerAccount)
        }
    }

    /// keychaind's start (issue 20): a device without a passcode counts as unlocked, so the unlock that
    /// the first read after a TPM reset (every boot) would begin with is made now, before keychaind says
    /// it is ready, and the store's open and tpm2-tss's set-up with it. Nothing for a device with a
    /// passcode (its lock is its user's) nor for one the TPM says is unlocked.
    /// - Returns: whether it unlocked.
    func unlockWithoutPasscodeAtStart() throws(KeychainError) -> Bool {
        let locked = try withKeyring { keyring throws(KeychainError) -> Bool in
            guard try !keyring.passcodeIsSet() else { return false }
            return try keyring.lockState() != .unlocked
        }
        guard locked else { return false }
        try unlock(passcode: nil)
        return true
    }

    func lock() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in try keyring.lock() }
        let store = try store()
        try writeStore(store) { tx in
            let generation = try tx.meta(StoreMeta.lockGeneration).flatMap(UInt64.init(bigEndianBytes:)) ?? 0
            try tx.setMeta(StoreMeta.lockGeneration, (generation + 1).bigEndianBytes)
        }
        forgetSecrets(keepingLongLived: true)
    }

    /// Crash-atomic (`TPMKeyring.changePasscode`): a removal also deletes this store's
    /// whenPasscodeSetThisDeviceOnly items (Apple: their keys are dead in the TPM too), and ends every
    /// item behind an access control: their keys are bound to the passcode epoch the removal bumps
    /// (KEY_INVALIDATED at their next read). The enrolled fingers of `readerDirectory` go after the
    /// TPM's part; a kill between the two leaves them enrolled over items that are dead already.
    func setPasscode(old: SecureBytes?, new: SecureBytes?, readerDirectory: String? = nil) throws(KeychainError) {
        try countingWrongPasscodes { () throws(KeychainError) in
            try withKeyring { keyring throws(KeychainError) in
                let isSet = try keyring.passcodeIsSet()
                if old == nil && isSet {
                    throw KeychainError(.invalidArgument, "A passcode is already set: change it with the current one (keychainctl passcode change)")
                }
                if old != nil && !isSet { throw passcodeNotSet() }
                try keyring.changePasscode(from: old, to: new)
                // Whoever just proved the passcode is at the device: it is unlocked, as after a passcode change on iOS.
                try keyring.unlock(passcode: new)
            }
        }
        guard old != nil, new == nil else { return }
        // No secret of an access-controlled item outlives the passcode in this process (authValidity windows).
        unsealed = unsealed.filter { $0.value.opened == nil }
        if let readerDirectory {
            // A reader put back from an older copy is emptied too, and current after it.
            let reader = try FingerprintReader(directory: readerDirectory)
            let recorded = try reader.keyName.map { (name: [UInt8]) throws(KeychainError) in try recordedGeneration(of: name) } ?? 0
            if try reader.removeAll(past: recorded) { try recordGeneration(of: reader) }
        }
    }

    func resetPasscodeTries() throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            try keyring.resetPasscodeTries(limit: configuration.passcodeRetryLimit)
        }
        try recordWrongPasscodes(0)
        try resetPasscodeBudgets()
    }

    /// Runs `body`, which proves a passcode to the TPM's PIN index. A wrong one (the TPM counted it)
    /// is told with the tries left before the TPM refuses the passcode, from this store's count of
    /// wrong passcodes in a row and the PIN index's limit; a passcode accepted zeroes the count.
    /// - Important: another store on the same TPM counts its own: the TPM may have fewer left.
    func countingWrongPasscodes<T>(_ body: () throws(KeychainError) -> T) throws(KeychainError) -> T {
        let before = (try? store().meta(StoreMeta.wrongPasscodes)).flatMap { $0.flatMap(UInt32.init(bigEndianBytes:)) } ?? 0
        let result: T
        do {
            result = try body()
        } catch where error.code == .authenticationFailed && error.message.hasPrefix("Wrong passcode") {
            let count = before + 1
            try? recordWrongPasscodes(count)
            let left = configuration.passcodeRetryLimit > count ? configuration.passcodeRetryLimit - count : 0
            throw KeychainError(.authenticationFailed, error.message + ": \(left) \(left == 1 ? "try" : "tries") left before the TPM "
                                + "refuses the passcode until the owner resets its count (keychainctl passcode reset-tries)",
                                underlying: error.underlying)
        }
        if before != 0 { try? recordWrongPasscodes(0) }
        return result
    }

    private func recordWrongPasscodes(_ count: UInt32) throws(KeychainError) {
        try writeStore(try store()) { tx in try tx.setMeta(StoreMeta.wrongPasscodes, count.bigEndianBytes) }
    }

    /// The device lock, the TPM's authorizations, the store's rollback counter and the reader at
    /// `readerDirectory`; a store behind its counter, or a reader behind the store's record of it,
    /// is reported (`rollbackCounter`, `reader`, a warning), not refused.
    func status(readerDirectory: String? = nil) throws(KeychainError) -> DeviceStatus {
        rollbackCheckSuspended = true
        defer { rollbackCheckSuspended = false }
        return try withKeyring { keyring throws(KeychainError) in
            let passcodeSet = try keyring.passcodeIsSet()
            let state = try keyring.lockState()
            let ownership = try ownershipStatus(keyring)
            // The embedded TPM's store is bound on first use: this may be it.
            if case .embedded = configuration.tpm, try rollbackState(keyring.store)?.record == nil { try bindRollbackCounter(keyring) }
            let counter = try rollbackCounterStatus(keyring)
            let reader = try readerDirectory.map { (directory: String) throws(KeychainError) in try readerStatus(directory) }
            return DeviceStatus(passcodeSet: passcodeSet,
                                lockState: passcodeSet ? .init(rawValue: state.rawValue)! : .unlocked,
                                securityLevel: keyring.isSoftwareTPM ? .softwareTPM : .hardwareTPM,
                                tpm: "\(keyring.context.device)",
                                ownerAuthorizationSet: ownership.owner, lockoutAuthorizationSet: ownership.lockout,
                                storageRootKey: ownership.srk,
                                warnings: ownership.warnings + counter.warnings + (reader?.warning.map { [$0] } ?? []),
                                rollbackCounter: counter, reader: reader?.status)
        }
    }

    /// Makes sure the store and the TPM are provisioned (SRK, device-lock indices).
    func initialize() throws(KeychainError) -> DeviceStatus {
        try configuration.checkPCRSelection()
        return try status()
    }

}
