import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

// MARK: Access control: the reader and what a write can get

extension Engine {
    /// What a write needs (seed: AccessControl, "What a write needs"), checked before anything is
    /// stored: a write never stores an item with less protection than asked.
    func writeRequirements(_ protection: ItemProtection, reader: FingerprintReader?)
        throws(KeychainError) -> (biometry: SealPolicy.BiometryBinding?, passcode: Bool) {
        let control = protection.accessControl
        guard control != .none else { return (nil, false) }
        if control.needsBiometry && reader == nil {
            throw KeychainError(.biometryNotAvailable,
                                "accessControl '\(control.rawValue)' needs a fingerprint reader, and this device has none")
        }
        let passcodeSet = try withKeyring { keyring throws(KeychainError) in
            try keyring.passcodeIsSet()
        }
        guard passcodeSet else {
            throw KeychainError(.passcodeNotSet,
                                "accessControl '\(control.rawValue)' needs a device passcode: set one first (keychainctl passcode set)")
        }
        let enrolled = !(reader?.enrolled.isEmpty ?? true)
        if control.needsBiometry && !enrolled {
            throw KeychainError(.biometryNotEnrolled,
                                "accessControl '\(control.rawValue)' needs an enrolled finger (keychainctl reader enroll NAME)"
                                + (control.allowsPasscode ? "; the passcode does not make up for it" : ""))
        }
        var biometry: SealPolicy.BiometryBinding?
        if control.usesBiometry, enrolled, let reader, let state = reader.state {
            biometry = .init(keyName: state.keyName, tpmHandle: state.tpmHandle,
                             enrollmentSet: control.isCurrentSet ? reader.enrollmentSet : [], currentSet: control.isCurrentSet)
        }
        return (biometry, control.allowsPasscode)
    }

    /// The same answer as a write would give, without writing and without a prompt.
    /// - Throws: `DATA_CORRUPTED` for a store or reader put back from a copy (or edited): no answer
    ///   about it is true, and "unsupported" would send the caller to the wrong fix.
    func canUse(_ value: AccessControl, readerDirectory: String?) throws(KeychainError) -> AccessControlCheck {
        guard value != .none else { return .init(available: true) }
        do {
            let reader = try readerDirectory.map { (dir: String) throws(KeychainError) in try checkedReader(dir) }
            _ = try writeRequirements(try ItemProtection(accessControl: value), reader: reader)
            return .init(available: true)
        } catch {
            switch error.code {
            case .biometryNotAvailable: return .init(available: false, reason: .notAvailable)
            case .biometryNotEnrolled: return .init(available: false, reason: .notEnrolled)
            case .passcodeNotSet: return .init(available: false, reason: .passcodeNotSet)
            case .dataCorrupted: throw error
            default: return .init(available: false, reason: .unsupported)
            }
        }
    }

