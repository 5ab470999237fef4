import Foundation
import KeychainStore
import SecureMemory
import TPM2

/// The store's own monotonic counter in the TPM (issue 22 item 10): an older copy of the store's
/// files put back (a rollback) records a lower value than the TPM's, and is refused.
///
/// One `TPM_NT_COUNTER` index per store, `ORDERLY` (kept in the TPM's RAM, saved to NV at an orderly
/// shutdown and at least every `TPM_PT_ORDERLY_COUNT` increments, so an increment costs no NV write)
/// and `noDA`, at the first free handle of `handles` from one the store's identity picks. Its
/// authPolicy is a digest of the store's identity that no policy session can reach (the index has no
/// policy roles): it only makes the index's name this store's, so that someone else's index at the
/// handle is never taken for ours. Incrementing and reading it need its (empty) authValue: whoever
/// has TPM access can move it ahead (a false alarm, like clearing the TPM), nobody can move it back
/// (an undefined and redefined counter starts at the highest value any counter of the TPM had).
enum StoreCounterLayout {
    static let handles: ClosedRange<UInt32> = 0x0100_4B60...0x0100_4B6F
    static let attributes = NVAttributes.typeCounter | NVAttributes.authWrite | NVAttributes.authRead
        | NVAttributes.noDA | NVAttributes.orderly

    static func publicArea(_ handle: UInt32, identity: [UInt8]) -> NVPublic {
        NVPublic(index: handle, attributes: attributes,
                 authPolicy: sha256(Array("keychain-linux/store-counter/v1".utf8), identity), size: 8)
    }

    /// The handles in the order this store tries them: from the one its identity picks, round.
    static func probeOrder(identity: [UInt8]) -> [UInt32] {
        let count = UInt32(handles.count)
        let start = UInt32(sha256(identity)[0]) % count
        return (0..<count).map { handles.lowerBound + (start + $0) % count }
    }
}

/// What a store records of its counter (meta `StoreMeta.storeCounter`): the handle, the value the
/// counter has once the store's last write is complete, and the TPM's reset and restart counts when
/// the store last saw the TPM (a restart it has not seen explains a counter ahead, within the window).
struct CounterBinding: Equatable {
    var handle: UInt32
    var value: UInt64
    var resetCount: UInt32
    var restartCount: UInt32

    func encoded() -> [UInt8] { handle.bigEndianBytes + value.bigEndianBytes + resetCount.bigEndianBytes + restartCount.bigEndianBytes }

    init(handle: UInt32, value: UInt64, resetCount: UInt32, restartCount: UInt32) {
        self.handle = handle; self.value = value; self.resetCount = resetCount; self.restartCount = restartCount
    }

    init?(decoding bytes: [UInt8]?) {
        guard let bytes, bytes.count == 20 else { return nil }
        func number<T: FixedWidthInteger>(_ range: Range<Int>) -> T { bytes[range].reduce(T(0)) { $0 << 8 | T($1) } }
        handle = number(0..<4); value = number(4..<12); resetCount = number(12..<16); restartCount = number(16..<20)
    }
}

/// The engine's side of `Store.counter`: runs on the engine's thread, with the TPM connection of the
/// operation in progress (`context`; every store write is made inside one, `Engine.writeStore`).
///
/// Each committing write records `known + 1` in its transaction, commits, then increments the
/// counter (`record`, `advance`). So the store is at the counter's value, or one ahead of it when a
/// process was killed between its COMMIT and its NV_Increment (the next write or check catches the
/// counter up). Behind it is a rollback, except after a TPM restart the store has not seen (see
/// `Engine.checkStoreCounter`).
final class StoreCounter: WriteCounter {
    /// The operation's TPM connection; nil between operations.
    var context: TPMContext?
    /// The store's identity and its binding as this process last read or wrote it.
    var identity: [UInt8] = []
    var handle: UInt32?
    /// The counter's value as this process last read or advanced it: the store records at least this.
    var known: UInt64?
    /// This process recorded `known + 1` and has not incremented yet.
    var mustAdvance = false
    /// Set once this process checked the store against the counter (or found it cannot be bound).
    var checked = false
    /// Why the store is not bound, when it cannot be (no owner authorization, no free handle): `status` says it.
    var unboundBecause: String?
    /// The rollback found: every later call is refused with it until `accept-rollback`.
    var refusal: KeychainError?
    /// `status` is reporting a rollback: its own TPM commands are not refused.
    var reporting = false
    /// The ESAPI resource of the index in `context` (ESAPI resources belong to one context).
    private var resource: (context: ObjectIdentifier, handle: TPMHandle)?
    private var serialized: [UInt8]?
    /// The store's directory, for messages.
    var directory = ""

