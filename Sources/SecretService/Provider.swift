import FoundationEssentials
import Dispatch
import Keychain
import KeychainCLIText

/// The Secret Service (org.freedesktop.secrets) over the keychain: a collection is a keychain storage
/// (service `org.freedesktop.secrets/<name>`), an item a keychain item of it (docs/secret-service.md).
///
/// Used from one thread, the bus's: calls are answered in order; keychain work is awaited there (a
/// thread of its own, never Swift's shared pool), except a prompt's read, which may wait for a person:
/// it runs off the bus thread and finishes through `post`.
public final class SecretServiceProvider: @unchecked Sendable {
    public static let busName = "org.freedesktop.secrets"
    static let base = "/org/freedesktop/secrets"
    static let collectionPrefix = base + "/collection/"
    static let aliasPrefix = base + "/aliases/"
    static let sessionPrefix = base + "/session/"
    static let promptPrefix = base + "/prompt/"
    /// libsecret's `SECRET_COLLECTION_SESSION`: the alias of the in-memory `session` collection, kept
    /// out of the registry (it names nothing stored, and nothing of it outlives the provider).
    static let sessionAlias = "session"
    /// The provider's own records (the collections, their aliases, the attribute key) live under this service.
    static let metaService = "org.freedesktop.secrets"
    /// A collection's items live under `org.freedesktop.secrets/<name>`.
    static func service(of name: String) -> String { metaService + "/" + name }

    /// `CreateCollection`'s provider-specific properties: the collection's keychain protection.
    public static let accessibleProperty = "org.freedesktop.Secret.Collection.KeychainAccessible"
    public static let accessControlProperty = "org.freedesktop.Secret.Collection.KeychainAccessControl"
    public static let authValidityProperty = "org.freedesktop.Secret.Collection.KeychainAuthValidity"

    /// Bounds on what a client can make the provider keep: a name too long or one too many is
    /// refused before anything changes, in memory or in the store.
    static let maxFieldBytes = 4096
    /// The keychain label of an item holds its keyed hashes (`h1:`, then 32 hex digits and a comma
    /// each), and the keychain takes a label of at most 4,096 bytes: 124 hashes fit (4,094 bytes).
    static let maxAttributes = (4096 - "h1:".utf8.count + 1) / 33
    static let maxSessionsPerClient = 64
    /// An alias is a path element (`/org/freedesktop/secrets/aliases/ALIAS`), `default` in practice.
    static let maxAliasBytes = 255
    static let maxAliases = 256
    static let maxCollections = 256
    /// The registry is one keychain item, rewritten at each change of a collection or an alias: its
    /// JSON (labels of up to 4,096 bytes, escaped) is bounded as a whole, not only field by field.
    static let maxRegistryBytes = 256 << 10
    /// A collection's name comes from its label (its letters and digits): the first 64 of them.
    static let maxCollectionNameLength = 64

    let configuration: KeychainConfiguration
    let meta: Keychain
    let hasher: AttributeHasher
    /// As the store holds it: changed only through `commit`.
    private(set) var registry: Registry
    /// The size of the registry's JSON in the store.
    private var registryBytes = 0
    var collections: [String: Collection] = [:]
    var sessions: [String: Session] = [:]
    var prompts: [String: Prompt] = [:]
    var counter = 0
    /// Emits a signal on the bus (bus thread).
    public var emit: (DBusSignal) -> Void = { _ in }
    /// Runs work on the bus thread later (a prompt's completion).
    public var post: (@escaping @Sendable () -> Void) -> Void = { $0() }

    /// The provider's records: each collection and the aliases.
    struct Registry: Codable {
        var collections: [CollectionRecord]
        var aliases: [String: String]
    }

    struct CollectionRecord: Codable {
        var name: String
        var label: String
        var created: UInt64
        var modified: UInt64
        var accessible: Accessible
        var accessControl: AccessControl
        var authValidity: Int
    }

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

    struct Session {
        var owner: String
        /// nil: `plain`; else the AES-128 key of the DH session.
        var key: SecureBytes?
    }

    struct Prompt: Sendable {
        var owner: String
        var collections: [String]
        /// The read asking the person, once `Prompt` was called; `Dismiss` and the owner's leaving cancel it.
        var asking: Task<Void, Never>?
    }

    /// Opens (and the first time makes) the provider's records in the keychain of `configuration`.
    public init(configuration: KeychainConfiguration) throws(DBusError) {
        self.configuration = configuration
        meta = try Self.keychainCall { () throws(KeychainError) in
            try createKeychain(.init(service: Self.metaService), configuration: configuration)
        }
        let meta = meta
        let key: SecureBytes = try Self.blocking {
            if let key = try await meta.getSecureBytes("attribute-key") { return key }
            let key = SecureBytes(random: 32)
            try await meta.setItem("attribute-key", key, options: SetItemOptions(label: "keyed hash of Secret Service attributes"))
            return key
        }
        guard key.count == 32 else { throw .failed("The stored attribute key is \(key.count) bytes, not 32: the store is damaged") }
        hasher = AttributeHasher(key: key)
        let stored = try Self.blocking { try await meta.getData("registry") }
        if let stored {
            guard let decoded = try? JSONDecoder().decode(Registry.self, from: stored) else {
                throw .failed("The Secret Service registry in the keychain does not decode: the store is damaged")
            }
            registry = decoded
            registryBytes = stored.count
        } else {
            let now = Self.now()
            registry = Registry(collections: [], aliases: [:])  // Nothing stored yet: the first commit writes it.
            try commit(Registry(collections: [CollectionRecord(name: "login", label: "Login", created: now, modified: now,
                                                               accessible: .afterFirstUnlock, accessControl: .none, authValidity: 0)],
                                aliases: ["default": "login"]))
        }
        for record in registry.collections { try load(record) }
        let now = Self.now()
        collections["session"] = Collection(record: CollectionRecord(name: "session", label: "Session", created: now, modified: now,
                                                                     accessible: .afterFirstUnlock, accessControl: .none, authValidity: 0),
                                            storage: nil)
    }

