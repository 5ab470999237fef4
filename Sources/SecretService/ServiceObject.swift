import Keychain

/// `org.freedesktop.Secret.Service`'s methods, their arguments decoded.
enum ServiceMethod {
    case openSession(algorithm: String, input: DBusValue)
    case createCollection(properties: [(String, DBusValue)], alias: String)
    case searchItems(attributes: [String: String])
    case unlock(objects: [String])
    case lock(objects: [String])
    case getSecrets(items: [String], session: String)
    case readAlias(name: String)
    case setAlias(name: String, collection: String)

    init(_ call: DBusCall) throws(DBusError) {
        var a = Arguments(call)
        switch call.member {
        case "OpenSession": self = .openSession(algorithm: try a.string("algorithm"), input: try a.variant("input"))
        case "CreateCollection": self = .createCollection(properties: try a.properties("properties"), alias: try a.string("alias"))
        case "SearchItems": self = .searchItems(attributes: try a.stringMap("attributes"))
        case "Unlock": self = .unlock(objects: try a.paths("objects"))
        case "Lock": self = .lock(objects: try a.paths("objects"))
        case "GetSecrets": self = .getSecrets(items: try a.paths("items"), session: try a.objectPath("session"))
        case "ReadAlias": self = .readAlias(name: try a.string("name"))
        case "SetAlias": self = .setAlias(name: try a.string("name"), collection: try a.objectPath("collection"))
        default: throw .unknownMethod("No method \(call.member) on the service")
        }
    }
}

/// The Service (`/org/freedesktop/secrets`).
struct ServiceObject {
    let provider: SecretServiceProvider

    func call(_ method: ServiceMethod, from sender: String) throws(DBusError) -> Bus.DBusAnswer {
        switch method {
        case .openSession(let algorithm, let input):
            return try provider.openSession(algorithm: algorithm, input: input, owner: sender)
        case .createCollection(let properties, let alias):
            return .reply([.objectPath(try provider.createCollection(properties, alias: alias)), .objectPath("/")])
        case .searchItems(let query):
            var unlocked: [String] = []
            var locked: [String] = []
            for collection in provider.collections.values.sorted(by: { $0.name < $1.name }) {
                let found = provider.search(collection, query)
                if collection.locked { locked += found } else { unlocked += found }
            }
            return .reply([.paths(unlocked), .paths(locked)])
        case .unlock(let paths):
            return try provider.unlock(paths, sender: sender)
        case .lock(let paths):
            return .reply([.paths(try lock(paths)), .objectPath("/")])
        case .getSecrets(let paths, let sessionPath):
            return try getSecrets(paths, sessionPath, sender: sender)
        case .readAlias(let alias):
            guard let name = provider.collectionName(alias: alias), let collection = provider.collections[name] else {
                return .reply([.objectPath("/")])
            }
            return .reply([.objectPath(collection.path)])
        case .setAlias(let alias, let target):
            try setAlias(alias, target)
            return .reply([])
        }
    }

    /// Locks the collections of `paths` (an item's path locks its collection); the paths it locked.
    private func lock(_ paths: [String]) throws(DBusError) -> [String] {
        var done: [String] = []
        for path in paths {
            guard let collection = try? provider.owningCollection(path) else { continue }
            collection.locks += 1
            // The keychain's window ends too: its next read asks, in this process and any other.
            if collection.record.accessControl != .none, let storage = collection.storage {
                try SecretServiceProvider.blocking { try await storage.endAuthenticationWindow() }
            }
            if !collection.locked {
                collection.locked = true
                provider.changed(collection, properties: ["Locked"])
            }
            done.append(path)
        }
        return done
    }

    /// The secrets of the unlocked items among `paths` (others are left out): warm reads at once,
    /// cold ones off the bus thread, one batch read per collection (through keychaind one exchange).
    private func getSecrets(_ paths: [String], _ sessionPath: String, sender: String) throws(DBusError) -> Bus.DBusAnswer {
        _ = try provider.session(sessionPath, sender: sender)
        var wanted: [(path: String, collection: SecretServiceProvider.Collection, id: String)] = []
        for path in paths {
            guard case .item(let collection, let id)? = try? provider.resolve(path), !collection.locked else { continue }
            wanted.append((path, collection, id))
        }
        return provider.reading(wanted.map { ($0.collection, $0.id) }) { [provider] outcomes throws(DBusError) in
            // Checked again: the client may have closed its session while the reads ran.
            let session = try provider.session(sessionPath, sender: sender)
            var entries: [DBusValue] = []
            for (item, outcome) in zip(wanted, outcomes) {
                guard case .success(let read) = outcome else { continue }
                entries.append(.dictEntry(.objectPath(item.path), try provider.secretValue(read.secret, read.contentType, session, sessionPath)))
            }
            return .init([.array(element: "{o(oayays)}", entries)], sensitive: true)
        }
    }

