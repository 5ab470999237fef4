import Foundation
import KeychainStore
import SecureMemory
import TPM2

/// The store checked against its TPM counter (`StoreCounter`): once per process, at its first
/// operation, and at every call after that against what this process last saw.
extension Engine {
    /// At the first TPM connection of this process (`withConnection`): the store's recorded value
    /// against the counter. Equal, or one ahead (a write killed after its COMMIT: the counter is
    /// caught up), is this store's latest state. Behind is a rollback, except after a TPM restart
    /// the store has not seen (other reset or restart counts), by at most TPM_PT_ORDERLY_COUNT + 1:
    /// an ORDERLY counter comes back that far ahead after a restart without an orderly shutdown (the
    /// window, docs/security.md). A store not yet bound gets its counter here, when the owner
    /// authorization allows it.
    func checkStoreCounter(_ keyring: TPMKeyring) throws(KeychainError) {
        let counter = storeCounter
        guard !counter.reporting else { return }
        if let refusal = counter.refusal { throw refusal }
        guard !counter.checked else { return }
        let store = keyring.store
        counter.identity = store.identity
        counter.directory = configuration.storeDirectory
        // The record and the counter read together: another process's write (without a TPM turn, on a
        // resource manager) must not come between its COMMIT and its increment while they are read.
        let verdict: (() throws(KeychainError) -> Void)?
        do {
            verdict = try store.withCounterConsistency { () throws -> (() throws(KeychainError) -> Void)? in
                try compareWithCounter(keyring)
            }
        } catch let error as KeychainError {
            throw error
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
        try verdict?()
    }

    /// The comparison; returns what must be written after it (outside the shared lock), if anything.
    private func compareWithCounter(_ keyring: TPMKeyring) throws(KeychainError) -> (() throws(KeychainError) -> Void)? {
        let counter = storeCounter
        let store = keyring.store
        let context = keyring.context
        guard let binding = CounterBinding(decoding: try read({ try store.meta(StoreMeta.storeCounter) })) else {
            return { () throws(KeychainError) in try self.bindStoreCounter(keyring) }
        }
        counter.handle = binding.handle
        counter.forgetIndex()
        var value: UInt64
        let counts: (resetCount: UInt32, restartCount: UInt32)
        do throws(TPMError) {
            try checkCounterName(context, binding.handle, identity: store.identity)
            value = try counter.read(context)
            counts = try context.restartCounts()
            if binding.value == value + 1 {  // killed between its COMMIT and its NV_Increment
                try counter.increment(context)
                value += 1
            }
        } catch {
            throw refuse(counterMissing(binding.handle, error))
        }
        if binding.value > value { throw refuse(counter.ahead(recorded: binding.value, counter: value)) }
        let unseen = (counts.resetCount, counts.restartCount) != (binding.resetCount, binding.restartCount)
        if binding.value < value {
            let window: UInt64
            do { window = UInt64(try context.property(TPMContext.propertyOrderlyCount)) + 1 } catch {
                throw keyring.diagnose(error, doing: "read TPM_PT_ORDERLY_COUNT")
            }
            guard unseen, value - binding.value <= window else {
                throw refuse(counter.rolledBack(recorded: binding.value, counter: value))
            }
        }
        counter.known = value
        counter.mustAdvance = false
        counter.checked = true
        guard unseen || binding.value != value else { return nil }
        // What the store has now seen: the TPM's restart, the counter where it came back.
        return { () throws(KeychainError) in
            try self.writeStore(store) { tx in
                try tx.setMeta(StoreMeta.storeCounter, CounterBinding(handle: binding.handle, value: value, resetCount: counts.resetCount,
                                                                       restartCount: counts.restartCount).encoded())
            }
        }
    }

    private func refuse(_ error: KeychainError) -> KeychainError {
        storeCounter.refusal = error
        return error
    }

    /// The index at `handle` is this store's counter (once incremented, unless `unwritten` allows a new one).
    private func checkCounterName(_ context: TPMContext, _ handle: UInt32, identity: [UInt8], unwritten: Bool = false) throws(TPMError) {
        let index = try storeCounter.index(context)
        let ours = StoreCounterLayout.publicArea(handle, identity: identity)
        let name = try context.name(of: index)
        guard name == ours.name(written: true) || (unwritten && name == ours.name(written: false)) else {
            throw TPMError(command: "NV_ReadPublic(0x0\(String(handle, radix: 16))): not this store's counter", code: .handle)
        }
    }

    private func counterMissing(_ handle: UInt32, _ error: TPMError) -> KeychainError {
        let directory = configuration.storeDirectory
        return KeychainError(
            .dataCorrupted,
            "The TPM counter this store is bound to (NV index 0x0\(String(handle, radix: 16))) is missing or not this store's "
            + "(\(error.command)): the TPM was cleared or replaced, or the store was copied from another device, so whether it "
            + "was rolled back cannot be told. Nothing is read or written. To keep the store as it is, run "
            + "'keychainctl --direct --store \(directory) accept-rollback' as the store's owner", underlying: .tpm(error))
    }

    /// Defines the store's counter and records it: the handle first (`storeCounterPending`), then the
    /// index, then the binding, so a kill anywhere leaves either no binding (the next run finds its
    /// pending index and goes on) or a complete one. Without the owner authorization (keychaind after
    /// `init` took ownership, unless given it) or a free handle the store stays unbound: `status` warns.
    private func bindStoreCounter(_ keyring: TPMKeyring) throws(KeychainError) {
        let counter = storeCounter
        let store = keyring.store
        let context = keyring.context
        let pending = try read { try store.meta(StoreMeta.storeCounterPending) }
            .flatMap { $0.count == 4 ? $0.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } : nil }
        var chosen: UInt32?
        var exists = false
        for handle in StoreCounterLayout.probeOrder(identity: store.identity) {
            let ours = StoreCounterLayout.publicArea(handle, identity: store.identity)
            let existing: TPMHandle
            do { existing = try context.resource(forPersistent: handle) } catch {
                guard error.code.isHandleOrValueError else { throw keyring.diagnose(error, doing: "look for the store's counter") }
                if chosen == nil { chosen = handle }
                break  // the first free handle: this store's counter is at none after it
            }
            guard let name = try? context.name(of: existing), name == ours.name(written: true) || name == ours.name(written: false) else {
                continue  // another store's, or someone else's
            }
            guard pending == handle else {
                // The TPM holds this store's counter, and the store has no record of it: its record went.
                counter.handle = handle
                throw refuse(KeychainError(
                    .dataCorrupted,
                    "The store in \(configuration.storeDirectory) has no record of its TPM counter, but the TPM holds it (NV index "
                    + "0x0\(String(handle, radix: 16))): a copy of the store from before it was bound was put back, or its record was "
                    + "removed. Nothing is read or written. To keep this copy and lose what was written after it, run "
                    + "'keychainctl --direct --store \(configuration.storeDirectory) accept-rollback' as the store's owner"))
            }
            chosen = handle
            exists = true
            break
        }
        guard let handle = chosen else {
            counter.unboundBecause = "no free NV handle for its counter (0x01004b60–0x01004b6f)"
            counter.checked = true
            return
        }
        try bindCounter(at: handle, exists: exists, keyring)
    }