    /// Reads a collection's index: each item's keyed hashes and dates, no value (no TPM).
    private func load(_ record: CollectionRecord) throws(DBusError) {
        let options = KeychainOptions(service: Self.service(of: record.name), accessible: record.accessible,
                                      accessControl: record.accessControl, authValidity: record.authValidity,
                                      prompt: Self.prompt(record))
        let configuration = configuration
        let storage = try Self.keychainCall { () throws(KeychainError) in try createKeychain(options, configuration: configuration) }
        let collection = Collection(record: record, storage: storage)
        let infos = try Self.blocking {
            var infos: [(String, ItemInfo)] = []
            for key in try await storage.getAllKeys() {
                if let info = try await storage.getItemInfo(key) { infos.append((key, info)) }
            }
            return infos
        }
        for (key, info) in infos {
            guard let hashes = AttributeHasher.hashes(label: info.label) else { continue }
            collection.items[key] = ItemEntry(hashes: hashes, created: UInt64(info.created.timeIntervalSince1970),
                                              modified: UInt64(info.modified.timeIntervalSince1970))
        }
        collections[record.name] = collection
    }

    /// What the system's prompter shows when a read of the collection asks (the dialog's title and text).
    static func prompt(_ record: CollectionRecord) -> PromptText {
        let name = record.label.isEmpty ? record.name : record.label
        return PromptText(title: "Unlock the keyring '\(name)'",
                               description: "An application wants access to the keyring '\(name)', but it is locked",
                               cancel: "Cancel")
    }

    /// Makes `new` the registry: the store's first, then the provider's memory, so a change refused
    /// (past the size bound, or a write that failed) leaves the registry as it was in both. A change
    /// that does not grow it is always taken: a registry made large before the bound can still shrink.
    private func commit(_ new: Registry) throws(DBusError) {
        let data = try! JSONEncoder().encode(new)
        guard data.count <= Self.maxRegistryBytes || data.count <= registryBytes else {
            throw .limitsExceeded("The Secret Service registry (each collection's name and label, and the aliases) would take "
                                  + "\(data.count) bytes, more than its \(Self.maxRegistryBytes): delete a collection or an alias, "
                                  + "or use a shorter label")
        }
        let meta = meta
        try Self.blocking { try await meta.setItem("registry", data) }
        registry = new
        registryBytes = data.count
    }

    // MARK: - Calls

    /// Answers one call; every failure is a D-Bus error.
    public func handle(_ call: DBusCall) -> Result<Bus.DBusReply, DBusError> {
        do throws(DBusError) {
            return .success(try route(call))
        } catch {
            return .failure(error)
        }
    }

    /// A client left the bus: its sessions (and their keys) and its prompts go with it.
    public func clientVanished(_ name: String) {
        sessions = sessions.filter { $0.value.owner != name }
        for prompt in prompts.values where prompt.owner == name { prompt.asking?.cancel() }
        prompts = prompts.filter { $0.value.owner != name }
    }

    enum Object {
        case service, collection(Collection), item(Collection, String), session(String), prompt(String)
        /// A node with children only (for Introspect).
        case node([String])
    }

    func resolve(_ path: String) throws(DBusError) -> Object {
        if path == Self.base { return .service }
        if path.hasPrefix(Self.collectionPrefix) || path.hasPrefix(Self.aliasPrefix) {
            let isAlias = path.hasPrefix(Self.aliasPrefix)
            let rest = path.dropFirst(isAlias ? Self.aliasPrefix.count : Self.collectionPrefix.count).split(separator: "/", omittingEmptySubsequences: false)
            let name = isAlias ? collectionName(alias: String(rest[0])) : String(rest[0])
            guard let name, let collection = collections[name], rest.count <= 2 else {
                throw .noSuchObject("No collection at \(path)")
            }
            if rest.count == 1 { return .collection(collection) }
            let id = String(rest[1])
            guard collection.items[id] != nil else { throw .noSuchObject("No item at \(path)") }
            return .item(collection, id)
        }
        if path.hasPrefix(Self.sessionPrefix) {
            guard sessions[path] != nil else { throw .noSuchObject("No session at \(path): it was closed or never opened") }
            return .session(path)
        }
        if path.hasPrefix(Self.promptPrefix) {
            guard prompts[path] != nil else { throw .noSuchObject("No prompt at \(path): it completed or was dismissed") }
            return .prompt(path)
        }
        switch path {
        case "/": return .node(["org"])
        case "/org": return .node(["freedesktop"])
        case "/org/freedesktop": return .node(["secrets"])
        case Self.base + "/collection": return .node(collections.keys.sorted())
        case Self.base + "/aliases": return .node(Set(registry.aliases.keys).union([Self.sessionAlias]).sorted())
        case Self.base + "/session": return .node(sessions.keys.map { String($0.dropFirst(Self.sessionPrefix.count)) }.sorted())
        case Self.base + "/prompt": return .node(prompts.keys.map { String($0.dropFirst(Self.promptPrefix.count)) }.sorted())
        default: throw .unknownObject("No object at \(path)")
        }
    }

