import Keychain

extension SecretServiceProvider {
    /// What the provider keeps of an item: its keyed hashes and dates, and what a read found.
    struct ItemEntry {
        var hashes: Set<String>
        var created: UInt64
        var modified: UInt64
        /// Label, content type and attributes once read (they are not secret; the secret is never cached).
        var label: String?
        var contentType: String?
        var attributes: [String: String]?
        /// The session collection's secret: that collection is memory only.
        var memorySecret: SecureBytes?

        /// What a read of the item found that is not secret (its secret is never kept).
        mutating func remember(_ item: SealedItem) {
            label = item.label
            contentType = item.contentType
            attributes = item.attributes
        }
    }
}

/// `org.freedesktop.Secret.Item`'s methods, their arguments decoded.
enum ItemMethod {
    case delete
    case getSecret(session: String)
    case setSecret(ClientSecret)

    init(_ call: DBusCall) throws(DBusError) {
        var a = Arguments(call)
        switch call.member {
        case "Delete": self = .delete
        case "GetSecret": self = .getSecret(session: try a.objectPath("session"))
        case "SetSecret": self = .setSecret(try a.secret("secret"))
        default: throw .unknownMethod("No method \(call.member) on an item")
        }
    }
}

/// An item (`…/collection/NAME/ID`).
struct ItemObject {
    let provider: SecretServiceProvider
    let collection: SecretServiceProvider.Collection
    let id: String

    static let propertyNames = ["Locked", "Attributes", "Label", "Type", "Created", "Modified"]

    var path: String { collection.path + "/" + id }

    func call(_ method: ItemMethod, from sender: String) throws(DBusError) -> Bus.DBusAnswer {
        switch method {
        case .delete:
            if let storage = collection.storage { try SecretServiceProvider.blocking { [id] in try await storage.removeItem(id) } }
            collection.items[id] = nil
            provider.emit(.init(path: collection.path, interface: SecretServiceProvider.collectionInterface, member: "ItemDeleted",
                                arguments: [.objectPath(path)]))
            provider.propertiesChanged(collection.path, SecretServiceProvider.collectionInterface, ["Items"])
            return .reply([.objectPath("/")])
        case .getSecret(let sessionPath):
            _ = try provider.session(sessionPath, sender: sender)
            try checkUnlocked()
            return provider.reading([(collection, id)]) { [provider, id] outcomes throws(DBusError) in
                guard let outcome = outcomes.first else { throw .failed("The read of \(id) gave no outcome") }
                let item = try outcome.get()
                // Checked again: the client may have closed its session while the read ran.
                let session = try provider.session(sessionPath, sender: sender)
                return .init([try provider.secretValue(item.secret, item.contentType, session, sessionPath)], sensitive: true)
            }
        case .setSecret(let secret):
            try checkUnlocked()
            let (value, contentType) = try provider.decodeSecret(secret, sender: sender)
            var item = try provider.open(collection, id)
            item.secret = value
            item.contentType = contentType
            try provider.write(collection, id, item, hashes: collection.items[id]?.hashes ?? provider.hasher.hashes(item.attributes))
            itemChanged()
            return .reply([])
        }
    }

    private func checkUnlocked() throws(DBusError) {
        guard !collection.locked else { throw .isLocked("Item \(id) is locked: unlock \(collection.name) first") }
    }

    private func itemChanged() {
        provider.emit(.init(path: collection.path, interface: SecretServiceProvider.collectionInterface, member: "ItemChanged",
                            arguments: [.objectPath(path)]))
    }

    /// One property: only the label, attributes and type may need a read of the item (once, while
    /// its collection is unlocked).
    func property(_ name: String) -> DBusValue? {
        guard var entry = collection.items[id] else { return nil }
        switch name {
        case "Locked": return .bool(collection.locked)
        case "Created": return .uint64(entry.created)
        case "Modified": return .uint64(entry.modified)
        case "Attributes", "Label", "Type":
            if entry.attributes == nil, !collection.locked, (try? provider.open(collection, id)) != nil, let read = collection.items[id] {
                entry = read
            }
            return name == "Attributes" ? .stringMap(entry.attributes ?? [:])
                : .string((name == "Label" ? entry.label : entry.contentType) ?? "")
        default: return nil
        }
    }

    func set(_ name: String, _ value: DBusValue) throws(DBusError) {
        guard name == "Label" || name == "Attributes" else {
            throw Self.propertyNames.contains(name) ? .propertyReadOnly("\(name) is read-only") : .unknownProperty("No property \(name) here")
        }
        try checkUnlocked()
        var item = try provider.open(collection, id)
        if name == "Label" {
            guard case .string(let label) = value else { throw .invalidArgs("Label is a string") }
            item.label = label
        } else {
            guard let map = value.stringDictionary else { throw .invalidArgs("Attributes is an a{ss}") }
            item.attributes = map
        }
        try SecretServiceProvider.check(label: item.label, attributes: item.attributes)
        try provider.write(collection, id, item, hashes: provider.hasher.hashes(item.attributes))
        itemChanged()
        provider.propertiesChanged(path, SecretServiceProvider.itemInterface, [name])
    }
}