    /// Defines (unless `exists`) and binds the counter at `handle`.
    func bindCounter(at handle: UInt32, exists: Bool, _ keyring: TPMKeyring) throws(KeychainError) {
        let counter = storeCounter
        let store = keyring.store
        let context = keyring.context
        if !exists {
            try writeStore(store) { tx in try tx.setMeta(StoreMeta.storeCounterPending, handle.bigEndianBytes) }
            do {
                _ = try context.defineNV(StoreCounterLayout.publicArea(handle, identity: store.identity), auth: nil)
            } catch {
                if error.isConnectionFailure { throw keyring.diagnose(error, doing: "define the store's counter") }
                counter.unboundBecause = error.code.is(.badAuth) || error.code.is(.authFail)
                    ? "this process does not hold the TPM's owner authorization that defining its counter needs: run "
                        + "'keychainctl --direct --store \(configuration.storeDirectory) --owner-auth-file FILE status' once (the file "
                        + "init wrote), or start keychaind with --owner-auth-file FILE"
                    : "the TPM refused to define its counter (\(error))"
                counter.checked = true
                return
            }
        }
        counter.handle = handle
        counter.identity = store.identity
        counter.directory = configuration.storeDirectory
        counter.forgetIndex()
        let value: UInt64
        let counts: (resetCount: UInt32, restartCount: UInt32)
        do throws(TPMError) {
            try checkCounterName(context, handle, identity: store.identity, unwritten: true)
            try counter.increment(context)  // a counter is readable once incremented
            counter.forgetIndex()  // its name changed (written)
            value = try counter.read(context)
            counts = try context.restartCounts()
        } catch {
            throw keyring.diagnose(error, doing: "set up the store's counter")
        }
        counter.known = value
        counter.mustAdvance = false
        counter.unboundBecause = nil
        counter.refusal = nil
        counter.checked = true
        try writeStore(store) { tx in
            try tx.setMeta(StoreMeta.storeCounter, CounterBinding(handle: handle, value: value, resetCount: counts.resetCount,
                                                                   restartCount: counts.restartCount).encoded())
            _ = try tx.deleteMeta(StoreMeta.storeCounterPending)
        }
    }