    func index(_ context: TPMContext) throws(TPMError) -> TPMHandle {
        if let resource, resource.context == ObjectIdentifier(context) { return resource.handle }
        let made: TPMHandle
        if let serialized { made = try context.deserialize(serialized) } else {
            guard let handle else { throw TPMError(command: "store counter (unbound)", code: .handle) }
            made = try context.resource(forPersistent: handle)
            serialized = try context.serialize(made)
        }
        resource = (ObjectIdentifier(context), made)
        return made
    }

    func forgetIndex() {
        resource = nil
        serialized = nil
    }

    func read(_ context: TPMContext) throws(TPMError) -> UInt64 {
        let bytes = try context.readNV(try index(context), size: 8)
        return bytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
    }

    func increment(_ context: TPMContext) throws(TPMError) {
        try context.incrementNV(try index(context))
    }

    // MARK: WriteCounter

    func record(_ transaction: Transaction) throws {
        guard var binding = CounterBinding(decoding: try transaction.meta(StoreMeta.storeCounter)) else { return }
        guard binding.handle == handle, var known else { return }  // not checked yet in this process: nothing to compare
        if binding.value != known && !(mustAdvance && binding.value == known + 1) {
            // Not what this process left: another process wrote (or a copy was put back under us).
            if binding.value < known { throw rolledBack(recorded: binding.value, counter: known) }
            guard let context else { return }  // cannot tell without the TPM: this write is not counted
            do {
                var counter = try read(context)
                if binding.value == counter + 1 {  // a writer killed after its COMMIT: catch the counter up
                    try increment(context)
                    counter += 1
                }
                if binding.value < counter { throw rolledBack(recorded: binding.value, counter: counter) }
                if binding.value > counter { throw ahead(recorded: binding.value, counter: counter) }
                known = counter
                self.known = counter
                mustAdvance = false
            } catch let error as TPMError {
                throw KeychainError(.hardwareUnavailable, "Cannot read the store's TPM counter (\(error.command))", underlying: .tpm(error))
            }
        }
        binding.value = known + 1
        try transaction.setMeta(StoreMeta.storeCounter, binding.encoded())
        mustAdvance = true
    }

    func advance() {
        guard mustAdvance, let context, let known else { return }
        do {
            try increment(context)
            self.known = known + 1
            mustAdvance = false
        } catch {
            // Left one ahead: the next write or check increments.
        }
    }

    // MARK: Messages

    func rolledBack(recorded: UInt64, counter: UInt64) -> KeychainError {
        let handle = handle.map { "0x0" + String($0, radix: 16) } ?? "?"
        return KeychainError(
            .dataCorrupted,
            "The store in \(directory) was rolled back: it records its TPM counter (NV index \(handle)) at \(recorded), but the "
            + "counter is at \(counter), so an older copy of its files was put back and items removed or replaced since may be back. "
            + "Nothing is read or written. Put the newest copy back; or, to keep this copy and lose what was written after it, "
            + "run 'keychainctl --direct --store \(directory) accept-rollback' as the store's owner (docs/security.md, rollback)")
    }

    func ahead(recorded: UInt64, counter: UInt64) -> KeychainError {
        let handle = handle.map { "0x0" + String($0, radix: 16) } ?? "?"
        return KeychainError(
            .dataCorrupted,
            "The store in \(directory) records its TPM counter (NV index \(handle)) at \(recorded), ahead of the counter (at "
            + "\(counter)): it was copied from another TPM or edited. Nothing is read or written. To keep it, run "
            + "'keychainctl --direct --store \(directory) accept-rollback' as the store's owner")
    }
}