    static let serviceInterface = "org.freedesktop.Secret.Service"
    static let collectionInterface = "org.freedesktop.Secret.Collection"
    static let itemInterface = "org.freedesktop.Secret.Item"
    static let sessionInterface = "org.freedesktop.Secret.Session"
    static let promptInterface = "org.freedesktop.Secret.Prompt"
    static let propertiesInterface = "org.freedesktop.DBus.Properties"
    static let introspectableInterface = "org.freedesktop.DBus.Introspectable"

    func route(_ call: DBusCall) throws(DBusError) -> Bus.DBusReply {
        let object = try resolve(call.path)
        let own = Introspection.interface(of: object)
        let interface: String
        if call.interface.isEmpty {
            guard let found = Introspection.interfaceDeclaring(call.member, for: object) else {
                throw .unknownMethod("No method \(call.member) at \(call.path)")
            }
            interface = found
        } else {
            interface = call.interface
        }
        guard let expected = Introspection.signature(of: call.member, in: interface),
              interface == Self.propertiesInterface || interface == Self.introspectableInterface || interface == own else {
            throw .unknownMethod("No method \(interface).\(call.member) at \(call.path)")
        }
        guard call.signature == expected else {
            throw .invalidArgs("\(interface).\(call.member) takes (\(expected)), got (\(call.signature))")
        }
        let a = call.arguments
        switch (interface, call.member) {
        case (Self.introspectableInterface, "Introspect"):
            return .init([.string(Introspection.xml(for: object))])
        case (Self.propertiesInterface, "Get"):
            let (name, property) = (a[0].string!, a[1].string!)
            guard name.isEmpty || name == own else { throw .unknownProperty("\(call.path) has no interface \(name)") }
            guard let value = self.property(property, of: object) else {
                throw .unknownProperty("\(own) has no property \(property)")
            }
            return .init([.variant(value)])
        case (Self.propertiesInterface, "GetAll"):
            let name = a[0].string!
            guard name.isEmpty || name == own else { return .init([.properties([])]) }
            return .init([.properties(properties(Self.propertyNames(of: object), of: object))])
        case (Self.propertiesInterface, "Set"):
            let (name, property) = (a[0].string!, a[1].string!)
            guard name.isEmpty || name == own else { throw .unknownProperty("\(call.path) has no interface \(name)") }
            try setProperty(property, a[2].variantContent!, on: object)
            return .init([])
        default:
            break
        }
        switch object {
        case .service: return try serviceCall(call)
        case .collection(let collection): return try collectionCall(call, collection)
        case .item(let collection, let id): return try itemCall(call, collection, id)
        case .session(let path):
            sessions[path] = nil  // Close: the key is wiped as the SecureBytes goes.
            return .init([])
        case .prompt(let path): return try promptCall(call, path)
        case .node: throw .unknownMethod("No method \(call.member) at \(call.path)")
        }
    }

    // MARK: - Service