    /// Every call after the first: the store must record at least what this process last saw of the
    /// counter (a copy put back under a running process, keychaind's included, is refused at once).
    /// One meta read, no TPM command.
    func checkStoreCounterFloor(_ store: Store) throws(KeychainError) {
        guard !storeCounter.reporting else { return }
        if let refusal = storeCounter.refusal { throw refusal }
        guard let known = storeCounter.known, let handle = storeCounter.handle else { return }
        let binding = CounterBinding(decoding: try read({ try store.meta(StoreMeta.storeCounter) }))
        guard let binding, binding.handle == handle else {
            throw refuse(storeCounter.rolledBack(recorded: 0, counter: known))
        }
        if binding.value < known { throw refuse(storeCounter.rolledBack(recorded: binding.value, counter: known)) }
    }

    /// A call that needs no TPM command, first in this process: the check is made with one.
    func checkStoreCounterOnce() throws(KeychainError) {
        guard !storeCounter.checked else { return }
        try withKeyring { _ throws(KeychainError) in }
    }

    /// The administrator's recovery from a refused rollback (or a lost counter): the store is bound
    /// to the counter as it is now, accepting that what was written after the copy is lost.
    func acceptRollback() throws(KeychainError) -> String {
        storeCounter.refusal = nil
        storeCounter.checked = true  // this operation does not check; it rebinds
        defer { if storeCounter.refusal != nil { storeCounter.checked = false } }
        return try withKeyring { keyring throws(KeychainError) in
            let store = keyring.store
            storeCounter.known = nil
            storeCounter.mustAdvance = false
            let binding = CounterBinding(decoding: try read({ try store.meta(StoreMeta.storeCounter) }))
            var found = binding?.handle
            if found == nil {
                // The store lost its record: this store's index, wherever it is.
                for handle in StoreCounterLayout.probeOrder(identity: store.identity) {
                    guard let existing = try? keyring.context.resource(forPersistent: handle),
                          let name = try? keyring.context.name(of: existing),
                          name == StoreCounterLayout.publicArea(handle, identity: store.identity).name(written: true) else { continue }
                    found = handle
                    break
                }
            }
            if let handle = found {
                storeCounter.handle = handle
                storeCounter.forgetIndex()
                var present = true
                do throws(TPMError) { try checkCounterName(keyring.context, handle, identity: store.identity) } catch { present = false }
                if present {
                    try bindCounter(at: handle, exists: true, keyring)
                    return "the store is bound to its TPM counter again (NV index 0x0\(String(handle, radix: 16)) at \(storeCounter.known ?? 0))"
                }
            }
            // The counter is gone (a cleared TPM): a new one.
            try writeStore(store) { tx in _ = try tx.deleteMeta(StoreMeta.storeCounter) }
            storeCounter.handle = nil
            storeCounter.checked = false
            try bindStoreCounter(keyring)
            if let why = storeCounter.unboundBecause { return "the store is not bound to a TPM counter: \(why)" }
            return "the store is bound to a new TPM counter (NV index 0x0\(String(storeCounter.handle ?? 0, radix: 16)))"
        }
    }

    /// What `status` says of the counter.
    func storeCounterStatus() -> String {
        if storeCounter.refusal != nil { return "ROLLED BACK" }
        if let handle = storeCounter.handle, let known = storeCounter.known {
            return "bound (NV index 0x0\(String(handle, radix: 16)), at \(known))"
        }
        return "not bound" + (storeCounter.unboundBecause.map { ": \($0)" } ?? "")
    }
}