    /// Proves the passcode to the TPM (an unlock) when one is set, so enrollment follows the passcode.
    func requirePasscodeForEnrollment(_ passcode: SecureBytes?) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            let isSet = try keyring.passcodeIsSet()
            guard isSet else { return }
            guard let passcode else {
                throw KeychainError(.authenticationFailed, "Changing the enrolled fingers needs the device passcode (on stdin)")
            }
            try keyring.unlock(passcode: passcode)
        }
    }

    func enroll(_ finger: String, passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) {
        try requirePasscodeForEnrollment(passcode)
        let reader = try checkedReader(readerDirectory)
        try withKeyring { keyring throws(KeychainError) in try reader.enroll(finger, keyring: keyring) }
        try recordGeneration(of: reader)
        try resetLockout(of: reader, account: nil)
        unsealed = unsealed.filter { $0.value.opened == nil }
        if let passcode { try addReaderBranch(passcode: passcode, readerDirectory: readerDirectory) }
    }

    /// `biometryAnyOrPasscode` means "a finger or the passcode": a key written while no finger was
    /// enrolled has the passcode branch alone. Once one is, the passcode (just proved by the enrollment)
    /// opens each such key of this store and it is sealed again with both branches (`reseal`: the same
    /// secret and keyRef, one transaction per key). A key this misses (a killed enrollment, another
    /// store on the TPM) gets its reader branch at its next read with the passcode.
    func addReaderBranch(passcode: SecureBytes, readerDirectory: String) throws(KeychainError) {
        let store = try store()
        for wrapping in try read({ try store.wrappingKeys(whereProtectionHasPrefix: "") }) {
            guard let policy = SealPolicy.decode(wrapping.policy),
                  let upgraded = withReaderBranch(policy, wrapping, readerDirectory: readerDirectory) else { continue }
            let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
            // A key the passcode no longer opens (PCRs changed, an old epoch) stays as it is.
            guard let secret = try? withKeyring({ keyring throws(KeychainError) in
                try keyring.unseal(blob, policy: policy, authorization: .passcode(passcode, window: 0))
            }) else { continue }
            reseal(secret, wrapping, upgraded, store: store)
        }
    }

    /// The policy with the reader's `Any` branch added, for a live `biometryAnyOrPasscode` key sealed to
    /// the passcode alone while the configured reader has a finger; nil for every other key.
    func withReaderBranch(_ policy: SealPolicy, _ wrapping: WrappingKeyRecord, readerDirectory: String?) -> SealPolicy? {
        guard policy.biometry == nil, policy.passcode == true, !wrapping.protection.contains("~"),
              wrapping.backend == .tpm,
              ItemProtection(storageTag: wrapping.protection)?.accessControl == .biometryAnyOrPasscode,
              let readerDirectory, let reader = try? checkedReader(readerDirectory),
              !reader.enrolled.isEmpty, let state = reader.state else { return nil }
        var upgraded = policy
        upgraded.biometry = .init(keyName: state.keyName, tpmHandle: state.tpmHandle, enrollmentSet: [], currentSet: false)
        upgraded.keyRef = SealPolicy.keyRef(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        return upgraded
    }

    /// Deletes the reader and frees its TPM key's persistent handle; its items keep only their
    /// passcode branch (CurrentSet ones report KEY_INVALIDATED). A reader put back from an older
    /// copy can be deleted (the recovery `checkedReader` names), and a bound store records one more
    /// change than either it or the copy had, so the copy put back again is refused.
    ///
    /// Crash-atomic: the record comes first, then the file goes. A kill in between leaves the file
    /// behind the record, which `checkedReader` refuses naming `reader delete`, what was being done;
    /// the other order left the store's record unchanged, and a copy of the file put back passed.
    func deleteReader(passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) -> Bool {
        try requirePasscodeForEnrollment(passcode)
        let reader = try FingerprintReader(directory: readerDirectory)
        unsealed = unsealed.filter { $0.value.opened == nil }
        if let keyName = reader.keyName {
            try recordGeneration(keyName: keyName) { recorded in max(reader.generation, recorded) + 1 }
        }
        return try withKeyring { keyring throws(KeychainError) in try reader.delete(keyring: keyring) }
    }

    func removeFinger(_ finger: String, passcode: SecureBytes?, readerDirectory: String) throws(KeychainError) -> Bool {
        try requirePasscodeForEnrollment(passcode)
        let reader = try checkedReader(readerDirectory)
        unsealed = unsealed.filter { $0.value.opened == nil }
        guard try reader.remove(finger) else { return false }
        try recordGeneration(of: reader)
        return true
    }

    func enrolledFingers(readerDirectory: String) throws(KeychainError) -> [String] {
        try checkedReader(readerDirectory).enrolled
    }
}

// MARK: Rollback of the reader's directory

extension Engine {
    /// The store, or nil when its directory holds none yet (neither a database nor an identity: a
    /// lost database beside its identity is `store()`'s refusal, not "none").
    func existingStore() throws(KeychainError) -> Store? {
        if let openedStore { return openedStore }
        let directory = configuration.storeDirectory + "/"
        guard FileManager.default.fileExists(atPath: directory + Store.databaseFileName)
            || FileManager.default.fileExists(atPath: directory + Store.identityFileName) else { return nil }
        return try store()
    }

