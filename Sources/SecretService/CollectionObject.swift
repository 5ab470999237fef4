import Keychain

extension SecretServiceProvider {
    /// A collection's state: its record, its storage and its items' index.
    final class Collection {
        let name: String
        var record: CollectionRecord
        /// nil for the in-memory `session` collection.
        let storage: Keychain?
        var items = ItemIndex()
        var locked: Bool
        /// Counts `Lock` calls: a prompt that was answered after a `Lock` opens nothing.
        var locks = 0

        init(record: CollectionRecord, storage: Keychain?) {
            name = record.name
            self.record = record
            self.storage = storage
            locked = record.accessControl != .none
        }

        var path: String { SecretServiceProvider.collectionPrefix + name }
        var modified: UInt64 { items.values.map(\.modified).max().map { max($0, record.modified) } ?? record.modified }
    }
}

/// `org.freedesktop.Secret.Collection`'s methods, their arguments decoded.
enum CollectionMethod {
    case delete
    case searchItems(attributes: [String: String])
    case createItem(properties: [(String, DBusValue)], secret: ClientSecret, replace: Bool)

    init(_ call: DBusCall) throws(DBusError) {
        var a = Arguments(call)
        switch call.member {
        case "Delete": self = .delete
        case "SearchItems": self = .searchItems(attributes: try a.stringMap("attributes"))
        case "CreateItem":
            self = .createItem(properties: try a.properties("properties"), secret: try a.secret("secret"), replace: try a.bool("replace"))
        default: throw .unknownMethod("No method \(call.member) on a collection")
        }
    }
}

/// A collection (`…/collection/NAME`, or `…/aliases/ALIAS`).
struct CollectionObject {
    let provider: SecretServiceProvider
    let collection: SecretServiceProvider.Collection

    static let propertyNames = ["Items", "Label", "Locked", "Created", "Modified"]

    func call(_ method: CollectionMethod, from sender: String) throws(DBusError) -> Bus.DBusAnswer {
        switch method {
        case .delete:
            try delete()
            return .reply([.objectPath("/")])
        case .searchItems(let query):
            return .reply([.paths(provider.search(collection, query))])
        case .createItem(let properties, let secret, let replace):
            return provider.writing(collection) { () throws(DBusError) in
                try createItem(properties, secret: secret, replace: replace, sender: sender)
            }
        }
    }

    private func delete() throws(DBusError) {
        if let storage = collection.storage {
            try SecretServiceProvider.blocking { try await storage.clear() }
            var new = provider.registry
            new.collections.removeAll { $0.name == collection.name }
            new.aliases = new.aliases.filter { $0.value != collection.name }
            try provider.commit(new)
            provider.collections[collection.name] = nil
        } else {
            collection.items.removeAll()
        }
        let base = SecretServiceProvider.base, service = SecretServiceProvider.serviceInterface
        provider.emit(.init(path: base, interface: service, member: "CollectionDeleted", arguments: [.objectPath(collection.path)]))
        provider.propertiesChanged(base, service, ["Collections"])
    }

    /// In the collection's turn: the item is stored off the bus thread.
    private func createItem(_ properties: [(String, DBusValue)], secret: ClientSecret, replace: Bool,
                            sender: String) throws(DBusError) -> Bus.DBusAnswer {
        guard !collection.locked else { throw .isLocked("Collection \(collection.name) is locked: unlock it first") }
        var label = ""
        var attributes: [String: String] = [:]
        for (name, value) in properties {
            switch name {
            case "org.freedesktop.Secret.Item.Label":
                guard case .string(let text) = value else { throw .invalidArgs("\(name) is a string") }
                label = text
            case "org.freedesktop.Secret.Item.Attributes":
                guard let map = value.stringDictionary else { throw .invalidArgs("\(name) is an a{ss}") }
                attributes = map
            default:
                continue
            }
        }
        try SecretServiceProvider.check(label: label, attributes: attributes)
        let (value, contentType) = try provider.decodeSecret(secret, sender: sender)
        let hashes = provider.hasher.hashes(attributes)
        let existing = replace ? collection.items.matching(hashes).first(where: { collection.items[$0]?.hashes == hashes }) : nil
        let id = existing ?? provider.nextItemID(collection)
        let item = SealedItem(label: label, contentType: contentType, attributes: attributes, secret: value)
        return try provider.storing(collection, id, item, hashes: hashes) { [provider, collection] in
            let path = collection.path + "/" + id
            provider.emit(.init(path: collection.path, interface: SecretServiceProvider.collectionInterface,
                                member: existing == nil ? "ItemCreated" : "ItemChanged", arguments: [.objectPath(path)]))
            if existing == nil { provider.propertiesChanged(collection.path, SecretServiceProvider.collectionInterface, ["Items"]) }
            return .reply([.objectPath(path), .objectPath("/")])
        }
    }

