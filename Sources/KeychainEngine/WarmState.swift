import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import Synchronization

/// The engine's caches that a warm read uses from any thread (`Engine.warmGet`): the open store
/// (its reads have their own connection, behind its own lock), the unsealed wrapping keys and the
/// agreed secrets. Only the engine writes them, on its own thread; a warm read looks them up.
///
/// And what warm reads found (`items`): the rows of the store at one data version, with the data key
/// from the engine's secrets. Any change of the keys or secrets, or another store, drops them all,
/// so a kept item never holds a secret the engine let go.
final class WarmState: Sendable {
    struct ItemName: Hashable, Sendable { var service: String; var key: String }
    /// A warm read's item: its stored fields and the data key that opens it.
    struct Item: Sendable {
        /// When the user opened its wrapping key (keys behind an access control), for the window.
        let opened: ContinuousClock.Instant?
        let storedWindow: Int?
        let dataKey: SecureBytes
        let nonce: [UInt8]
        let ciphertext: [UInt8]
        let associatedData: [UInt8]
    }
    private struct State {
        var store: Store?
        var unsealed: [Engine.WrappingKeyID: Engine.UnsealedKey] = [:] { didSet { secretsChanged() } }
        var agreed: [Engine.AgreedID: SecureBytes] = [:] { didSet { secretsChanged() } }
        /// Counts the changes of `unsealed` and `agreed`: an item looked up before one is not kept.
        var secretsGeneration: UInt64 = 0
        /// Items (nil: absent) as the store held them at `itemsVersion`.
        var items: [ItemName: Item?] = [:] { didSet { if items.isEmpty { keptBytes = 0 } } }
        /// The ciphertexts' bytes in `items`.
        var keptBytes = 0
        var itemsVersion: (store: ObjectIdentifier, version: Int64)?

        mutating func secretsChanged() {
            secretsGeneration &+= 1
            items.removeAll()
        }
    }
    private let state = Mutex(State())
    /// Items kept at most; more and they all go (a process that reads many items pays the lookups).
    static let maxItems = 1024
    /// A value larger than this is looked up at each read, never kept: what is kept stays small
    /// beside the values themselves (up to 16 MiB each).
    static let maxKeptValueBytes = 64 * 1024
    /// The kept ciphertexts' bytes at most; more and they all go.
    static let maxKeptBytes = 4 * 1024 * 1024

    /// How many items are kept and their ciphertexts' bytes (for tests).
    var kept: (items: Int, bytes: Int) { state.withLock { ($0.items.count, $0.keptBytes) } }

    var store: Store? {
        get { state.withLock { $0.store } }
        set {
            state.withLock {
                $0.store = newValue
                $0.items.removeAll()
                $0.itemsVersion = nil
            }
        }
    }
    var unsealed: [Engine.WrappingKeyID: Engine.UnsealedKey] {
        get { state.withLock { $0.unsealed } }
        set { state.withLock { $0.unsealed = newValue } }
    }
    var agreed: [Engine.AgreedID: SecureBytes] {
        get { state.withLock { $0.agreed } }
        set { state.withLock { $0.agreed = newValue } }
    }
    func unsealed(_ id: Engine.WrappingKeyID) -> Engine.UnsealedKey? { state.withLock { $0.unsealed[id] } }
    func agreed(_ id: Engine.AgreedID) -> SecureBytes? { state.withLock { $0.agreed[id] } }

    /// A wrapping key's and an agreed secret's entries, and the generation they were read at.
    func secrets(_ id: Engine.WrappingKeyID, _ agreedID: Engine.AgreedID)
        -> (unsealed: Engine.UnsealedKey?, agreed: SecureBytes?, generation: UInt64) {
        state.withLock { ($0.unsealed[id], $0.agreed[agreedID], $0.secretsGeneration) }
    }

    /// The item kept for `name` at the store's `version`: `.some(nil)` when it was absent; nil when
    /// nothing is kept for that version.
    func item(_ name: ItemName, store: Store, version: Int64) -> Item?? {
        state.withLock { state in
            guard let kept = state.itemsVersion, kept.store == ObjectIdentifier(store), kept.version == version else { return nil }
            return state.items[name]
        }
    }

    /// Keeps what a warm read found at `version` of `store`, unless the secrets it used changed since
    /// `secrets` (their generation), or the store or a later version is already kept.
    func keep(_ item: Item?, _ name: ItemName, store: Store, version: Int64, secrets: UInt64?) {
        let bytes = item?.ciphertext.count ?? 0
        guard bytes <= Self.maxKeptValueBytes else { return }
        state.withLock { state in
            guard state.store === store, secrets.map({ $0 == state.secretsGeneration }) ?? true else { return }
            let id = ObjectIdentifier(store)
            if let kept = state.itemsVersion, kept.store == id, kept.version == version {
                if state.items.count >= Self.maxItems || state.keptBytes + bytes > Self.maxKeptBytes { state.items.removeAll() }
                if let replaced = state.items[name] { state.keptBytes -= replaced?.ciphertext.count ?? 0 }
            } else {
                // The versions of one read connection only grow: an older one is not kept over a newer.
                if let kept = state.itemsVersion, kept.store == id, kept.version > version { return }
                state.items.removeAll()
                state.itemsVersion = (id, version)
            }
            state.items[name] = .some(item)
            state.keptBytes += bytes
        }
    }
}
