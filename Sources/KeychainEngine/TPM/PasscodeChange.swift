import KeychainCore
import KeychainStore
import SecureMemory
import TPM2

/// Setting, changing and removing the passcode, crash-atomic: after a kill at any point the TPM and
/// the store are in the old state or the new one.
///
/// NV_ChangeAuth on the PIN index is the one step that cannot be undone (it needs the old passcode),
/// and the descriptor's mark and the epoch can only be written with the passcode of the moment. So:
/// - set:    mark `setting` (empty passcode), ChangeAuth(empty → new), mark `set` (new);
/// - remove: mark `removing` (old), ChangeAuth(old → empty), then with the empty passcode: epoch + 1,
///           this store's whenPasscodeSet rows deleted, mark `none`;
/// - change: ChangeAuth(old → new), one command.
/// A process killed in between leaves `setting` or `removing`. The next operation finishes the change
/// knowing only the empty passcode: if the empty passcode passes PolicySecret the PIN is empty, so a
/// set is rolled back and a removal rolled forward; if not, a passcode is set: the set happened and
/// the removal did not.
///
/// - Important: that question costs one of the PIN's tries when a passcode is set (a kill right after
///   a set's ChangeAuth, or before a removal's). The mark can then only be rewritten with the
///   passcode, so the store remembers the answer for that mark and epoch, and the next unlock with the
///   passcode rewrites it: each store asks at most once per interrupted change.
extension TPMKeyring {

    /// Whether a passcode is set; an interrupted change is finished first. Read once per operation.
    func passcodeIsSet() throws(KeychainError) -> Bool {
        if let knownPasscodeSet { return knownPasscodeSet }
        let isSet = try readPasscodeState()
        knownPasscodeSet = isSet
        return isSet
    }

    private func readPasscodeState() throws(KeychainError) -> Bool {
        let mark: PasscodeMark
        do throws(TPMError) {
            guard let first = try context.readNV(try descriptorResource(), size: 1).first,
                  let read = PasscodeMark(rawValue: first) else {
                throw TPMError(command: "decode lock descriptor", code: .value)
            }
            mark = read
        } catch {
            throw diagnose(error, doing: "read the passcode state")
        }
        descriptor.mark = mark
        return mark.isInterrupted ? try finishInterruptedChange(mark) : mark == .set
    }

    /// - Returns: whether a passcode is set, once the change is finished.
    private func finishInterruptedChange(_ mark: PasscodeMark) throws(KeychainError) -> Bool {
        let epoch: UInt64
        do { epoch = try currentPasscodeEpoch() } catch { throw diagnose(error, doing: "read the passcode epoch") }
        let answer = [mark.rawValue] + epoch.bigEndianBytes
        if (try? store.meta(StoreMeta.passcodeKnownSet)) == answer { return true }
        do throws(TPMError) {
            // The empty passcode's PolicySecret is the question: is the PIN empty?
            if mark == .removing { try incrementEpoch(passcode: nil) } else { try writeMark(.none, passcode: nil) }
        } catch where error.code.is(.badAuth) || error.code.is(.authFail) {
            // Unsaved, the next operation would ask again and spend another of the PIN's tries.
            do { try store.write { try $0.setMeta(StoreMeta.passcodeKnownSet, answer) } } catch let error as StoreError {
                throw KeychainError(store: error)
            } catch {
                throw KeychainError(.internal, "\(error)")
            }
            return true
        } catch {
            throw passcodeError(error, doing: "finish an interrupted passcode change")
        }
        if mark == .removing { try completeRemoval() }
        return false
    }

    /// Changes the passcode (nil: none). The caller checked that `old` matches the passcode state.
    func changePasscode(from old: SecureBytes?, to new: SecureBytes?) throws(KeychainError) {
        do throws(TPMError) {
            switch (old, new) {
            case (nil, nil):
                return
            case (nil, let new?):
                try writeMark(.setting, passcode: nil)
                try changeAuth(from: nil, to: new)
                try writeMark(.set, passcode: new)
            case (let old?, nil):
                try writeMark(.removing, passcode: old)
                try changeAuth(from: old, to: nil)
                try incrementEpoch(passcode: nil)
            case (let old?, let new?):
                try changeAuth(from: old, to: new)
                if descriptor.mark != .set { try writeMark(.set, passcode: new) }
            }
        } catch {
            throw passcodeError(error, doing: "change the passcode")
        }
        if new == nil { try completeRemoval() }
        forgetKnownSet()
    }

