extension SecretServiceProvider {
    /// A collection's items by id, and for each keyed hash the ids of the items that have it: a search
    /// tests only the items of its rarest hash, not every item of the collection (a `SearchItems` with
    /// one match cost the provider time in proportion to the collection's size).
    struct ItemIndex {
        private(set) var entries: [String: ItemEntry] = [:]
        private var ids: [String: Set<String>] = [:]

        /// Setting an entry (or nil) keeps the ids by hash in step with it.
        subscript(id: String) -> ItemEntry? {
            get { entries[id] }
            set {
                let old = entries[id]?.hashes ?? []
                let new = newValue?.hashes ?? []
                entries[id] = newValue
                guard old != new else { return }
                for hash in old.subtracting(new) {
                    ids[hash]?.remove(id)
                    if ids[hash]?.isEmpty == true { ids[hash] = nil }
                }
                for hash in new.subtracting(old) { ids[hash, default: []].insert(id) }
            }
        }

        var keys: Dictionary<String, ItemEntry>.Keys { entries.keys }
        var values: Dictionary<String, ItemEntry>.Values { entries.values }

        mutating func removeAll() {
            entries = [:]
            ids = [:]
        }

        /// The ids of the items that have every hash in `wanted`, sorted; every item's for none.
        func matching(_ wanted: Set<String>) -> [String] {
            guard !wanted.isEmpty else { return entries.keys.sorted() }
            var rarest: Set<String> = []
            for hash in wanted {
                guard let have = ids[hash] else { return [] }
                if rarest.isEmpty || have.count < rarest.count { rarest = have }
            }
            return rarest.filter { entries[$0].map { wanted.isSubset(of: $0.hashes) } ?? false }.sorted()
        }
    }
}