    func serviceCall(_ call: DBusCall) throws(DBusError) -> Bus.DBusReply {
        let a = call.arguments
        switch call.member {
        case "OpenSession":
            guard sessions.values.filter({ $0.owner == call.sender }).count < Self.maxSessionsPerClient else {
                throw .accessDenied("This connection has \(Self.maxSessionsPerClient) open sessions: close some first")
            }
            let input = a[1].variantContent!
            let output: DBusValue
            let session: Session
            switch a[0].string! {
            case "plain":
                output = .string("")
                session = Session(owner: call.sender, key: nil)
            case "dh-ietf1024-sha256-aes128-cbc-pkcs7":
                guard case .bytes(let clientPublic) = input else {
                    throw .invalidArgs("dh-ietf1024-sha256-aes128-cbc-pkcs7 takes the client's public key as a variant of ay")
                }
                let (ours, key) = try SessionCrypto.agree(clientPublic: clientPublic)
                output = .bytes(SecureBytes(copying: ours))
                session = Session(owner: call.sender, key: key)
            case let other:
                throw .notSupported("Session algorithm '\(other.prefix(64))' is not supported: use plain or dh-ietf1024-sha256-aes128-cbc-pkcs7")
            }
            let path = Self.sessionPrefix + nextID()
            sessions[path] = session
            return .init([.variant(output), .objectPath(path)])
        case "CreateCollection":
            return .init([.objectPath(try createCollection(a[0], alias: a[1].string!)), .objectPath("/")])
        case "SearchItems":
            let query = a[0].stringDictionary!
            var unlocked: [String] = []
            var locked: [String] = []
            for collection in collections.values.sorted(by: { $0.name < $1.name }) {
                let found = search(collection, query)
                if collection.locked { locked += found } else { unlocked += found }
            }
            return .init([.paths(unlocked), .paths(locked)])
        case "Unlock":
            return try unlock(a[0].pathList!, sender: call.sender)
        case "Lock":
            var done: [String] = []
            for path in a[0].pathList! {
                guard let collection = try? owningCollection(path) else { continue }
                collection.locks += 1
                // The keychain's window ends too: its next read asks, in this process and any other.
                if collection.record.accessControl != .none, let storage = collection.storage {
                    try Self.blocking { try await storage.endAuthenticationWindow() }
                }
                if !collection.locked {
                    collection.locked = true
                    changed(collection, properties: ["Locked"])
                }
                done.append(path)
            }
            return .init([.paths(done), .objectPath("/")])
        case "GetSecrets":
            let session = try session(a[1].string!, sender: call.sender)
            var entries: [DBusValue] = []
            for path in a[0].pathList! {
                guard case .item(let collection, let id)? = try? resolve(path), !collection.locked,
                      let item = try? open(collection, id) else { continue }
                entries.append(.dictEntry(.objectPath(path), try secretValue(item.secret, item.contentType, session, a[1].string!)))
            }
            return .init([.array(element: "{o(oayays)}", entries)], sensitive: true)
        case "ReadAlias":
            guard let name = collectionName(alias: a[0].string!), let collection = collections[name] else { return .init([.objectPath("/")]) }
            return .init([.objectPath(collection.path)])
        case "SetAlias":
            let alias = a[0].string!
            guard alias != Self.sessionAlias else {
                throw .invalidArgs("The alias 'session' always names the in-memory session collection: it cannot be moved or removed")
            }
            var new = registry
            let target = a[1].string!
            if target == "/" {
                // An alias made before the bounds is removed whatever its length.
                guard new.aliases.removeValue(forKey: alias) != nil else {
                    try Self.check(alias: alias)
                    return .init([])
                }
            } else {
                try Self.check(alias: alias)
                guard case .collection(let collection) = try resolve(target) else { throw .noSuchObject("No collection at \(target)") }
                guard collection.storage != nil else { throw .invalidArgs("The session collection lives in memory only: it cannot have an alias") }
                try checkRoom(forAlias: alias)
                new.aliases[alias] = collection.name
            }
            try commit(new)
            return .init([])
        default:
            throw .unknownMethod("No method \(call.member) on the service")
        }
    }

