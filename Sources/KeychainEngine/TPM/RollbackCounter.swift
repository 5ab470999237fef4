import KeychainCore
import KeychainStore
import SecureMemory
import TPM2
import KeychainWire

/// The TPM monotonic counter a store is bound to, so that a copy of the store put back is seen.
///
/// One `TPM_NT_COUNTER` index per store, `ORDERLY` (kept in the TPM's RAM and saved to NV only every
/// `TPM_PT_ORDERLY_COUNT` + 1 increments and at TPM2_Shutdown: no NV write per increment), `NO_DA`,
/// read and incremented with its own authValue: 32 random bytes kept in the store, proven in an HMAC
/// session so they never cross the bus. Its authPolicy is empty (no policy, no NV_ChangeAuth) and
/// NV_UndefineSpace needs the owner authorization, so another user who talks to the TPM cannot
/// advance, rewrite or remove it without the owner authorization or the store's files.
enum RollbackCounterLayout {
    /// The owner-range handles the counters take: the first free one from a place chosen by the
    /// store's identity (stores that share a TPM take different ones).
    static let firstIndex: UInt32 = 0x0100_4C00
    static let indexCount: UInt32 = 256

    static let attributes = NVAttributes.typeCounter | NVAttributes.authWrite | NVAttributes.authRead
        | NVAttributes.noDA | NVAttributes.orderly

    static func `public`(_ index: UInt32) -> NVPublic {
        NVPublic(index: index, attributes: attributes, authPolicy: [], size: 8)
    }

    /// Where a store's search for a free handle starts.
    static func start(identity: [UInt8]) -> UInt32 {
        firstIndex + UInt32(sha256(identity).prefix(2).reduce(0) { $0 << 8 | Int($1) }) % indexCount
    }
}

/// The counter a store is bound to (meta `rollback.counter`): written before the index is defined,
/// so a process killed after NV_DefineSpace finds the index it made (and its authValue) again.
struct RollbackBinding: Equatable {
    var index: UInt32
    /// `TPM_PT_ORDERLY_COUNT` + 1: how far a restart without TPM2_Shutdown may move the counter ahead.
    var window: UInt32
    var authorization: [UInt8]

    /// [index 4][window 4][authValue 32]
    func encoded() -> [UInt8] { index.bigEndianBytes + window.bigEndianBytes + authorization }

    init(index: UInt32, window: UInt32, authorization: [UInt8]) {
        (self.index, self.window, self.authorization) = (index, window, authorization)
    }

    init?(decoding bytes: [UInt8]) {
        guard bytes.count == 40 else { return nil }
        index = bytes[0..<4].reduce(0) { $0 << 8 | UInt32($1) }
        window = bytes[4..<8].reduce(0) { $0 << 8 | UInt32($1) }
        authorization = Array(bytes[8...])
    }
}

/// What a store records of its counter at each committing write (meta `rollback.counter.value`): the
/// value the counter has once the write's NV_Increment is done, and the TPM's reset and restart
/// counts then. Present once the store is bound.
struct RollbackRecord: Equatable {
    var value: UInt64
    var clock: TPMContext.ClockCounts

    /// [value 8][resetCount 4][restartCount 4]
    func encoded() -> [UInt8] { value.bigEndianBytes + clock.resetCount.bigEndianBytes + clock.restartCount.bigEndianBytes }

    init(value: UInt64, clock: TPMContext.ClockCounts) { (self.value, self.clock) = (value, clock) }

    init?(decoding bytes: [UInt8]) {
        guard bytes.count == 16 else { return nil }
        value = bytes[0..<8].reduce(0) { $0 << 8 | UInt64($1) }
        clock = .init(resetCount: bytes[8..<12].reduce(0) { $0 << 8 | UInt32($1) },
                      restartCount: bytes[12..<16].reduce(0) { $0 << 8 | UInt32($1) })
    }
}

/// The store's record against the TPM's counter: a value, tested without a TPM.
enum RollbackVerdict: Equatable {
    /// The store holds the counter's value.
    case current
    /// One ahead: a write committed and its process ended before its NV_Increment; one increment catches up.
    case oneAhead
    /// Behind by at most the window after a TPM Reset or Restart the store has not seen: an orderly
    /// counter jumps ahead after a shutdown without TPM2_Shutdown. Accepted once: the store takes the value.
    case restartWindow(behind: UInt64)
    /// Behind otherwise: an older copy of the store was put back.
    case rolledBack(behind: UInt64)
    /// More than one ahead: no write of ours makes that, the record was edited.
    case forged(ahead: UInt64)