    /// After an unlock with the passcode: a mark this store found to mean "set" is rewritten as `set`.
    func repairInterruptedMark(with passcode: SecureBytes) throws(KeychainError) {
        guard (try? store.meta(StoreMeta.passcodeKnownSet)) != nil else { return }
        knownPasscodeSet = nil
        if try passcodeIsSet(), descriptor.mark.isInterrupted {
            do { try writeMark(.set, passcode: passcode) } catch { throw passcodeError(error, doing: "record the passcode") }
        }
        forgetKnownSet()
    }

    /// The rest of a removal once the PIN is empty (the epoch was bumped): this store's
    /// whenPasscodeSetThisDeviceOnly rows go (their keys are dead in the TPM), then the mark.
    private func completeRemoval() throws(KeychainError) {
        let tag = Accessible.whenPasscodeSetThisDeviceOnly.rawValue + "/"
        let epoch: UInt64
        do { epoch = try currentPasscodeEpoch() } catch { throw diagnose(error, doing: "read the passcode epoch") }
        do {
            try store.write { tx in
                try tx.setMeta(StoreMeta.passcodeRemovedEpoch, epoch.bigEndianBytes)
                for key in try tx.wrappingKeys(whereProtectionHasPrefix: tag) {
                    _ = try tx.deleteItems(protection: key.protection)
                    _ = try tx.deleteWrappingKeys(protection: key.protection)
                }
            }
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
        finishedRemoval = true
        do { try writeMark(.none, passcode: nil) } catch { throw passcodeError(error, doing: "record the passcode removal") }
    }

    private func forgetKnownSet() {
        _ = try? store.write { _ = try $0.deleteMeta(StoreMeta.passcodeKnownSet) }
    }

    private func descriptorResource() throws(TPMError) -> TPMHandle {
        if let tr = try? store.meta(StoreMeta.descriptorTR), let handle = try? context.deserialize(tr) { return handle }
        let handle = try context.resource(forPersistent: DeviceLockLayout.descriptorIndex)
        if let tr = try? context.serialize(handle) { _ = try? store.write { try $0.setMeta(StoreMeta.descriptorTR, tr) } }
        return handle
    }

    private func writeMark(_ mark: PasscodeMark, passcode: SecureBytes?) throws(TPMError) {
        let nv = try descriptorResource()
        try Self.withPasscode(passcode, command: CommandCode.nvWrite, context: context, srk: srk) { policy throws(TPMError) in
            try context.writeNV(nv, data: [mark.rawValue], offset: 0, authHandle: nv, session: policy)
        }
        descriptor.mark = mark
        knownPasscodeSet = mark == .set
    }

    private func incrementEpoch(passcode: SecureBytes?) throws(TPMError) {
        try Self.withPasscode(passcode, command: CommandCode.nvIncrement, context: context, srk: srk) { policy throws(TPMError) in
            try context.incrementNV(epochNV, session: policy)
        }
    }

    /// NV_ChangeAuth: needs the current passcode (PolicyAuthValue); the new one crosses the bus
    /// encrypted (salted session, decrypt attribute).
    private func changeAuth(from old: SecureBytes?, to new: SecureBytes?) throws(TPMError) {
        let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
        try context.setAuth(pin, old)
        defer { try? context.setAuth(pin, nil) }
        try context.withSession(.policy, saltKey: srk, decryptCommand: true) { policy throws(TPMError) in
            try context.run(DeviceLockLayout.changeAuthSteps, on: policy, nvIndex: Self.noIndex)
            try context.changeNVAuth(pin, to: new, session: policy)
        }
    }
}

extension SecureBytes {
    /// Refuses a new passcode the PIN index cannot take: its authValue holds at most one SHA-256 digest
    /// (32 bytes), and a passcode of fewer than 4 bytes is no passcode.
    package func checkAsNewPasscode() throws(KeychainError) {
        guard (4...32).contains(count) else {
            throw KeychainError.invalidArgument("Invalid passcode: expected 4 to 32 bytes, got \(count)")
        }
    }
}
