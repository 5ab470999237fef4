import KeychainCore
import KeychainBasics
import FoundationEssentials
import KeychainStore
import SecureMemory

// MARK: Warm reads: a read answered from what the engine already opened, on the caller's thread
extension Engine {
    /// A wrapping key this engine opened that this read may still use: within the read's window (keys
    /// behind an access control), and for a `whenUnlocked` key while the store's lock generation is
    /// the one it was opened under (a `lock` in any process on this store bumps it). The engine's warm
    /// path asks this; `warmGet` asks the same two questions (`isOpen`, `isCurrent`), so a read
    /// answered on the caller's thread checks the same.
    nonisolated func cachedSecret(_ id: WrappingKeyID, window: Int, store: Store) throws(KeychainError) -> SecureBytes? {
        guard let cached = warm.unsealed(id), Self.isOpen(cached.opened, window: window),
              try isCurrent(cached, store: store) else { return nil }
        return cached.secret
    }

    /// Whether a key the user opened at `opened` (nil: no access control) is still open for a read
    /// whose window is `window` seconds.
    static func isOpen(_ opened: ContinuousClock.Instant?, window: Int) -> Bool {
        opened.map { $0 + .seconds(window) > ContinuousClock.now } ?? true
    }

    /// Whether a kept key is still good at the store's lock generation (`whenUnlocked` keys only).
    nonisolated func isCurrent(_ key: UnsealedKey, store: Store) throws(KeychainError) -> Bool {
        guard let generation = key.generation else { return true }
        return generation == (try lockGeneration(store))
    }

    /// A read answered on the caller's thread, without waiting for the engine's (which may be in a TPM
    /// command that takes seconds, or wait for a frozen TPM): a TPM item whose wrapping key and agreed
    /// secret this engine holds and may still use (`cachedSecret`), read from the store's read
    /// connection. nil when the read needs the engine: no key held, a retired or token key, the first
    /// format's token items, or any error (the engine's path meets the same and reports it).
    /// It only reads the caches: the engine alone fills and empties them, so a lock, a passcode change
    /// or `dropCaches` is never undone by a read that was under way.
    ///
    /// What it found is kept (`WarmState.items`) while the store's data version is the same and the
    /// engine's secrets too: then the item, its wrapping key, its retired marker and the lock
    /// generation are what a lookup would return, so the next read of it is one `PRAGMA data_version`,
    /// the window's clock and the AEAD. Any commit (this process's or another's), and any change of
    /// the engine's keys, drops what was kept.
    /// - Parameter window: the read's window for an item whose tag stores `stored` (`ReadContext.window(stored:)`).
    nonisolated func warmGet(service: String, key: String, window: (_ stored: Int?) -> Int) -> WarmRead? {
        guard ItemNames.keyProblem(key) == nil, let store = warm.store else { return nil }
        do throws(KeychainError) {
            // Read before the rows it vouches for: a commit after it is seen at the next read.
            let version = try read { try store.dataVersion() }
            let name = WarmState.ItemName(service: service, key: key)
            let found: WarmState.Item?
            if let kept = warm.item(name, store: store, version: version) {
                found = kept
            } else {
                guard let looked = try lookUpWarm(name, store: store, version: version) else { return nil }
                found = looked
            }
            guard let item = found else { return .absent }
            guard Self.isOpen(item.opened, window: window(item.storedWindow)) else { return nil }
            do {
                return .value(try Sodium.open(item.ciphertext, key: item.dataKey, nonce: item.nonce, associatedData: item.associatedData))
            } catch {
                return nil
            }
        } catch {
            return nil
        }
    }

    /// The store's rows for a warm read, checked as the engine's own warm path checks them, and kept
    /// for `version`: `.some(nil)` for an absent item, nil when the read needs the engine.
    private nonisolated func lookUpWarm(_ name: WarmState.ItemName, store: Store, version: Int64) throws(KeychainError) -> WarmState.Item?? {
        guard let record = try read({ try store.item(service: name.service, key: name.key) }) else {
            warm.keep(nil, name, store: store, version: version, secrets: nil)
            return .some(nil)
        }
        guard !record.salt.isEmpty else { return nil }
        let (wrapping, retired) = try wrappingKey(of: record, store: store)
        guard !retired, wrapping.backend == .tpm else { return nil }
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let secrets = warm.secrets(id, AgreedID(wrappingPublic: wrapping.publicKey, writerPublic: record.writerPublic))
        guard let unsealed = secrets.unsealed, let shared = secrets.agreed else { return nil }
        guard try isCurrent(unsealed, store: store) else { return nil }
        let item = WarmState.Item(
            opened: unsealed.opened, storedWindow: ItemProtection.storedWindow(ofTag: record.protection),
            dataKey: ItemEnvelope.dataKey(shared: shared, writerPublic: record.writerPublic, wrappingPublic: wrapping.publicKey,
                                          salt: record.salt),
            nonce: record.nonce, ciphertext: record.ciphertext, associatedData: ItemEnvelope.associatedData(record))
        warm.keep(item, name, store: store, version: version, secrets: secrets.generation)
        return .some(item)
    }

    static func window(tag: String, asked: Int) -> Int {
        window(stored: ItemProtection.storedWindow(ofTag: tag), asked: asked)
    }

    static func window(stored: Int?, asked: Int) -> Int {
        guard let stored else { return max(0, asked) }
        return asked > 0 ? min(stored, asked) : stored
    }
}
