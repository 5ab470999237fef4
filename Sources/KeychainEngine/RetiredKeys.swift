import KeychainCore
import KeychainStore
import PKCS11
import SecureMemory
import TPM2
import KeychainBasics

/// Retired wrapping keys: a write replaced a dead key while items still use it.
extension Engine {
    /// A write after an enrollment change (CurrentSet) or a passcode removal replaces the service's
    /// dead key. Its items stay, with it: the key moves to a retired tag ("<tag>~<public key>"), and
    /// each of its items gets a marker naming that key and the item's nonce (its version), so its next
    /// read goes to the old key, which the reader check or the TPM finds dead: KEY_INVALIDATED, once.
    static func retiredTag(_ tag: String, publicKey: [UInt8]) -> String {
        tag + "~" + Hex.encode(publicKey)
    }

    /// The tag a key was sealed with (its keyRef names it), for a live or a retired key.
    static func liveTag(_ protection: String) -> String {
        protection.firstIndex(of: "~").map { String(protection[..<$0]) } ?? protection
    }

    static func retire(_ dead: WrappingKeyRecord, _ tx: Transaction) throws {
        var retired = dead
        retired.protection = retiredTag(dead.protection, publicKey: dead.publicKey)
        try tx.putWrappingKey(retired)
        for key in try tx.keys(service: dead.service) {
            // An item already marked belongs to an older retired key.
            guard let item = try tx.item(service: dead.service, key: key), item.protection == dead.protection,
                  try retiredKey(of: item, marker: tx.meta(StoreMeta.retired(service: dead.service, key: key))) == nil else { continue }
            try tx.setMeta(StoreMeta.retired(service: dead.service, key: key), dead.publicKey + item.nonce)
        }
    }

    /// The retired key's public half an item still uses, from its marker; nil for one of the live key.
    static func retiredKey(of item: ItemRecord, marker: [UInt8]?) -> [UInt8]? {
        guard let marker, marker.count == Sodium.x25519KeyLength + item.nonce.count,
              marker.suffix(item.nonce.count).elementsEqual(item.nonce) else { return nil }
        return Array(marker.prefix(Sodium.x25519KeyLength))
    }

    /// The item at (service, key) was replaced or removed: drop its marker, and its retired key
    /// when no other item uses it.
    static func releaseRetired(service: String, key: String, _ tx: Transaction) throws {
        let name = StoreMeta.retired(service: service, key: key)
        guard let marker = try tx.meta(name) else { return }
        _ = try tx.deleteMeta(name)
        guard marker.count > Sodium.x25519KeyLength else { return }
        let publicKey = Array(marker.prefix(Sodium.x25519KeyLength))
        for other in try tx.keys(service: service) where other != key {
            if let item = try tx.item(service: service, key: other),
               try retiredKey(of: item, marker: tx.meta(StoreMeta.retired(service: service, key: other))) == publicKey { return }
        }
        for wrapping in try tx.wrappingKeys(service: service) where wrapping.publicKey == publicKey && wrapping.protection.contains("~") {
            _ = try tx.deleteWrappingKey(service: service, protection: wrapping.protection)
        }
    }
}
