import Keychain

extension SecretServiceProvider {
    /// A read answered on the bus thread, or the storage whose engine must answer it.
    enum Opening {
        case opened(SealedItem)
        case cold(Keychain)
    }

    /// The item when the bus thread can answer (the in-memory collection; a warm read:
    /// `Keychain.warmRead`); `.cold` when the read needs the engine (a TPM command, keychaind, a prompt).
    func openAtOnce(_ collection: Collection, _ id: String) throws(DBusError) -> Opening {
        guard let entry = collection.items[id] else { throw .noSuchObject("No item \(id) in \(collection.name)") }
        guard let storage = collection.storage else {
            return .opened(SealedItem(label: entry.label ?? "", contentType: entry.contentType ?? "", attributes: entry.attributes ?? [:],
                                      secret: entry.memorySecret ?? SecureBytes(count: 0)))
        }
        switch storage.warmRead(id) {
        case .value(let bytes)?: return .opened(try settle(collection, id, .success(bytes)))
        case .absent?: return .opened(try settle(collection, id, .success(nil)))
        case nil: return .cold(storage)
        }
    }

    /// What a read found, taken in on the bus thread: the item (its label, type and attributes are
    /// remembered), forgotten when it is gone, its collection locked when the read needs an unlock.
    func settle(_ collection: Collection, _ id: String, _ read: Result<SecureBytes?, DBusError>) throws(DBusError) -> SealedItem {
        let stored: SecureBytes?
        switch read {
        case .success(let value):
            stored = value
        case .failure(let error):
            if error.name == DBusError.isLocked("").name {
                collection.locked = true
                changed(collection, properties: ["Locked"])
            }
            throw error
        }
        guard let stored else {
            collection.items[id] = nil
            throw .noSuchObject("Item \(id) of \(collection.name) is gone")
        }
        guard let item = SealedItem(decoding: stored) else { throw .failed("Item \(id) of \(collection.name) does not decode: the store is damaged") }
        collection.items[id]?.remember(item)
        return item
    }

    /// The whole item, waiting on the bus thread for a cold read: for the import (a client, not serving).
    func open(_ collection: Collection, _ id: String) throws(DBusError) -> SealedItem {
        switch try openAtOnce(collection, id) {
        case .opened(let item):
            return item
        case .cold(let storage):
            let read: Result<SecureBytes?, DBusError>
            do throws(DBusError) {
                read = .success(try Self.blocking { try await storage.getSecureBytes(id) })
            } catch {
                read = .failure(error)
            }
            return try settle(collection, id, read)
        }
    }

    /// The answer `next` makes of the whole item: at once when the bus thread can read it, else after
    /// a read off the bus thread (a write's read-modify-write).
    func opening(_ collection: Collection, _ id: String,
                 _ next: @escaping (SealedItem) throws(DBusError) -> Bus.DBusAnswer) throws(DBusError) -> Bus.DBusAnswer {
        switch try openAtOnce(collection, id) {
        case .opened(let item):
            return try next(item)
        case .cold(let storage):
            return afterKeychain({ () throws(KeychainError) in try await storage.getSecureBytes(id) }) { [self] read throws(DBusError) in
                try next(try settle(collection, id, read))
            }
        }
    }

    /// `next`'s answer once the item's label, attributes and type are known when they can be: an
    /// item never read, of an unlocked collection, is read first (off the bus thread when cold).
    /// What the read finds is taken in; a failed read leaves them unknown (`""`, `{}`).
    func readingDetails(_ collection: Collection, _ id: String,
                        _ next: @escaping () throws(DBusError) -> Bus.DBusAnswer) throws(DBusError) -> Bus.DBusAnswer {
        guard let entry = collection.items[id], entry.attributes == nil, !collection.locked,
              case .cold(let storage)? = try? openAtOnce(collection, id) else { return try next() }
        return afterKeychain({ () throws(KeychainError) in try await storage.getSecureBytes(id) }) { [self] read throws(DBusError) in
            _ = try? settle(collection, id, read)
            return try next()
        }
    }