    /// The reader at `directory`, refused when the store recorded more enrollment changes of it than
    /// its file holds: an older copy of the reader's directory was put back (fingers removed since,
    /// an older enrollment set that CurrentSet keys of then were sealed to). Only bound stores record
    /// (`recordGeneration`), so with an unbound one nothing is refused.
    /// - Throws: `DATA_CORRUPTED` naming rollback, with the recovery.
    func checkedReader(_ directory: String) throws(KeychainError) -> FingerprintReader {
        try checkStoreAgainstCounter()
        let reader = try FingerprintReader(directory: directory)
        guard let keyName = reader.keyName else { return reader }
        let recorded = try recordedGeneration(of: keyName)
        guard reader.generation < recorded else { return reader }
        throw Self.readerRolledBack(directory, generation: reader.generation, recorded: recorded)
    }

    /// A bound store checked against its TPM counter before its reader is used. The reader's record
    /// is in the store, so a copy of both put back together agrees with itself: only the counter
    /// tells, and every use of the reader (listing, `can-use`, enrollment) is refused naming rollback
    /// as a read is. Free when this process knows the counter at the store's value, or inside a TPM
    /// operation (which checked it as it began); otherwise a TPM operation that only checks.
    func checkStoreAgainstCounter() throws(KeychainError) {
        guard activeKeyring == nil, !rollbackCheckSuspended, let store = try existingStore(),
              let recorded = try rollbackState(store)?.record, recorded.value != rollbackKnown else { return }
        try withKeyring { _ throws(KeychainError) in }
    }

    nonisolated static func readerRolledBack(_ directory: String, generation: UInt64, recorded: UInt64) -> KeychainError {
        KeychainError(.dataCorrupted, "Rollback: the fingerprint reader's state in \(directory) is an older copy (its "
                      + "\(generation) enrollment changes are behind the store's \(recorded)), put back in place of the "
                      + "current one: fingers removed since would be back. Put the current reader.json back; or delete the "
                      + "reader and enroll again, with the passcode: keychainctl reader delete, then keychainctl reader enroll NAME")
    }

    /// The reader for `status`: a copy put back, or a file that cannot be read, is said (with the
    /// refusal's words as a warning), never thrown.
    func readerStatus(_ directory: String) throws(KeychainError) -> (status: ReaderStatus, warning: String?) {
        var status = ReaderStatus(state: .absent, directory: directory)
        let reader: FingerprintReader
        do { reader = try FingerprintReader(directory: directory) } catch {
            status.state = .unreadable
            return (status, error.message)
        }
        guard let keyName = reader.keyName else { return (status, nil) }
        let recorded = try recordedGeneration(of: keyName)
        status.enrolled = reader.enrolled.count
        status.generation = reader.generation
        status.recordedGeneration = recorded
        guard reader.generation < recorded else {
            status.state = .current
            return (status, nil)
        }
        status.state = .rolledBack
        return (status, Self.readerRolledBack(directory, generation: reader.generation, recorded: recorded).message)
    }

    /// What the store recorded of the reader's enrollment changes; 0 where no store exists yet,
    /// which records nothing (`reader list` on a device with no store does not make one).
    func recordedGeneration(of keyName: [UInt8]) throws(KeychainError) -> UInt64 {
        guard let store = try existingStore() else { return 0 }
        return try read { try store.meta(StoreMeta.readerGeneration(keyName: keyName)) }.flatMap(UInt64.init(bigEndianBytes:)) ?? 0
    }

    /// Records the reader's generation once its file holds it, in a counted write (a bound store
    /// only). Crash-atomic: the file comes first, so a kill in between leaves the file ahead of the
    /// store, which `checkedReader` accepts, never behind.
    func recordGeneration(of reader: FingerprintReader) throws(KeychainError) {
        guard let keyName = reader.keyName else { return }
        let generation = reader.generation
        try recordGeneration(keyName: keyName) { _ in generation }
    }

