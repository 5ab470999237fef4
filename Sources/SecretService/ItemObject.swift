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
            return provider.writing(collection) { () throws(DBusError) in try delete() }
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
            return provider.writing(collection) { () throws(DBusError) in
                try checkUnlocked()
                let (value, contentType) = try provider.decodeSecret(secret, sender: sender)
                return try rewrite { item throws(DBusError) in
                    item.secret = value
                    item.contentType = contentType
                    return collection.items[id]?.hashes ?? provider.hasher.hashes(item.attributes)
                } then: {
                    itemChanged()
                    return .reply([])
                }
            }
        }
    }

    /// In the collection's turn: one keychain delete, off the bus thread.
    private func delete() throws(DBusError) -> Bus.DBusAnswer {
        try checkPresent()
        let deleted = { [provider, collection, id, path] () -> Bus.DBusAnswer in
            collection.items[id] = nil
            provider.emit(.init(path: collection.path, interface: SecretServiceProvider.collectionInterface, member: "ItemDeleted",
                                arguments: [.objectPath(path)]))
            provider.propertiesChanged(collection.path, SecretServiceProvider.collectionInterface, ["Items"])
            return .reply([.objectPath("/")])
        }
        guard let storage = collection.storage else { return deleted() }
        return provider.afterKeychain({ [id] () throws(KeychainError) in try await storage.removeItem(id) }) { removed throws(DBusError) in
            try removed.get()
            return deleted()
        }
    }

    /// In the collection's turn: the item read (off the bus thread when cold), changed by `change`
    /// (which gives its keyed hashes), stored again (off the bus thread), then `then`'s answer.
    private func rewrite(_ change: @escaping (inout SealedItem) throws(DBusError) -> Set<String>,
                         then: @escaping () throws(DBusError) -> Bus.DBusAnswer) throws(DBusError) -> Bus.DBusAnswer {
        try checkPresent()
        return try provider.opening(collection, id) { [provider, collection, id] read throws(DBusError) in
            var item = read
            let hashes = try change(&item)
            return try provider.storing(collection, id, item, hashes: hashes, then)
        }
    }

    private func checkUnlocked() throws(DBusError) {
        guard !collection.locked else { throw .isLocked("Item \(id) is locked: unlock \(collection.name) first") }
    }

    /// The item may have gone while its write waited for its turn.
    private func checkPresent() throws(DBusError) {
        guard collection.items[id] != nil else { throw .noSuchObject("No item at \(path)") }
    }

    private func itemChanged() {
        provider.emit(.init(path: collection.path, interface: SecretServiceProvider.collectionInterface, member: "ItemChanged",
                            arguments: [.objectPath(path)]))
    }

    /// One property, from what the provider holds (`readingDetails` reads the item first when it can).
    func property(_ name: String) -> DBusValue? {
        guard let entry = collection.items[id] else { return nil }
        switch name {
        case "Locked": return .bool(collection.locked)
        case "Created": return .uint64(entry.created)
        case "Modified": return .uint64(entry.modified)
        case "Attributes": return .stringMap(entry.attributes ?? [:])
        case "Label": return .string(entry.label ?? "")
        case "Type": return .string(entry.contentType ?? "")
        default: return nil
        }
    }

    /// `Label` or `Attributes`, in the collection's turn: the item rewritten off the bus thread.
    func set(_ name: String, _ value: DBusValue) throws(DBusError) -> Bus.DBusAnswer {
        guard name == "Label" || name == "Attributes" else {
            throw Self.propertyNames.contains(name) ? .propertyReadOnly("\(name) is read-only") : .unknownProperty("No property \(name) here")
        }
        return provider.writing(collection) { () throws(DBusError) in
            try checkUnlocked()
            return try rewrite { item throws(DBusError) in
                if name == "Label" {
                    guard case .string(let label) = value else { throw .invalidArgs("Label is a string") }
                    item.label = label
                } else {
                    guard let map = value.stringDictionary else { throw .invalidArgs("Attributes is an a{ss}") }
                    item.attributes = map
                }
                try SecretServiceProvider.check(label: item.label, attributes: item.attributes)
                return provider.hasher.hashes(item.attributes)
            } then: {
                itemChanged()
                provider.propertiesChanged(path, SecretServiceProvider.itemInterface, [name])
                return .reply([])
            }
        }
    }
}
