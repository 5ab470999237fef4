import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

// The device lock: its state, unlocking with a passcode, locking, the passcode tries.
extension TPMKeyring {
    // MARK: The device lock

    func currentPasscodeEpoch() throws(TPMError) -> UInt64 {
        UInt64(bigEndianBytes: try context.readNV(epochNV, size: 8)) ?? 0
    }

    enum LockState: String { case beforeFirstUnlock, locked, unlocked }

    func lockState() throws(KeychainError) -> LockState {
        do {
            let bytes = try context.readNV(stateNV, size: 1)
            return bytes == DeviceLockLayout.unlocked ? .unlocked : .locked
        } catch where error.code.is(.nvUninitialized) {
            return .beforeFirstUnlock
        } catch {
            throw diagnose(error, doing: "read the lock state")
        }
    }

    /// Without a passcode the device counts as unlocked (as on iOS): unlocks it with the empty passcode.
    /// - Returns: false, and nothing done, when a passcode is set.
    func unlockIfNoPasscode() throws(KeychainError) -> Bool {
        guard try !passcodeIsSet() else { return false }
        try unlock(passcode: nil)
        return true
    }

    /// Writes "unlocked", authorized by the passcode through PolicySecret in a salted session:
    /// the TPM checks the PIN and counts wrong ones on its PIN index.
    func unlock(passcode: SecureBytes?) throws(KeychainError) {
        do {
            try attemptUnlock(passcode)
        } catch where error.command == "NV_Write" && error.code.is(.badAuth) {
            // The passcode was accepted (PolicySecret passed), but another process wrote the state
            // index between our reading its public area and our write: its name (TPMA_NV_WRITTEN)
            // changed under the session's HMAC. Once more, with the public area read again.
            do { try attemptUnlock(passcode) } catch { throw passcodeError(error, doing: "unlock") }
        } catch {
            throw passcodeError(error, doing: "unlock")
        }
    }

    private func attemptUnlock(_ passcode: SecureBytes?) throws(TPMError) {
        do {
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)  // reads the public area now
            try context.setAuth(pin, passcode)
            defer { try? context.setAuth(pin, nil) }
            try context.withSession(.hmac, saltKey: srk) { auth throws(TPMError) in
                try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                    try context.run(DeviceLockLayout.unlockSteps(approvalKeyName: descriptor.approval.keyName), on: policy,
                                    nvIndex: Self.noIndex,
                                    other: { _ throws(TPMError) in try context.policySecret(policy, entity: pin, authSession: auth) })
                    try context.writeNV(state, data: DeviceLockLayout.unlocked, authHandle: state, session: policy)
                }
            }
        }
    }

    /// Writes "locked" through the once-approved policy: no secret needed, and none could unlock.
    func lock() throws(KeychainError) {
        do {
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
            do {
                _ = try context.readNV(state, size: 1)
            } catch where error.code.is(.nvUninitialized) {
                return  // before the first unlock: locked already
            }
            let statePublic = DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)
            let approval = descriptor.approval
            try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                try context.run(DeviceLockLayout.lockSteps(approvalKeyName: approval.keyName), on: policy, nvIndex: Self.noIndex,
                                other: { _ throws(TPMError) in
                    try context.policyAuthorize(policy, approvedPolicy: DeviceLockLayout.lockPolicy(state: statePublic),
                                                policyRef: DeviceLockLayout.lockPolicyRef, keyPublic: approval.keyPublic,
                                                keyName: approval.keyName, signature: approval.signatures[0])
                })
                try context.writeNV(state, data: DeviceLockLayout.locked, authHandle: state, session: policy)
            }
        } catch {
            throw diagnose(error, doing: "lock the device")
        }
    }

    /// Resets the TPM's count of wrong passcodes (needs the owner authorization).
    func resetPasscodeTries(limit: UInt32) throws(KeychainError) {
        do {
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            try context.writeNV(pin, data: UInt32(0).bigEndianBytes + limit.bigEndianBytes,
                                authHandle: TPMContext.owner, session: nil)
        } catch {
            throw KeychainError(.authenticationFailed, "Cannot reset the passcode tries: the owner authorization was refused",
                                underlying: .tpm(error))
        }
    }

    func passcodeError(_ error: TPMError, doing what: String) -> KeychainError {
        if error.code.is(.badAuth) || error.code.is(.authFail) {
            return KeychainError(.authenticationFailed, "Wrong passcode: could not \(what)", underlying: .tpm(error))
        }
        if error.code.is(.authUnavailable) {
            return KeychainError(.lockout,
                                 "Too many wrong passcodes: the TPM refuses the passcode until the owner resets its "
                                 + "count (keychainctl passcode reset-tries)", underlying: .tpm(error))
        }
        return diagnose(error, doing: what)
    }
}