    func property(_ name: String) -> DBusValue? {
        switch name {
        case "Items": .paths(collection.items.keys.sorted().map { collection.path + "/" + $0 })
        case "Label": .string(collection.record.label)
        case "Locked": .bool(collection.locked)
        case "Created": .uint64(collection.record.created)
        case "Modified": .uint64(collection.modified)
        default: nil
        }
    }

    func set(_ name: String, _ value: DBusValue) throws(DBusError) {
        guard name == "Label" else {
            throw Self.propertyNames.contains(name) ? .propertyReadOnly("\(name) is read-only") : .unknownProperty("No property \(name) here")
        }
        guard case .string(let label) = value else { throw .invalidArgs("Label is a string") }
        try SecretServiceProvider.check(collectionLabel: label)
        guard let index = provider.registry.collections.firstIndex(where: { $0.name == collection.name }) else {
            collection.record.label = label
            return
        }
        var new = provider.registry
        new.collections[index].label = label
        new.collections[index].modified = SecretServiceProvider.now()
        try provider.commit(new)
        collection.record = provider.registry.collections[index]
        provider.changed(collection, properties: ["Label"])
    }
}

extension SecretServiceProvider {
    static func check(label: String, attributes: [String: String]) throws(DBusError) {
        guard label.utf8.count <= maxFieldBytes else { throw .invalidArgs("An item's label is at most \(maxFieldBytes) bytes, got \(label.utf8.count)") }
        guard attributes.count <= maxAttributes else { throw .invalidArgs("An item has at most \(maxAttributes) attributes, got \(attributes.count)") }
        for (name, value) in attributes where name.utf8.count > maxFieldBytes || value.utf8.count > maxFieldBytes {
            throw .invalidArgs("Attribute names and values are at most \(maxFieldBytes) bytes ('\(name.prefix(40))' is longer)")
        }
    }

    func search(_ collection: Collection, _ query: [String: String]) -> [String] {
        collection.items.matching(hasher.hashes(query)).map { collection.path + "/" + $0 }
    }

    /// Stores an item, waiting on the bus thread: one keychain write (atomic: the old value or the
    /// new one). For the import (a client, not serving).
    func write(_ collection: Collection, _ id: String, _ item: SealedItem, hashes: Set<String>) throws(DBusError) {
        if let storage = collection.storage {
            let encoded = try Self.storedValue(item), label = AttributeHasher.label(hashes)
            try Self.blocking { try await storage.setItem(id, encoded, options: SetItemOptions(label: label)) }
        }
        wrote(collection, id, item, hashes: hashes)
    }

    /// Stores an item off the bus thread (one keychain write), then `next`'s answer.
    func storing(_ collection: Collection, _ id: String, _ item: SealedItem, hashes: Set<String>,
                 _ next: @escaping () throws(DBusError) -> Bus.DBusAnswer) throws(DBusError) -> Bus.DBusAnswer {
        guard let storage = collection.storage else {
            wrote(collection, id, item, hashes: hashes)
            return try next()
        }
        let encoded = try Self.storedValue(item), label = AttributeHasher.label(hashes)
        return afterKeychain({ () throws(KeychainError) in
            try await storage.setItem(id, encoded, options: SetItemOptions(label: label))
        }) { [self] written throws(DBusError) in
            try written.get()
            wrote(collection, id, item, hashes: hashes)
            return try next()
        }
    }

    private static func storedValue(_ item: SealedItem) throws(DBusError) -> SecureBytes {
        let encoded = item.encoded()
        guard encoded.count <= Keychain.maxValueLength else {
            throw .invalidArgs("The secret is \(item.secret.count) bytes: an item holds at most \(Keychain.maxValueLength - 1024) bytes")
        }
        return encoded
    }

    /// The index after a write.
    private func wrote(_ collection: Collection, _ id: String, _ item: SealedItem, hashes: Set<String>) {
        let now = Self.now()
        collection.items[id] = ItemEntry(hashes: hashes, created: collection.items[id]?.created ?? now, modified: now, label: item.label,
                                         contentType: item.contentType, attributes: item.attributes,
                                         memorySecret: collection.storage == nil ? item.secret : nil)
    }
}
