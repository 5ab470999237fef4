/// `org.freedesktop.DBus.Properties`' methods, their arguments decoded.
enum PropertiesMethod {
    case get(interface: String, name: String)
    case getAll(interface: String)
    case set(interface: String, name: String, value: DBusValue)

    init(_ call: DBusCall) throws(DBusError) {
        var a = Arguments(call)
        switch call.member {
        case "Get": self = .get(interface: try a.string("interface_name"), name: try a.string("property_name"))
        case "GetAll": self = .getAll(interface: try a.string("interface_name"))
        case "Set": self = .set(interface: try a.string("interface_name"), name: try a.string("property_name"), value: try a.variant("value"))
        default: throw .unknownMethod("No method \(call.member) on \(SecretServiceProvider.propertiesInterface)")
        }
    }
}

extension SecretServiceProvider {
    /// A properties call on `object`, whose own interface is `own`.
    func propertiesCall(_ method: PropertiesMethod, on object: Object, own: String, path: String) throws(DBusError) -> Bus.DBusAnswer {
        switch method {
        case .get(let interface, let name):
            guard interface.isEmpty || interface == own else { throw .unknownProperty("\(path) has no interface \(interface)") }
            guard let before = property(name, of: object) else { throw .unknownProperty("\(own) has no property \(name)") }
            return try afterDetails(of: object, ["Attributes", "Label", "Type"].contains(name)) { [self] in
                .reply([.variant(property(name, of: object) ?? before)])
            }
        case .getAll(let interface):
            guard interface.isEmpty || interface == own else { return .reply([.properties([])]) }
            let names = Self.propertyNames(of: object), before = properties(names, of: object)
            return try afterDetails(of: object, true) { [self] in
                let after = properties(names, of: object)
                return .reply([.properties(after.isEmpty ? before : after)])
            }
        case .set(let interface, let name, let value):
            guard interface.isEmpty || interface == own else { throw .unknownProperty("\(path) has no interface \(interface)") }
            return try setProperty(name, value, on: object)
        }
    }

    /// `next`'s answer, after an item's label, attributes and type were read when `wanted` and they
    /// can be (`readingDetails`).
    private func afterDetails(of object: Object, _ wanted: Bool,
                              _ next: @escaping () throws(DBusError) -> Bus.DBusAnswer) throws(DBusError) -> Bus.DBusAnswer {
        guard wanted, case .item(let collection, let id) = object else { return try next() }
        return try readingDetails(collection, id, next)
    }

    /// An object's properties, in `GetAll`'s order.
    static func propertyNames(of object: Object) -> [String] {
        switch object {
        case .service: ["Collections"]
        case .collection: CollectionObject.propertyNames
        case .item: ItemObject.propertyNames
        case .session, .prompt, .node: []
        }
    }

    /// One property, computed alone; nil when the object has no such property.
    func property(_ name: String, of object: Object) -> DBusValue? {
        switch object {
        case .service: name == "Collections" ? .paths(collections.values.map(\.path).sorted()) : nil
        case .collection(let collection): CollectionObject(provider: self, collection: collection).property(name)
        case .item(let collection, let id): ItemObject(provider: self, collection: collection, id: id).property(name)
        case .session, .prompt, .node: nil
        }
    }

    /// The named properties of `object` (all of them for `GetAll`).
    func properties(_ names: [String], of object: Object) -> [(String, DBusValue)] {
        names.compactMap { name in property(name, of: object).map { (name, $0) } }
    }

    func setProperty(_ name: String, _ value: DBusValue, on object: Object) throws(DBusError) -> Bus.DBusAnswer {
        switch object {
        case .collection(let collection):
            try CollectionObject(provider: self, collection: collection).set(name, value)
            return .reply([])
        case .item(let collection, let id): return try ItemObject(provider: self, collection: collection, id: id).set(name, value)
        case .service where name == "Collections": throw .propertyReadOnly("\(name) is read-only")
        case .service, .session, .prompt, .node: throw .unknownProperty("No property \(name) here")
        }
    }
}
