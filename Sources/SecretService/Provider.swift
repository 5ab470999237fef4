import FoundationEssentials
import Dispatch
import Keychain
import KeychainCLIText

/// The Secret Service (org.freedesktop.secrets) over the keychain: a collection is a keychain storage
/// (service `org.freedesktop.secrets/<name>`), an item a keychain item of it (docs/secret-service.md).
///
/// Each D-Bus object is a type of its own (`ServiceObject`, `CollectionObject`, `ItemObject`,
/// `SessionObject`, `PromptObject`) whose methods are decoded into a typed value before they run;
/// this class holds their state and routes each call. Used from one thread, the bus's: a warm read
/// is answered there, and a cold one (a TPM command, keychaind, a prompt), an item's write too, runs
/// off the bus thread and finishes through `post`, so other clients are served meanwhile, in the
/// order `Turns` keeps. The registry's changes still wait for the keychain on the bus thread (a
/// thread of its own, never Swift's shared pool).
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
    /// The host's records (its collections, their aliases, the attribute key) live under this service;
    /// an application's under `org.freedesktop.secrets@KIND:NAME` (`ApplicationProviders`).
    public static let metaService = "org.freedesktop.secrets"
    /// The service of this provider's records: `metaService`, or an application's.
    let namespace: String
    /// A collection's items live under `NAMESPACE/<name>`.
    func service(of name: String) -> String { namespace + "/" + name }

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
    /// Calls that wait for an earlier one (`Turns`).
    let turns = TurnTaking()
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

    /// Opens (and the first time makes) the provider's records in the keychain of `configuration`,
    /// under `namespace` (the host's: `metaService`).
    public init(configuration: KeychainConfiguration, namespace: String = metaService) throws(DBusError) {
        self.configuration = configuration
        self.namespace = namespace
        meta = try Self.keychainCall { () throws(KeychainError) in
            try createKeychain(.init(service: namespace), configuration: configuration)
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
    func load(_ record: CollectionRecord) throws(DBusError) {
        let options = KeychainOptions(service: service(of: record.name), accessible: record.accessible,
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
    func commit(_ new: Registry) throws(DBusError) {
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

    /// Answers one call: at once, or later for one that waits for the keychain or for the client's
    /// earlier call (`ordered`); every failure is a D-Bus error.
    public func handle(_ call: DBusCall) -> Bus.DBusAnswer { ordered(call) }

    /// The answer to one call, now that it is its turn.
    func answer(_ call: DBusCall) -> Bus.DBusAnswer {
        do throws(DBusError) {
            return try route(call)
        } catch {
            return .now(.failure(error))
        }
    }

    /// A client left the bus: its sessions (and their keys) and its prompts go with it.
    public func clientVanished(_ name: String) {
        sessions = sessions.filter { $0.value.owner != name }
        for prompt in prompts.values where prompt.owner == name { prompt.asking?.cancel() }
        prompts = prompts.filter { $0.value.owner != name }
    }

    /// Whether a provider opened again from the store would be this one: no session, prompt or call in
    /// flight, no item in the session collection (memory only), each collection locked as it opens.
    var holdsNothingInMemory: Bool {
        sessions.isEmpty && prompts.isEmpty && turns.isIdle && collections.values.allSatisfy { collection in
            (collection.storage != nil || collection.items.entries.isEmpty) && collection.locked == (collection.record.accessControl != .none)
        }
    }

    /// What a path names.
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
            let first = rest.first.map(String.init) ?? ""
            let name = isAlias ? collectionName(alias: first) : first
            guard let name, let collection = collections[name], rest.count <= 2 else {
                throw .noSuchObject("No collection at \(path)")
            }
            guard rest.count == 2 else { return .collection(collection) }
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

    func route(_ call: DBusCall) throws(DBusError) -> Bus.DBusAnswer {
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
        switch interface {
        case Self.introspectableInterface: return .reply([.string(Introspection.xml(for: object))])
        case Self.propertiesInterface: return try propertiesCall(PropertiesMethod(call), on: object, own: own, path: call.path)
        default: break
        }
        switch object {
        case .service: return try ServiceObject(provider: self).call(ServiceMethod(call), from: call.sender)
        case .collection(let collection): return try CollectionObject(provider: self, collection: collection).call(CollectionMethod(call), from: call.sender)
        case .item(let collection, let id): return try ItemObject(provider: self, collection: collection, id: id).call(ItemMethod(call), from: call.sender)
        case .session(let path): return try SessionObject(provider: self, path: path).call(SessionMethod(call))
        case .prompt(let path): return try PromptObject(provider: self, path: path).call(PromptMethod(call))
        case .node: throw .unknownMethod("No method \(call.member) at \(call.path)")
        }
    }

    // MARK: - Signals

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

    /// The collection an alias names: `session` the in-memory one, any other as the registry says.
    func collectionName(alias: String) -> String? {
        alias == Self.sessionAlias ? "session" : registry.aliases[alias]
    }

    /// The collection of a collection's or an item's path.
    func owningCollection(_ path: String) throws(DBusError) -> Collection {
        switch try resolve(path) {
        case .collection(let collection), .item(let collection, _): return collection
        default: throw .noSuchObject("\(path) is not a collection or an item")
        }
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

    /// Waits, on this (the bus's) thread, for keychain work; the work runs on the keychain's engine
    /// (through `waitFor`, the one sync-over-async bridge).
    static func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws(DBusError) -> T {
        do throws(KeychainError) {
            return try waitFor { () async throws(KeychainError) -> T in
                do { return try await body() } catch { throw (error as? KeychainError) ?? KeychainError(.internal, "\(error)") }
            }
        } catch {
            throw dbusError(error)
        }
    }
}

/// The keychain's prompt texts (`Prompt` inside the provider is the Secret Service's object).
typealias PromptText = Prompt

extension DBusValue {
    var bool: Bool { if case .bool(let value) = self { value } else { false } }
}

extension Bus.DBusAnswer {
    /// A reply now.
    static func reply(_ arguments: [DBusValue], sensitive: Bool = false) -> Self { .now(.success(.init(arguments, sensitive: sensitive))) }
}