    func createCollection(_ properties: DBusValue, alias: String) throws(DBusError) -> String {
        if !alias.isEmpty { try Self.check(alias: alias) }
        if !alias.isEmpty, let name = collectionName(alias: alias), let existing = collections[name] { return existing.path }
        guard registry.collections.count < Self.maxCollections else {
            throw .limitsExceeded("There are \(registry.collections.count) collections, the most the provider keeps: delete one first")
        }
        if !alias.isEmpty { try checkRoom(forAlias: alias) }
        var label = ""
        var options = KeychainOptions(accessible: .afterFirstUnlock, accessControl: .none)
        for (name, value) in properties.entries! {
            let value = value.variantContent!
            switch name {
            case "org.freedesktop.Secret.Collection.Label", "Label":
                guard case .string(let text) = value else { throw .invalidArgs("\(name) is a string") }
                label = text
            case Self.accessibleProperty:
                guard case .string(let text) = value, let accessible = Accessible(rawValue: text) else {
                    throw .invalidArgs("\(name) is one of \(Accessible.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                options.accessible = accessible
            case Self.accessControlProperty:
                guard case .string(let text) = value, let accessControl = AccessControl(rawValue: text) else {
                    throw .invalidArgs("\(name) is one of \(AccessControl.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                options.accessControl = accessControl
            case Self.authValidityProperty:
                guard case .uint32(let seconds) = value, seconds <= 86_400 else { throw .invalidArgs("\(name) is a uint32 of seconds, at most 86400") }
                options.authValidity = Int(seconds)
            default:
                continue  // Other providers' properties are ignored, as the spec's extensibility asks.
            }
        }
        try Self.check(collectionLabel: label)
        var name = String(label.lowercased().prefix(Self.maxCollectionNameLength).map { $0.isASCII && ($0.isLetter || $0.isNumber) ? $0 : "_" })
        if name.isEmpty { name = "collection" }
        let stem = name
        var n = 1
        while collections[name] != nil || name == "session" {
            n += 1
            name = stem + String(n)
        }
        options.service = Self.service(of: name)
        do throws(KeychainError) {
            _ = try options.validated()
        } catch {
            throw .invalidArgs(error.message)
        }
        let now = Self.now()
        let record = CollectionRecord(name: name, label: label, created: now, modified: now, accessible: options.accessible,
                                      accessControl: options.accessControl, authValidity: options.authValidity)
        var new = registry
        new.collections.append(record)
        if !alias.isEmpty { new.aliases[alias] = name }
        // Opened before it is recorded (opening writes nothing), so a refused registry leaves no trace.
        try load(record)
        do throws(DBusError) {
            try commit(new)
        } catch {
            collections[name] = nil
            throw error
        }
        let path = collections[name]!.path
        emit(.init(path: Self.base, interface: Self.serviceInterface, member: "CollectionCreated", arguments: [.objectPath(path)]))
        propertiesChanged(Self.base, Self.serviceInterface, ["Collections"])
        return path
    }

    /// An alias a client may create: a path element of at most `maxAliasBytes`.
    static func check(alias: String) throws(DBusError) {
        guard alias.utf8.count <= maxAliasBytes else {
            throw .invalidArgs("An alias is at most \(maxAliasBytes) bytes, got \(alias.utf8.count)")
        }
        guard isPathElement(alias) else { throw .invalidArgs("An alias is letters, digits and _: got '\(alias)'") }
    }

    /// Room for `alias` among the registry's: a new one past `maxAliases` is refused (moving one is not).
    func checkRoom(forAlias alias: String) throws(DBusError) {
        guard registry.aliases[alias] != nil || registry.aliases.count < Self.maxAliases else {
            throw .limitsExceeded("There are \(registry.aliases.count) aliases, the most the provider keeps: remove one first (SetAlias to '/')")
        }
    }

    static func check(collectionLabel label: String) throws(DBusError) {
        guard label.utf8.count <= maxFieldBytes else {
            throw .invalidArgs("A collection's label is at most \(maxFieldBytes) bytes, got \(label.utf8.count)")
        }
    }

    /// The collection an alias names: `session` the in-memory one, any other as the registry says.
    func collectionName(alias: String) -> String? {
        alias == Self.sessionAlias ? "session" : registry.aliases[alias]
    }

    func search(_ collection: Collection, _ query: [String: String]) -> [String] {
        collection.items.matching(hasher.hashes(query)).map { collection.path + "/" + $0 }
    }

    func owningCollection(_ path: String) throws(DBusError) -> Collection {
        switch try resolve(path) {
        case .collection(let collection), .item(let collection, _): return collection
        default: throw .noSuchObject("\(path) is not a collection or an item")
        }
    }

    func unlock(_ paths: [String], sender: String) throws(DBusError) -> Bus.DBusReply {
        var unlocked: [String] = []
        var needPrompt: [String] = []
        for path in paths {
            guard let collection = try? owningCollection(path) else { continue }
            if !collection.locked {
                unlocked.append(path)
            } else if collection.record.accessControl == .none {
                // Nothing to ask: the keychain reads these items without a prompt; only our own Lock held them.
                collection.locked = false
                changed(collection, properties: ["Locked"])
                unlocked.append(path)
            } else {
                needPrompt.append(collection.name)
            }
        }
        guard !needPrompt.isEmpty else { return .init([.paths(unlocked), .objectPath("/")]) }
        let path = Self.promptPrefix + nextID()
        prompts[path] = Prompt(owner: sender, collections: needPrompt)
        return .init([.paths(unlocked), .objectPath(path)])
    }

    // MARK: - Collection

    func collectionCall(_ call: DBusCall, _ collection: Collection) throws(DBusError) -> Bus.DBusReply {
        let a = call.arguments
        switch call.member {
        case "Delete":
            if let storage = collection.storage {
                try Self.blocking { try await storage.clear() }
                var new = registry
                new.collections.removeAll { $0.name == collection.name }
                new.aliases = new.aliases.filter { $0.value != collection.name }
                try commit(new)
                collections[collection.name] = nil
            } else {
                collection.items.removeAll()
            }
            emit(.init(path: Self.base, interface: Self.serviceInterface, member: "CollectionDeleted", arguments: [.objectPath(collection.path)]))
            propertiesChanged(Self.base, Self.serviceInterface, ["Collections"])
            return .init([.objectPath("/")])
        case "SearchItems":
            return .init([.paths(search(collection, a[0].stringDictionary!))])
        case "CreateItem":
            return .init([.objectPath(try createItem(collection, a[0], secret: a[1], replace: a[2].bool, sender: call.sender)), .objectPath("/")])
        default:
            throw .unknownMethod("No method \(call.member) on a collection")
        }
    }

    func createItem(_ collection: Collection, _ properties: DBusValue, secret: DBusValue, replace: Bool, sender: String) throws(DBusError) -> String {
        guard !collection.locked else { throw .isLocked("Collection \(collection.name) is locked: unlock it first") }
        var label = ""
        var attributes: [String: String] = [:]
        for (name, value) in properties.entries! {
            let value = value.variantContent!
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
        try Self.check(label: label, attributes: attributes)
        let (value, contentType) = try decodeSecret(secret, sender: sender)
        let hashes = hasher.hashes(attributes)
        let existing = replace ? collection.items.matching(hashes).first(where: { collection.items[$0]?.hashes == hashes }) : nil
        let id = existing ?? nextItemID(collection)
        try write(collection, id, SealedItem(label: label, contentType: contentType, attributes: attributes, secret: value), hashes: hashes)
        let path = collection.path + "/" + id
        emit(.init(path: collection.path, interface: Self.collectionInterface, member: existing == nil ? "ItemCreated" : "ItemChanged",
                   arguments: [.objectPath(path)]))
        if existing == nil { propertiesChanged(collection.path, Self.collectionInterface, ["Items"]) }
        return path
    }

    static func check(label: String, attributes: [String: String]) throws(DBusError) {
        guard label.utf8.count <= maxFieldBytes else { throw .invalidArgs("An item's label is at most \(maxFieldBytes) bytes, got \(label.utf8.count)") }
        guard attributes.count <= maxAttributes else { throw .invalidArgs("An item has at most \(maxAttributes) attributes, got \(attributes.count)") }
        for (name, value) in attributes where name.utf8.count > maxFieldBytes || value.utf8.count > maxFieldBytes {
            throw .invalidArgs("Attribute names and values are at most \(maxFieldBytes) bytes ('\(name.prefix(40))' is longer)")
        }
    }

    /// Stores an item: one keychain write (atomic: the old value or the new one).
    func write(_ collection: Collection, _ id: String, _ item: SealedItem, hashes: Set<String>) throws(DBusError) {
        let now = Self.now()
        let created = collection.items[id]?.created ?? now
        if let storage = collection.storage {
            let encoded = item.encoded()
            guard encoded.count <= Keychain.maxValueLength else {
                throw .invalidArgs("The secret is \(item.secret.count) bytes: an item holds at most \(Keychain.maxValueLength - 1024) bytes")
            }
            let label = AttributeHasher.label(hashes)
            try Self.blocking { try await storage.setItem(id, encoded, options: SetItemOptions(label: label)) }
        }
        collection.items[id] = ItemEntry(hashes: hashes, created: created, modified: now, label: item.label, contentType: item.contentType,
                                         attributes: item.attributes, memorySecret: collection.storage == nil ? item.secret : nil)
    }

    /// The whole item: from the keychain (a read: the TPM when the key is cold, a prompt with an access control).
    func open(_ collection: Collection, _ id: String) throws(DBusError) -> SealedItem {
        guard let entry = collection.items[id] else { throw .noSuchObject("No item \(id) in \(collection.name)") }
        guard let storage = collection.storage else {
            return SealedItem(label: entry.label ?? "", contentType: entry.contentType ?? "", attributes: entry.attributes ?? [:],
                              secret: entry.memorySecret ?? SecureBytes(count: 0))
        }
        let stored: SecureBytes?
        do throws(DBusError) {
            // A warm read is answered here, on the bus thread; only a cold one waits for the engine's.
            switch storage.warmRead(id) {
            case .value(let bytes): stored = bytes
            case .absent: stored = nil
            case nil: stored = try Self.blocking { try await storage.getSecureBytes(id) }
            }
        } catch {
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

    // MARK: - Item

    func itemCall(_ call: DBusCall, _ collection: Collection, _ id: String) throws(DBusError) -> Bus.DBusReply {
        let a = call.arguments
        let path = collection.path + "/" + id
        switch call.member {
        case "Delete":
            if let storage = collection.storage { try Self.blocking { try await storage.removeItem(id) } }
            collection.items[id] = nil
            emit(.init(path: collection.path, interface: Self.collectionInterface, member: "ItemDeleted", arguments: [.objectPath(path)]))
            propertiesChanged(collection.path, Self.collectionInterface, ["Items"])
            return .init([.objectPath("/")])
        case "GetSecret":
            let session = try session(a[0].string!, sender: call.sender)
            guard !collection.locked else { throw .isLocked("Item \(id) is locked: unlock \(collection.name) first") }
            let item = try open(collection, id)
            return .init([try secretValue(item.secret, item.contentType, session, a[0].string!)], sensitive: true)
        case "SetSecret":
            guard !collection.locked else { throw .isLocked("Item \(id) is locked: unlock \(collection.name) first") }
            let (value, contentType) = try decodeSecret(a[0], sender: call.sender)
            var item = try open(collection, id)
            item.secret = value
            item.contentType = contentType
            try write(collection, id, item, hashes: collection.items[id]!.hashes)
            emit(.init(path: collection.path, interface: Self.collectionInterface, member: "ItemChanged", arguments: [.objectPath(path)]))
            return .init([])
        default:
            throw .unknownMethod("No method \(call.member) on an item")
        }
    }

    // MARK: - Prompt

    func promptCall(_ call: DBusCall, _ path: String) throws(DBusError) -> Bus.DBusReply {
        guard let prompt = prompts[path] else { throw .noSuchObject("No prompt at \(path)") }
        switch call.member {
        case "Dismiss":
            // A prompt showing is canceled: the prompter closes its dialog, and what its read finds is not used.
            prompts[path] = nil
            prompt.asking?.cancel()
            emit(.init(path: path, interface: Self.promptInterface, member: "Completed", arguments: [.bool(true), .variant(.paths([]))]))
            return .init([])
        case "Prompt":
            guard prompt.asking == nil else { throw .failed("The prompt at \(path) is already showing: wait for Completed, or Dismiss it") }
            // Completed follows Prompt's reply, as the spec orders them: it is emitted from the bus
            // thread after this call returns.
            prompts[path]?.asking = ask(prompt, path)
            return .init([])
        default:
            throw .unknownMethod("No method \(call.member) on a prompt")
        }
    }

    /// What a prompt's read found for one collection: nothing to read (no item yet), the item's
    /// stored value, or a refusal (a wrong or canceled answer, a window that passed).
    enum PromptRead: Sendable { case empty, opened(String, SecureBytes), refused }

    /// Asks through the keychain's authenticator (the system's prompters: the desktop's dialog, the
    /// password agents), off the bus thread (other callers are served while the person answers): one
    /// read of an item of each locked collection opens its window. Canceling the task cancels the prompt.
    func ask(_ prompt: Prompt, _ path: String) -> Task<Void, Never> {
        let reads = prompt.collections.compactMap { name -> (String, Keychain?, String?, Int)? in
            guard let collection = collections[name] else { return nil }
            return (name, collection.storage, collection.items.keys.sorted().first, collection.locks)
        }
        return Task.detached { [self] in
            var found: [(String, PromptRead, Int)] = []
            for (name, storage, id, locks) in reads {
                guard let storage, let id else {
                    found.append((name, .empty, locks))
                    continue
                }
                var stored: SecureBytes?
                if !Task.isCancelled {
                    do throws(KeychainError) {
                        stored = try await storage.getSecureBytes(id)
                    } catch {
                        // Why the collection stays locked (a cancel, no prompter reached, a wrong answer), never a secret.
                        // A client named the collection: escaped, as every field a caller chose.
                        writeAll(2, "keychain-secret-service: \(path) left \(logField(name)) locked: \(error.code): \(escaped(error.message))\n")
                    }
                }
                found.append((name, stored.map { .opened(id, $0) } ?? .refused, locks))
            }
            post { [self, found] in answered(path, found) }
        }
    }

    /// A prompt's reads are done (bus thread): the collections they opened are unlocked, unless a
    /// `Lock` came in the meantime, and `Completed` says which. A prompt dismissed (or whose client
    /// left) while its read was asking opens nothing: a window its read opened anyway (the person
    /// answered as the dismissal came) is ended.
    func answered(_ path: String, _ found: [(String, PromptRead, Int)]) {
        guard prompts.removeValue(forKey: path) != nil else {
            for (name, read, _) in found {
                guard case .opened = read, let collection = collections[name], collection.record.authValidity > 0,
                      let storage = collection.storage else { continue }
                Task.detached { try? await storage.endAuthenticationWindow() }
            }
            return
        }
        var opened: [String] = []
        for (name, read, locks) in found {
            guard let collection = collections[name], collection.locks == locks else { continue }
            switch read {
            case .empty:
                // No item to read: nothing to protect yet, and the next write needs no secret.
                collection.locked = false
            case .opened(let id, let stored):
                collection.locked = false
                if let item = SealedItem(decoding: stored) { collection.items[id]?.remember(item) }
            case .refused:
                collection.locked = true
                continue
            }
            opened.append(collection.path)
            changed(collection, properties: ["Locked"])
        }
        let dismissed = opened.isEmpty
        emit(.init(path: path, interface: Self.promptInterface, member: "Completed", arguments: [.bool(dismissed), .variant(.paths(opened))]))
    }

    // MARK: - Properties

    /// An object's properties, in `GetAll`'s order.
    static func propertyNames(of object: Object) -> [String] {
        switch object {
        case .service: ["Collections"]
        case .collection: ["Items", "Label", "Locked", "Created", "Modified"]
        case .item: ["Locked", "Attributes", "Label", "Type", "Created", "Modified"]
        case .session, .prompt, .node: []
        }
    }

    /// One property, computed alone: only an item's label, attributes and type may need a read of the
    /// item (once, while its collection is unlocked); nil when the object has no such property.
    func property(_ name: String, of object: Object) -> DBusValue? {
        switch object {
        case .service:
            return name == "Collections" ? .paths(collections.values.map(\.path).sorted()) : nil
        case .collection(let collection):
            switch name {
            case "Items": return .paths(collection.items.keys.sorted().map { collection.path + "/" + $0 })
            case "Label": return .string(collection.record.label)
            case "Locked": return .bool(collection.locked)
            case "Created": return .uint64(collection.record.created)
            case "Modified": return .uint64(collection.modified)
            default: return nil
            }
        case .item(let collection, let id):
            guard var entry = collection.items[id] else { return nil }
            switch name {
            case "Locked": return .bool(collection.locked)
            case "Created": return .uint64(entry.created)
            case "Modified": return .uint64(entry.modified)
            case "Attributes", "Label", "Type":
                if entry.attributes == nil, !collection.locked, (try? open(collection, id)) != nil, let read = collection.items[id] {
                    entry = read
                }
                return name == "Attributes" ? .stringMap(entry.attributes ?? [:])
                    : .string((name == "Label" ? entry.label : entry.contentType) ?? "")
            default: return nil
            }
        case .session, .prompt, .node:
            return nil
        }
    }

    /// The named properties of `object` (all of them for `GetAll`).
    func properties(_ names: [String], of object: Object) -> [(String, DBusValue)] {
        names.compactMap { name in property(name, of: object).map { (name, $0) } }
    }

    func setProperty(_ name: String, _ value: DBusValue, on object: Object) throws(DBusError) {
        switch (object, name) {
        case (.collection(let collection), "Label"):
            guard case .string(let label) = value else { throw .invalidArgs("Label is a string") }
            try Self.check(collectionLabel: label)
            guard let index = registry.collections.firstIndex(where: { $0.name == collection.name }) else {
                collection.record.label = label
                return
            }
            var new = registry
            new.collections[index].label = label
            new.collections[index].modified = Self.now()
            try commit(new)
            collection.record = registry.collections[index]
            changed(collection, properties: ["Label"])
        case (.item(let collection, let id), "Label"), (.item(let collection, let id), "Attributes"):
            guard !collection.locked else { throw .isLocked("Item \(id) is locked: unlock \(collection.name) first") }
            var item = try open(collection, id)
            if name == "Label" {
                guard case .string(let label) = value else { throw .invalidArgs("Label is a string") }
                item.label = label
            } else {
                guard let map = value.stringDictionary else { throw .invalidArgs("Attributes is an a{ss}") }
                item.attributes = map
            }
            try Self.check(label: item.label, attributes: item.attributes)
            try write(collection, id, item, hashes: hasher.hashes(item.attributes))
            let path = collection.path + "/" + id
            emit(.init(path: collection.path, interface: Self.collectionInterface, member: "ItemChanged", arguments: [.objectPath(path)]))
            propertiesChanged(path, Self.itemInterface, [name])
        case (.service, "Collections"), (.collection, "Items"), (.collection, "Locked"), (.collection, "Created"), (.collection, "Modified"),
             (.item, "Locked"), (.item, "Created"), (.item, "Modified"), (.item, "Type"):
            throw .propertyReadOnly("\(name) is read-only")
        default:
            throw .unknownProperty("No property \(name) here")
        }
    }

    func changed(_ collection: Collection, properties names: [String]) {
        emit(.init(path: Self.base, interface: Self.serviceInterface, member: "CollectionChanged", arguments: [.objectPath(collection.path)]))
        propertiesChanged(collection.path, Self.collectionInterface, names)
    }

    func propertiesChanged(_ path: String, _ interface: String, _ names: [String]) {
        guard let object = try? resolve(path) else { return }
        let changed = properties(names, of: object)
        emit(.init(path: path, interface: Self.propertiesInterface, member: "PropertiesChanged",
                   arguments: [.string(interface), .properties(changed), .array(element: "s", [])]))
    }

    // MARK: - Sessions and secrets

    func session(_ path: String, sender: String) throws(DBusError) -> Session {
        guard let session = sessions[path] else { throw .noSession("No session at \(path): open one with OpenSession") }
        guard session.owner == sender else { throw .noSession("Session \(path) belongs to another connection") }
        return session
    }

    /// A `(oayays)` secret from a client: its bytes in the clear (in locked memory) and its content type.
    func decodeSecret(_ value: DBusValue, sender: String) throws(DBusError) -> (SecureBytes, String) {
        guard case .structure(let fields) = value, fields.count == 4, case .objectPath(let path) = fields[0],
              case .bytes(let parameters) = fields[1], case .bytes(let bytes) = fields[2], case .string(let contentType) = fields[3] else {
            throw .invalidArgs("A secret is (oayays): session, parameters, value, content type")
        }
        guard contentType.utf8.count <= Self.maxFieldBytes else { throw .invalidArgs("A content type is at most \(Self.maxFieldBytes) bytes") }
        let session = try session(path, sender: sender)
        guard let key = session.key else { return (bytes, contentType) }
        return (try SessionCrypto.decrypt(bytes, iv: parameters, key: key), contentType)
    }

    func secretValue(_ secret: SecureBytes, _ contentType: String, _ session: Session, _ path: String) throws(DBusError) -> DBusValue {
        guard let key = session.key else {
            return .structure([.objectPath(path), .bytes(SecureBytes(count: 0)), .bytes(secret), .string(contentType)])
        }
        let (iv, ciphertext) = try SessionCrypto.encrypt(secret, key: key)
        return .structure([.objectPath(path), .bytes(SecureBytes(copying: iv)), .bytes(SecureBytes(copying: ciphertext)), .string(contentType)])
    }

    // MARK: - Helpers

    func nextID() -> String {
        counter += 1
        return String(counter)
    }

    func nextItemID(_ collection: Collection) -> String {
        while true {
            let id = "i" + lowerHex(Sodium.randomBytes(8))
            if collection.items[id] == nil { return id }
        }
    }

    static func isPathElement(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x5F }
    }

    static func now() -> UInt64 { UInt64(Date().timeIntervalSince1970) }

    static func keychainCall<T>(_ body: () throws(KeychainError) -> T) throws(DBusError) -> T {
        do throws(KeychainError) {
            return try body()
        } catch {
            throw dbusError(error)
        }
    }

    /// A keychain error as the client should see it: what a read needs now is `IsLocked`.
    static func dbusError(_ error: KeychainError) -> DBusError {
        switch error.code {
        case .interactionNotAllowed, .userCanceled, .userFallback, .systemCanceled, .authenticationFailed, .lockout, .lockoutPermanent:
            .isLocked("The keychain needs an unlock first: \(error.message)")
        case .invalidArgument: .invalidArgs(error.message)
        default: .failed("\(error.code): \(error.message)")
        }
    }

    /// Waits, on this (the bus's) thread, for keychain work; the work runs on the keychain's engine.
    static func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws(DBusError) -> T {
        let box = ResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        Task.detached {
            do {
                box.result = .success(try await body())
            } catch {
                box.result = .failure((error as? KeychainError) ?? KeychainError(.internal, "\(error)"))
            }
            done.signal()
        }
        done.wait()
        switch box.result! {
        case .success(let value): return value
        case .failure(let error): throw dbusError(error)
        }
    }
}

/// The result of work awaited by `blocking`; written once before the semaphore is signalled.
private final class ResultBox<T>: @unchecked Sendable {
    var result: Result<T, KeychainError>?
}

/// The keychain's prompt texts (`Prompt` inside the provider is the Secret Service's object).
typealias PromptText = Prompt

extension DBusValue {
    var bool: Bool { if case .bool(let value) = self { value } else { false } }
}