    static func of(_ recorded: RollbackRecord, counter: UInt64, clock: TPMContext.ClockCounts, window: UInt32) -> Self {
        if recorded.value == counter { return .current }
        if recorded.value == counter &+ 1 { return .oneAhead }
        if recorded.value > counter { return .forged(ahead: recorded.value - counter) }
        let behind = counter - recorded.value
        if recorded.clock != clock && behind <= UInt64(window) { return .restartWindow(behind: behind) }
        return .rolledBack(behind: behind)
    }
}

extension Engine {
    /// The binding and record of `store`; nil binding: unbound; nil record: a binding was interrupted.
    nonisolated func rollbackState(_ store: Store) throws(KeychainError) -> (binding: RollbackBinding, record: RollbackRecord?)? {
        try read { () throws -> (RollbackBinding, RollbackRecord?)? in
            guard let binding = try store.meta(StoreMeta.rollbackCounter).flatMap(RollbackBinding.init(decoding:)) else { return nil }
            return (binding, try store.meta(StoreMeta.rollbackValue).flatMap(RollbackRecord.init(decoding:)))
        }
    }

    /// The counter's ESAPI resource with its authValue set: NV_ReadPublic once per process (its name
    /// checked against ours: someone else's index at our handle is refused), deserialized after.
    func counterIndex(_ keyring: TPMKeyring, _ binding: RollbackBinding) throws(KeychainError) -> TPMHandle {
        let context = keyring.context
        do {
            let handle: TPMHandle
            if let kept = rollbackCounterTR, kept.index == binding.index {
                handle = try context.deserialize(kept.tr)
            } else {
                handle = try context.resource(forPersistent: binding.index)
                guard try context.name(of: handle) == RollbackCounterLayout.public(binding.index).name(written: true) else {
                    throw KeychainError(.dataCorrupted, "The TPM's NV index \(upperHex(UInt64(binding.index))) is not this store's rollback counter "
                                                               + "(other attributes, or never incremented): "
                                        + "it was replaced. Bind the store again: keychainctl accept-store --owner-auth-file FILE")
                }
                rollbackCounterTR = (binding.index, try context.serialize(handle))
            }
            try context.setAuth(handle, SecureBytes(copying: binding.authorization))
            return handle
        } catch let error as TPMError {
            if error.code.is(.handle) || error.code.is(.value) {
                throw KeychainError(.dataCorrupted, "The TPM no longer holds this store's rollback counter (NV index \(upperHex(UInt64(binding.index)))): "
                                    + "it was undefined or the TPM cleared. Bind the store again: keychainctl accept-store --owner-auth-file FILE",
                                    underlying: .tpm(error))
            }
            throw keyring.diagnose(error, doing: "open the store's rollback counter")
        } catch let error as KeychainError {
            throw error
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    private func counterCall<T>(_ keyring: TPMKeyring, _ what: String, _ body: () throws(TPMError) -> T) throws(KeychainError) -> T {
        do throws(TPMError) { return try body() } catch { throw keyring.diagnose(error, doing: what) }
    }

    /// Checks the store against its counter at the start of a TPM operation (`withConnection`).
    ///
    /// Free when this process knows the counter's value and the store holds it; otherwise the
    /// counter is read (StartAuthSession, NV_Read) and, on the first time, the clock (ReadClock).
    /// One ahead is caught up (NV_Increment); within the restart window the store takes the value.
    /// - Throws: `DATA_CORRUPTED` naming rollback for a store behind the counter, or a forged record.
    func checkRollback(_ keyring: TPMKeyring) throws(KeychainError) {
        let store = keyring.store
        guard let (binding, recorded) = try rollbackState(store) else {
            if case .embedded = configuration.tpm { try bindRollbackCounter(keyring) }
            return
        }
        guard let recorded else {
            if case .embedded = configuration.tpm { try bindRollbackCounter(keyring) }
            return
        }
        if let known = rollbackKnown {
            if recorded.value == known { return }
            if recorded.value < known { throw rolledBack(recorded.value, counter: known, binding) }
        }
        try withCounterLock(keyring) { () throws(KeychainError) in
            // Read again under the lock: another process's write may have ended meanwhile.
            let recorded = try rollbackState(store)?.record ?? recorded
            try settle(keyring, binding, recorded)
        }
    }

    /// Reads the counter and brings the store and it together, or refuses (`checkRollback`); inside
    /// a write, `tx` is its transaction.
    private func settle(_ keyring: TPMKeyring, _ binding: RollbackBinding, _ recorded: RollbackRecord,
                        in tx: Transaction? = nil) throws(KeychainError) {
        let index = try counterIndex(keyring, binding)
        let context = keyring.context
        let counter = try readCounter(keyring, index, binding)
        let clock: TPMContext.ClockCounts
        if let known = rollbackClock { clock = known } else {
            clock = try counterCall(keyring, "read the TPM's clock") { () throws(TPMError) in try context.clockCounts() }
        }
        rollbackClock = clock
        switch RollbackVerdict.of(recorded, counter: counter, clock: clock, window: binding.window) {
        case .current:
            rollbackKnown = counter
        case .oneAhead:
            try counterCall(keyring, "catch the rollback counter up") { () throws(TPMError) in try context.incrementCounter(index) }
            rollbackKnown = recorded.value
        case .restartWindow:
            let accepted = RollbackRecord(value: counter, clock: clock).encoded()
            if let tx {
                do { try tx.setMeta(StoreMeta.rollbackValue, accepted) } catch { throw KeychainError(store: error) }
            } else {
                try writeUncounted(keyring.store) { tx in try tx.setMeta(StoreMeta.rollbackValue, accepted) }
            }
            rollbackKnown = counter
        case .rolledBack:
            throw rolledBack(recorded.value, counter: counter, binding)
        case .forged(let ahead):
            throw KeychainError(.dataCorrupted, "The store in \(configuration.storeDirectory) records its rollback counter "
                                + "\(ahead) ahead of the TPM's (\(recorded.value) against \(counter)): no write makes that, the "
                                + "database was edited. Put the store's own files back; or, to keep this copy, keychainctl accept-store "
                                + "--owner-auth-file FILE")
        }
    }

    /// The counter's value; an index that refuses the store's authValue is `DATA_CORRUPTED`: the store
    /// was bound again since this copy was made (`accept-store`), or someone with the owner
    /// authorization replaced its counter.
    private func readCounter(_ keyring: TPMKeyring, _ index: TPMHandle, _ binding: RollbackBinding) throws(KeychainError) -> UInt64 {
        do throws(TPMError) { return try keyring.context.readCounter(index) } catch {
            guard error.code.is(.authFail) || error.code.is(.badAuth) else { throw keyring.diagnose(error, doing: "read the store's rollback counter") }
            throw KeychainError(.dataCorrupted, "Rollback: the TPM's counter at NV index \(upperHex(UInt64(binding.index))) refuses this store's authorization: "
                                + "the store in \(configuration.storeDirectory) is a copy older than its last binding (accept-store), or its "
                                + "counter was replaced. Put the current files back; or, to keep this copy, keychainctl accept-store --owner-auth-file FILE",
                                underlying: .tpm(error))
        }
    }

    private func rolledBack(_ stored: UInt64, counter: UInt64, _ binding: RollbackBinding) -> KeychainError {
        KeychainError(.dataCorrupted, "Rollback: the store in \(configuration.storeDirectory) is an older copy (its counter "
                      + "\(stored) is behind the TPM's \(counter), by \(counter - stored) writes), put back in place of the current one: "
                      + "items removed since would come back. Put the current files back; or, to keep this copy as the store, "
                      + "the administrator runs keychainctl accept-store --owner-auth-file FILE")
    }

    /// On a TPM with a resource manager (no `TPMTurn`), a flock in the store's directory held from a
    /// write's check to its NV_Increment: another process's check in between would take the write's
    /// commit for an interrupted one and increment too. Without one the TPM's turn already is.
    private func withCounterLock<T>(_ keyring: TPMKeyring, _ body: () throws(KeychainError) -> T) throws(KeychainError) -> T {
        guard keyring.context.device.hasResourceManager else { return try body() }
        let lock = try TPMTurn.take(path: configuration.storeDirectory + "/keychain.counter.lock")
        return try withExtendedLifetime(lock) { () throws(KeychainError) -> T in try body() }
    }

    /// A store write bound to the counter: the transaction records the value the counter will have
    /// (and the TPM's clock counts), commits, then NV_Increment. Killed in between, the store is one
    /// ahead and the next operation catches up. Unbound stores are written as before.
    func countedWrite<T>(_ store: Store, _ body: (Transaction) throws -> T) throws(KeychainError) -> T {
        guard !rollbackCheckSuspended, try rollbackState(store)?.record != nil else { return try writeUncounted(store, body) }
        if let keyring = activeKeyring, keyring.store === store { return try countedWrite(keyring, body) }
        return try withKeyring { keyring throws(KeychainError) in try countedWrite(keyring, body) }
    }

    private func countedWrite<T>(_ keyring: TPMKeyring, _ body: (Transaction) throws -> T) throws(KeychainError) -> T {
        guard let (binding, _) = try rollbackState(keyring.store) else { return try writeUncounted(keyring.store, body) }
        return try withCounterLock(keyring) { () throws(KeychainError) -> T in
            var next: UInt64 = 0
            let result = try writeUncounted(keyring.store) { tx -> T in
                let recorded = try tx.meta(StoreMeta.rollbackValue).flatMap(RollbackRecord.init(decoding:))
                if let recorded, recorded.value != rollbackKnown { try settle(keyring, binding, recorded, in: tx) }
                guard let known = rollbackKnown, let clock = rollbackClock else {
                    throw KeychainError(.internal, "The rollback counter was not read before a write")
                }
                let result = try body(tx)
                next = known + 1
                try tx.setMeta(StoreMeta.rollbackValue, RollbackRecord(value: next, clock: clock).encoded())
                return result
            }
            // Committed: the write stands whatever happens to the increment (the next operation catches up).
            let context = keyring.context
            if let index = try? counterIndex(keyring, binding), (try? context.incrementCounter(index)) != nil {
                rollbackKnown = next
            } else {
                rollbackKnown = nil
            }
            return result
        }
    }

    /// Binds the store to a new counter (`init` with the owner authorization; the embedded TPM on its
    /// first use), or finishes an interrupted binding. Crash-atomic: the binding is recorded before
    /// NV_DefineSpace, so a killed process's index is found again (never a second one defined); the
    /// record that makes writes count comes last, after the first NV_Increment.
    func bindRollbackCounter(_ keyring: TPMKeyring, ownerAuthorization: SecureBytes? = nil) throws(KeychainError) {
        let store = keyring.store
        let context = keyring.context
        if let ownerAuthorization {
            do throws(TPMError) { try context.setAuth(TPMContext.owner, ownerAuthorization) } catch {
                throw KeychainError.invalidArgument("The owner authorization is longer than the TPM accepts")
            }
        }
        try undefineRetired(keyring)
        if try rollbackState(store)?.record != nil { return }
        var binding = try rollbackState(store)?.binding
        var probe = binding?.index ?? RollbackCounterLayout.start(identity: store.identity)
        for _ in 0..<RollbackCounterLayout.indexCount {
            if binding == nil {
                // A free handle: NV_ReadPublic fails on it.
                guard (try? context.resource(forPersistent: probe)) == nil else {
                    probe = RollbackCounterLayout.firstIndex + (probe - RollbackCounterLayout.firstIndex + 1) % RollbackCounterLayout.indexCount
                    continue
                }
                let window = try counterCall(keyring, "read TPM_PT_ORDERLY_COUNT") { () throws(TPMError) in
                    try context.property(TPMContext.propertyOrderlyCount)
                }
                var generator = SystemRandomNumberGenerator()
                binding = RollbackBinding(index: probe, window: window + 1,
                                          authorization: (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
                try writeUncounted(store) { tx in try tx.setMeta(StoreMeta.rollbackCounter, binding!.encoded()) }
            }
            let pub = RollbackCounterLayout.public(binding!.index)
            let handle: TPMHandle
            if let existing = try? context.resource(forPersistent: pub.index) {
                guard let name = try? context.name(of: existing), name == pub.name(written: false) || name == pub.name(written: true) else {
                    // Someone else's index took the handle after we chose it: choose again.
                    probe = RollbackCounterLayout.firstIndex + (pub.index - RollbackCounterLayout.firstIndex + 1) % RollbackCounterLayout.indexCount
                    binding = nil
                    continue
                }
                handle = existing
            } else {
                do throws(TPMError) {
                    handle = try context.defineNV(pub, auth: SecureBytes(copying: binding!.authorization))
                } catch {
                    if error.code.is(.badAuth) || error.code.is(.authFail) || error.code.is(.lockout) {
                        throw KeychainError(.authenticationFailed,
                                            "The TPM refused the owner authorization (NV_DefineSpace of the rollback counter): give "
                                            + "the one set at device provisioning (keychainctl init --owner-auth-file FILE)", underlying: .tpm(error))
                    }
                    throw keyring.diagnose(error, doing: "define the store's rollback counter")
                }
            }
            let authorization = SecureBytes(copying: binding!.authorization)
            let (value, clock) = try counterCall(keyring, "start the store's rollback counter") { () throws(TPMError) in
                try context.setAuth(handle, authorization)
                // A new counter starts at the highest value any counter of this TPM had: never lower.
                try context.incrementCounter(handle)
                return (try context.readCounter(handle), try context.clockCounts())
            }
            try writeUncounted(store) { tx in try tx.setMeta(StoreMeta.rollbackValue, RollbackRecord(value: value, clock: clock).encoded()) }
            (rollbackKnown, rollbackClock, rollbackCounterTR) = (value, clock, nil)
            return
        }
        throw KeychainError(.hardwareUnavailable, "The TPM has no free handle for a rollback counter among its 256 (0x01004C00-0x01004CFF)")
    }

    /// Undefines the counter `acceptStore` replaced, when the TPM still holds it (owner authorization).
    private func undefineRetired(_ keyring: TPMKeyring) throws(KeychainError) {
        let store = keyring.store
        guard let retired = try read({ try store.meta(StoreMeta.rollbackRetired) }).flatMap(RollbackBinding.init(decoding:)) else { return }
        let context = keyring.context
        if let handle = try? context.resource(forPersistent: retired.index),
           let name = try? context.name(of: handle), name == RollbackCounterLayout.public(retired.index).name(written: true) {
            do throws(TPMError) { try context.undefineNV(handle) } catch {
                if error.code.is(.badAuth) || error.code.is(.authFail) || error.code.is(.lockout) {
                    throw KeychainError(.authenticationFailed, "The TPM refused the owner authorization (NV_UndefineSpace of the "
                                        + "replaced rollback counter): give the one set at device provisioning (--owner-auth-file FILE)",
                                        underlying: .tpm(error))
                }
                throw keyring.diagnose(error, doing: "undefine the replaced rollback counter")
            }
        }
        try writeUncounted(store) { tx in
            if try tx.meta(StoreMeta.rollbackCounter).flatMap(RollbackBinding.init(decoding:)) == retired {
                _ = try tx.deleteMeta(StoreMeta.rollbackCounter)
                _ = try tx.deleteMeta(StoreMeta.rollbackValue)
            }
            _ = try tx.deleteMeta(StoreMeta.rollbackRetired)
        }
        (rollbackKnown, rollbackClock, rollbackCounterTR) = (nil, nil, nil)
    }

    /// The administrator's recovery: keeps the store as it is (a copy put back, or one that has no
    /// counter) and binds it to a new counter, undefining the old one. Needs the owner authorization,
    /// which whoever put a copy back does not have. Crash-atomic: the old binding is kept as retired
    /// before anything changes in the TPM; `init` again (or this again) finishes what a kill left.
    func acceptStore(ownerAuthorization: SecureBytes?) throws(KeychainError) -> RollbackCounterStatus {
        rollbackCheckSuspended = true
        defer { rollbackCheckSuspended = false }
        return try withKeyring { keyring throws(KeychainError) in
            let store = keyring.store
            if let ownerAuthorization {
                do throws(TPMError) { try keyring.context.setAuth(TPMContext.owner, ownerAuthorization) } catch {
                    throw KeychainError.invalidArgument("The owner authorization is longer than the TPM accepts")
                }
            }
            // The old binding is kept as retired first; its undefine (which proves the owner authorization)
            // comes before the store lets it go (`undefineRetired`).
            if let (binding, _) = try rollbackState(store), try read({ try store.meta(StoreMeta.rollbackRetired) }) == nil {
                try writeUncounted(store) { tx in try tx.setMeta(StoreMeta.rollbackRetired, binding.encoded()) }
            }
            (rollbackKnown, rollbackClock, rollbackCounterTR) = (nil, nil, nil)
            try bindRollbackCounter(keyring, ownerAuthorization: ownerAuthorization)
            return try rollbackCounterStatus(keyring)
        }
    }

    /// The counter's state for `status`: never throws for a rollback, it says so.
    func rollbackCounterStatus(_ keyring: TPMKeyring) throws(KeychainError) -> RollbackCounterStatus {
        guard let (binding, recorded) = try rollbackState(keyring.store) else { return .init(state: .unbound) }
        guard let recorded else { return .init(state: .interrupted, index: binding.index, window: binding.window) }
        let context = keyring.context
        var status = RollbackCounterStatus(state: .current, index: binding.index, storeValue: recorded.value, window: binding.window)
        let counter: UInt64
        do throws(KeychainError) {
            let index = try counterIndex(keyring, binding)
            counter = try readCounter(keyring, index, binding)
        } catch where error.code == .dataCorrupted {
            status.state = error.message.hasPrefix("Rollback") ? .replaced : .missing
            return status
        }
        let clock = try counterCall(keyring, "read the TPM's clock") { () throws(TPMError) in try context.clockCounts() }
        status.tpmValue = counter
        status.state = switch RollbackVerdict.of(recorded, counter: counter, clock: clock, window: binding.window) {
        case .current: .current
        case .oneAhead: .oneAhead
        case .restartWindow: .restartWindow
        case .rolledBack: .rolledBack
        case .forged: .forged
        }
        return status
    }
}

extension Engine {
    /// `init`'s binding: with the owner authorization the TPM takes, the store gets its counter; a
    /// TPM whose owner authorization is set and not given leaves it unbound, and `status` says so.
    func bindRollbackCounter(ownerAuthorization: SecureBytes?) throws(KeychainError) {
        do throws(KeychainError) {
            try withKeyring { keyring throws(KeychainError) in try bindRollbackCounter(keyring, ownerAuthorization: ownerAuthorization) }
        } catch where error.code == .authenticationFailed {
            // Unbound, as before this version: status warns with the command that binds it.
        }
    }
}

extension RollbackCounterStatus {
    init(state: State) { self.init(state: state, index: nil, storeValue: nil, tpmValue: nil, window: nil) }

    /// What the state costs, in words, for `status`'s warnings.
    var warnings: [String] {
        switch state {
        case .current, .oneAhead, .restartWindow: []
        case .unbound:
            ["The store has no rollback counter: an older copy of it put back (items removed since, a superseded token) "
             + "goes unnoticed. Bind it once with the TPM's owner authorization: keychainctl init --owner-auth-file FILE"]
        case .interrupted:
            ["Binding the store to its rollback counter was interrupted: run keychainctl init --owner-auth-file FILE again"]
        case .rolledBack:
            ["Rollback: the store is behind its TPM counter (an older copy was put back) and every operation refuses it. Put "
             + "the current files back; or, to keep this copy, keychainctl accept-store --owner-auth-file FILE"]
        case .forged:
            ["The store's record of its rollback counter is ahead of the TPM's: it was edited, and every operation refuses it. "
             + "Put the store's own files back; or, to keep this copy, keychainctl accept-store --owner-auth-file FILE"]
        case .replaced:
            ["Rollback: the TPM's counter at the store's handle refuses its authorization (a copy older than its last "
             + "accept-store was put back, or the counter was replaced): every operation refuses it. Put the current files back; "
             + "or, to keep this copy, keychainctl accept-store --owner-auth-file FILE"]
        case .missing:
            ["The TPM no longer holds the store's rollback counter (undefined, or the TPM cleared): bind it again with "
             + "keychainctl accept-store --owner-auth-file FILE"]
        }
    }
}