    /// Records `generation(recorded)`, read and written in one counted transaction (a bound store only).
    private func recordGeneration(keyName: [UInt8], _ generation: (UInt64) -> UInt64) throws(KeychainError) {
        let store = try store()
        guard try rollbackState(store)?.record != nil else { return }
        let key = StoreMeta.readerGeneration(keyName: keyName)
        try writeStore(store) { tx in
            // Never backwards: another store's changes of a shared reader may have gone further.
            let recorded = try tx.meta(key).flatMap(UInt64.init(bigEndianBytes:)) ?? 0
            try tx.setMeta(key, max(recorded, generation(recorded)).bigEndianBytes)
        }
    }
}

// MARK: Failed touches bound to the store

extension Engine {
    /// A touch of `reader` for `account` (nil: the in-process caller). On a bound store its failures
    /// are recorded in a counted write too (before the file), and the lockout is the more of the
    /// file's and the store's counts: a copy of reader.json put back does not end a lockout.
    func touch(_ reader: FingerprintReader, finger: String, account: String?) throws(KeychainError) -> FingerprintReader.Match {
        let recorded = try recordedFailures(of: reader)[Self.failureAccount(account)] ?? 0
        return try reader.read(finger: finger, account: account, recorded: recorded) { count throws(KeychainError) in
            try recordFailures(of: reader) { counts in counts[Self.failureAccount(account)] = count == 0 ? nil : count }
        }
    }

    /// The lockout of `account` on `reader`, the store's record counted.
    func lockState(of reader: FingerprintReader, account: String?) throws(KeychainError) -> FingerprintReader.Match? {
        reader.lockState(of: account, recorded: try recordedFailures(of: reader)[Self.failureAccount(account)] ?? 0)
    }

    /// The passcode was entered: the lockout of `account` ends (nil: every account's), in the file and
    /// in the store's record (a counted write only when the store holds a count to clear).
    func resetLockout(of reader: FingerprintReader, account: String?) throws(KeychainError) {
        try reader.resetLockout(account: account)
        let recorded = try recordedFailures(of: reader)
        guard account.map({ recorded[Self.failureAccount($0)] != nil }) ?? !recorded.isEmpty else { return }
        try recordFailures(of: reader) { counts in
            if let account { counts[Self.failureAccount(account)] = nil } else { counts = [:] }
        }
    }

    private nonisolated static func failureAccount(_ account: String?) -> String { account ?? "owner" }

    /// The failed touches the store recorded of `reader`, by account; none where no store exists.
    private func recordedFailures(of reader: FingerprintReader) throws(KeychainError) -> [String: Int] {
        guard let keyName = reader.keyName, let store = try existingStore() else { return [:] }
        return try read { try Self.decodeFailures(store.meta(StoreMeta.readerFailures(keyName: keyName)), keyName) }
    }

    /// Changes the store's record of `reader`'s failures in one counted transaction (a bound store only).
    private func recordFailures(of reader: FingerprintReader, _ change: (inout [String: Int]) -> Void) throws(KeychainError) {
        guard let keyName = reader.keyName, let store = try existingStore(), try rollbackState(store)?.record != nil else { return }
        let key = StoreMeta.readerFailures(keyName: keyName)
        try writeStore(store) { tx in
            var counts = try Self.decodeFailures(tx.meta(key), keyName)
            change(&counts)
            if counts.isEmpty { _ = try tx.deleteMeta(key) } else { try tx.setMeta(key, Array(try JSONEncoder().encode(counts))) }
        }
    }

    private nonisolated static func decodeFailures(_ bytes: [UInt8]?, _ keyName: [UInt8]) throws(KeychainError) -> [String: Int] {
        guard let bytes else { return [:] }
        guard let counts = try? JSONDecoder().decode([String: Int].self, from: Data(bytes)) else {
            throw KeychainError(.dataCorrupted, "The store's record of the fingerprint reader's failed touches "
                                + "(\(StoreMeta.readerFailures(keyName: keyName))) cannot be read: delete the reader and enroll again, "
                                + "with the passcode (keychainctl reader delete)")
        }
        return counts
    }
}
