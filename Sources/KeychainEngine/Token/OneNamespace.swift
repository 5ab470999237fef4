import KeychainCore
import KeychainStore

extension Engine {
    /// Stores of the first format kept a token storage's items apart, under "<service>@strongbox".
    /// On open they join their service (one transaction; a store with none costs one meta read):
    /// where both held the same key, the one modified last stays and the other goes, with its
    /// wrapping key when no item uses it any more.
    func mergeTokenNamespace(_ store: Store) throws(KeychainError) {
        guard try read({ try store.meta(StoreMeta.oneNamespace) }) == nil else { return }
        try writeStore(store) { tx in
            guard try tx.meta(StoreMeta.oneNamespace) == nil else { return }
            let suffix = TokenSession.tagSuffix
            for apart in try tx.services() where apart.hasSuffix(suffix) {
                let service = String(apart.dropLast(suffix.count))
                for key in try tx.keys(service: apart) {
                    guard var moving = try tx.item(service: apart, key: key), moving.protection.hasSuffix(suffix) else { continue }
                    _ = try tx.deleteItem(service: apart, key: key)
                    if let there = try tx.item(service: service, key: key) {
                        if there.modified >= moving.modified { continue }  // its key goes below, when unused
                        _ = try tx.deleteItem(service: service, key: key)
                        try Self.releaseRetired(service: service, key: key, tx)
                        try Self.dropUnusedKey(service: service, protection: there.protection, tx)
                    }
                    moving.service = service
                    try tx.putItem(moving)
                }
                for var wrapping in try tx.wrappingKeys(service: apart) where wrapping.backend == .token {
                    _ = try tx.deleteWrappingKey(service: apart, protection: wrapping.protection)
                    guard try tx.itemCount(service: service, protection: wrapping.protection) > 0 else { continue }
                    wrapping.service = service
                    try tx.putWrappingKey(wrapping)
                }
            }
            try tx.setMeta(StoreMeta.oneNamespace, [1])
        }
    }

    /// A wrapping key no item uses is destroyed: its sealed secret exists only in this row.
    static func dropUnusedKey(service: String, protection: String, _ tx: Transaction) throws {
        if try tx.itemCount(service: service, protection: protection) == 0 {
            _ = try tx.deleteWrappingKey(service: service, protection: protection)
        }
    }
}
