import KeychainCore
import Glibc
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

/// The persistent handles (0x81000010–0x8100001F) this store gave readers' TPM keys, recorded before
/// each key is made persistent, so none is lost: a first enrollment killed after its EvictControl,
/// or a reader whose directory was deleted, leaves a key that the next provisioning evicts.
///
/// A recorded key is in use while its reader's `reader.json` names it (handle and TPM name). It is
/// evicted only when that file is gone or names another key, and only if the TPM still holds a key
/// of that name at the handle: never another store's or another program's.
///
/// - Important: a reader directory that is moved or renamed counts as deleted: its key is evicted at
///   the next enrollment of a new reader through this store.
struct ReaderKeys {
    struct Entry: Codable, Equatable {
        var handle: UInt32
        var name: [UInt8]
        var directory: String
    }

    let keyring: TPMKeyring

    private var store: Store { keyring.store }
    private var context: TPMContext { keyring.context }

    func entries() -> [Entry] {
        (try? store.meta(StoreMeta.readerKeys)).flatMap { $0 }.flatMap { try? JSONDecoder().decode([Entry].self, from: Data($0)) } ?? []
    }

    private func save(_ entries: [Entry]) throws(KeychainError) {
        do {
            let data = try JSONEncoder().encode(entries)
            try store.write { try $0.setMeta(StoreMeta.readerKeys, Array(data)) }
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Records a key before it is made persistent.
    func record(_ entry: Entry) throws(KeychainError) {
        try save(entries().filter { $0.handle != entry.handle } + [entry])
    }

    /// Evicts the recorded keys no reader uses any more; the others stay recorded.
    func reclaimOrphans() throws(KeychainError) {
        let all = entries()
        var kept: [Entry] = []
        for entry in all {
            guard Self.isOrphan(entry) else { kept.append(entry); continue }
            do {
                if let key = try? context.resource(forPersistent: entry.handle), try context.name(of: key) == entry.name {
                    try context.evict(key, at: entry.handle)
                }
            } catch {
                throw keyring.diagnose(error, doing: "evict the TPM key of a deleted fingerprint reader")
            }
        }
        if kept != all { try save(kept) }
    }

    /// Evicts a deleted reader's key (if the TPM still holds that name there) and forgets it.
    func evict(handle: UInt32, name: [UInt8]) throws(KeychainError) {
        do {
            if let key = try? context.resource(forPersistent: handle), try context.name(of: key) == name {
                try context.evict(key, at: handle)
            }
        } catch {
            throw keyring.diagnose(error, doing: "evict the fingerprint reader's TPM key")
        }
        let all = entries()
        if all.contains(where: { $0.handle == handle }) { try save(all.filter { $0.handle != handle }) }
    }

    /// Its reader's state is gone (the file or the directory does not exist) or names another key.
    /// A file that cannot be read for another reason keeps the key.
    private static func isOrphan(_ entry: Entry) -> Bool {
        let path = entry.directory + "/reader.json"
        var info = stat()
        guard stat(path, &info) == 0 else { return errno == ENOENT || errno == ENOTDIR }
        guard let data = FileManager.default.contents(atPath: path),
              let state = try? JSONDecoder().decode(FingerprintReader.State.self, from: data) else { return false }
        return state.tpmHandle != entry.handle || state.keyName != entry.name
    }
}