    private func setAlias(_ alias: String, _ target: String) throws(DBusError) {
        guard alias != SecretServiceProvider.sessionAlias else {
            throw .invalidArgs("The alias 'session' always names the in-memory session collection: it cannot be moved or removed")
        }
        var new = provider.registry
        if target == "/" {
            // An alias made before the bounds is removed whatever its length.
            guard new.aliases.removeValue(forKey: alias) != nil else {
                try SecretServiceProvider.check(alias: alias)
                return
            }
        } else {
            try SecretServiceProvider.check(alias: alias)
            guard case .collection(let collection) = try provider.resolve(target) else { throw .noSuchObject("No collection at \(target)") }
            guard collection.storage != nil else { throw .invalidArgs("The session collection lives in memory only: it cannot have an alias") }
            try provider.checkRoom(forAlias: alias)
            new.aliases[alias] = collection.name
        }
        try provider.commit(new)
    }
}

extension SecretServiceProvider {
    /// `CreateCollection`: the collection's path (an existing one when `alias` names it).
    func createCollection(_ properties: [(String, DBusValue)], alias: String) throws(DBusError) -> String {
        if !alias.isEmpty { try Self.check(alias: alias) }
        if !alias.isEmpty, let name = collectionName(alias: alias), let existing = collections[name] { return existing.path }
        guard registry.collections.count < Self.maxCollections else {
            throw .limitsExceeded("There are \(registry.collections.count) collections, the most the provider keeps: delete one first")
        }
        if !alias.isEmpty { try checkRoom(forAlias: alias) }
        let (label, options) = try Self.collectionOptions(properties)
        let name = newCollectionName(label)
        var validated = options
        validated.service = service(of: name)
        do throws(KeychainError) {
            _ = try validated.validated()
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
        let path = Self.collectionPrefix + name
        emit(.init(path: Self.base, interface: Self.serviceInterface, member: "CollectionCreated", arguments: [.objectPath(path)]))
        propertiesChanged(Self.base, Self.serviceInterface, ["Collections"])
        return path
    }

    /// A new collection's label and keychain protection, from `CreateCollection`'s properties.
    static func collectionOptions(_ properties: [(String, DBusValue)]) throws(DBusError) -> (String, KeychainOptions) {
        var label = ""
        var options = KeychainOptions(accessible: .afterFirstUnlock, accessControl: .none)
        for (name, value) in properties {
            switch name {
            case "org.freedesktop.Secret.Collection.Label", "Label":
                guard case .string(let text) = value else { throw .invalidArgs("\(name) is a string") }
                label = text
            case accessibleProperty:
                guard case .string(let text) = value, let accessible = Accessible(rawValue: text) else {
                    throw .invalidArgs("\(name) is one of \(Accessible.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                options.accessible = accessible
            case accessControlProperty:
                guard case .string(let text) = value, let accessControl = AccessControl(rawValue: text) else {
                    throw .invalidArgs("\(name) is one of \(AccessControl.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                options.accessControl = accessControl
            case authValidityProperty:
                guard case .uint32(let seconds) = value, seconds <= 86_400 else { throw .invalidArgs("\(name) is a uint32 of seconds, at most 86400") }
                options.authValidity = Int(seconds)
            default:
                continue  // Other providers' properties are ignored, as the spec's extensibility asks.
            }
        }
        try check(collectionLabel: label)
        return (label, options)
    }

    /// A collection's name from its label (its letters and digits), made unique.
    private func newCollectionName(_ label: String) -> String {
        var name = String(label.lowercased().prefix(Self.maxCollectionNameLength).map { $0.isASCII && ($0.isLetter || $0.isNumber) ? $0 : "_" })
        if name.isEmpty { name = "collection" }
        let stem = name
        var n = 1
        while collections[name] != nil || name == "session" {
            n += 1
            name = stem + String(n)
        }
        return name
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

    /// `Unlock`: what is unlocked now, and a prompt for the collections that need a person's answer.
    func unlock(_ paths: [String], sender: String) throws(DBusError) -> Bus.DBusAnswer {
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
        guard !needPrompt.isEmpty else { return .reply([.paths(unlocked), .objectPath("/")]) }
        let path = Self.promptPrefix + nextID()
        prompts[path] = Prompt(owner: sender, collections: needPrompt)
        return .reply([.paths(unlocked), .objectPath(path)])
    }
}