    /// Reads `items` and answers with `answer` of their outcomes (in order): at once when every read
    /// is answered on the bus thread; else later, the cold reads done off the bus thread (one batch
    /// read per collection: through keychaind one exchange) while the bus serves other calls, and
    /// their outcomes taken in and `answer` run back on the bus thread.
    func reading(_ items: [(Collection, String)],
                 answer: @escaping ([Result<SealedItem, DBusError>]) throws(DBusError) -> Bus.DBusReply) -> Bus.DBusAnswer {
        let batch = PendingReads(answer: answer, items.map { (collection, id) in
            do throws(DBusError) {
                switch try openAtOnce(collection, id) {
                case .opened(let item): return .done(.success(item))
                case .cold(let storage): return .cold(collection, id, storage)
                }
            } catch {
                return .done(.failure(error))
            }
        })
        let groups = batch.coldGroups
        guard !groups.isEmpty else { return .now(batch.answered()) }
        return .later { [self] reply in
            Task.detached { [self] in
                var found: [Int: Result<SecureBytes?, DBusError>] = [:]
                for group in groups {
                    let reads: [ItemRead]
                    do throws(KeychainError) {
                        reads = try await group.storage.getSecureBytes(group.ids)
                    } catch {
                        reads = group.ids.map { _ in .failure(error) }
                    }
                    for (index, read) in zip(group.indices, reads) { found[index] = read.mapError(Self.dbusError) }
                }
                post { [self, found] in
                    for (index, read) in found { batch.settle(index, with: read, by: self) }
                    reply(batch.answered())
                }
            }
        }
    }
}

/// The reads of one call while its cold ones are off the bus thread. Touched on the bus thread
/// only: the task that reads carries the `Sendable` groups, never this.
private final class PendingReads: @unchecked Sendable {
    enum Slot {
        case done(Result<SealedItem, DBusError>)
        case cold(SecretServiceProvider.Collection, String, Keychain)
    }

    /// The cold reads of one storage: its items' ids and their places in the call's order.
    struct Group: Sendable {
        let storage: Keychain
        var ids: [String] = []
        var indices: [Int] = []
    }

    private var slots: [Slot]
    private let answer: ([Result<SealedItem, DBusError>]) throws(DBusError) -> Bus.DBusReply

    init(answer: @escaping ([Result<SealedItem, DBusError>]) throws(DBusError) -> Bus.DBusReply, _ slots: [Slot]) {
        (self.answer, self.slots) = (answer, slots)
    }

    /// The call's reply, from its reads' outcomes.
    func answered() -> Result<Bus.DBusReply, DBusError> {
        Result { () throws(DBusError) in try answer(outcomes) }
    }

    var coldGroups: [Group] {
        var groups: [ObjectIdentifier: Group] = [:]
        var order: [ObjectIdentifier] = []
        for (index, slot) in slots.enumerated() {
            guard case .cold(let collection, let id, let storage) = slot else { continue }
            let key = ObjectIdentifier(collection)
            if groups[key] == nil { order.append(key) }
            groups[key, default: Group(storage: storage)].ids.append(id)
            groups[key]?.indices.append(index)
        }
        return order.compactMap { groups[$0] }
    }

    func settle(_ index: Int, with read: Result<SecureBytes?, DBusError>, by provider: SecretServiceProvider) {
        guard slots.indices.contains(index), case .cold(let collection, let id, _) = slots[index] else { return }
        do throws(DBusError) {
            slots[index] = .done(.success(try provider.settle(collection, id, read)))
        } catch {
            slots[index] = .done(.failure(error))
        }
    }

    var outcomes: [Result<SealedItem, DBusError>] {
        slots.map { slot in
            if case .done(let outcome) = slot { return outcome }
            return .failure(.failed("The read was not answered"))
        }
    }
}
