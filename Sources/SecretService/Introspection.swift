/// The interfaces the provider exports (the Secret Service API 0.2): the one table both the
/// signature check and `Introspect` read, so what a call must carry and what we announce cannot differ.
enum Introspection {
    struct Method {
        var name: String
        var arguments: [(name: String, type: String, out: Bool)]
        var input: String { arguments.filter { !$0.out }.map(\.type).joined() }
    }

    struct Interface {
        var name: String
        var methods: [Method]
        var properties: [(name: String, type: String, writable: Bool)] = []
        var signals: [(name: String, arguments: [(String, String)])] = []
    }

    static func method(_ name: String, _ arguments: (String, String, Bool)...) -> Method {
        Method(name: name, arguments: arguments.map { (name: $0.0, type: $0.1, out: $0.2) })
    }

    static let interfaces: [String: Interface] = {
        let all = [
            Interface(name: SecretServiceProvider.serviceInterface, methods: [
                method("OpenSession", ("algorithm", "s", false), ("input", "v", false), ("output", "v", true), ("result", "o", true)),
                method("CreateCollection", ("properties", "a{sv}", false), ("alias", "s", false), ("collection", "o", true), ("prompt", "o", true)),
                method("SearchItems", ("attributes", "a{ss}", false), ("unlocked", "ao", true), ("locked", "ao", true)),
                method("Unlock", ("objects", "ao", false), ("unlocked", "ao", true), ("prompt", "o", true)),
                method("Lock", ("objects", "ao", false), ("locked", "ao", true), ("Prompt", "o", true)),
                method("GetSecrets", ("items", "ao", false), ("session", "o", false), ("secrets", "a{o(oayays)}", true)),
                method("ReadAlias", ("name", "s", false), ("collection", "o", true)),
                method("SetAlias", ("name", "s", false), ("collection", "o", false)),
            ], properties: [("Collections", "ao", false)],
            signals: [("CollectionCreated", [("collection", "o")]), ("CollectionDeleted", [("collection", "o")]),
                      ("CollectionChanged", [("collection", "o")])]),
            Interface(name: SecretServiceProvider.collectionInterface, methods: [
                method("Delete", ("prompt", "o", true)),
                method("SearchItems", ("attributes", "a{ss}", false), ("results", "ao", true)),
                method("CreateItem", ("properties", "a{sv}", false), ("secret", "(oayays)", false), ("replace", "b", false),
                       ("item", "o", true), ("prompt", "o", true)),
            ], properties: [("Items", "ao", false), ("Label", "s", true), ("Locked", "b", false), ("Created", "t", false), ("Modified", "t", false)],
            signals: [("ItemCreated", [("item", "o")]), ("ItemDeleted", [("item", "o")]), ("ItemChanged", [("item", "o")])]),
            Interface(name: SecretServiceProvider.itemInterface, methods: [
                method("Delete", ("Prompt", "o", true)),
                method("GetSecret", ("session", "o", false), ("secret", "(oayays)", true)),
                method("SetSecret", ("secret", "(oayays)", false)),
            ], properties: [("Locked", "b", false), ("Attributes", "a{ss}", true), ("Label", "s", true), ("Type", "s", false),
                            ("Created", "t", false), ("Modified", "t", false)]),
            Interface(name: SecretServiceProvider.sessionInterface, methods: [method("Close")]),
            Interface(name: SecretServiceProvider.promptInterface, methods: [
                method("Prompt", ("window-id", "s", false)),
                method("Dismiss"),
            ], signals: [("Completed", [("dismissed", "b"), ("result", "v")])]),
            Interface(name: SecretServiceProvider.propertiesInterface, methods: [
                method("Get", ("interface", "s", false), ("property", "s", false), ("value", "v", true)),
                method("GetAll", ("interface", "s", false), ("properties", "a{sv}", true)),
                method("Set", ("interface", "s", false), ("property", "s", false), ("value", "v", false)),
            ], signals: [("PropertiesChanged", [("interface", "s"), ("changed_properties", "a{sv}"), ("invalidated_properties", "as")])]),
            Interface(name: SecretServiceProvider.introspectableInterface, methods: [method("Introspect", ("xml_data", "s", true))]),
        ]
        return Dictionary(uniqueKeysWithValues: all.map { ($0.name, $0) })
    }()

    /// The input signature of `member` in `interface`; nil when it has no such method.
    static func signature(of member: String, in interface: String) -> String? {
        interfaces[interface]?.methods.first { $0.name == member }?.input
    }

    /// The object's own Secret Service interface ("" for a node).
    static func interface(of object: SecretServiceProvider.Object) -> String {
        switch object {
        case .service: SecretServiceProvider.serviceInterface
        case .collection: SecretServiceProvider.collectionInterface
        case .item: SecretServiceProvider.itemInterface
        case .session: SecretServiceProvider.sessionInterface
        case .prompt: SecretServiceProvider.promptInterface
        case .node: ""
        }
    }

    /// For a call without an interface: the first of the object's interfaces with that member.
    static func interfaceDeclaring(_ member: String, for object: SecretServiceProvider.Object) -> String? {
        [interface(of: object), SecretServiceProvider.propertiesInterface, SecretServiceProvider.introspectableInterface]
            .first { signature(of: member, in: $0) != nil }
    }

    static func xml(for object: SecretServiceProvider.Object) -> String {
        var names = [SecretServiceProvider.introspectableInterface]
        var children: [String] = []
        switch object {
        case .node(let list):
            children = list
        case .service:
            names += [SecretServiceProvider.propertiesInterface, SecretServiceProvider.serviceInterface]
            children = ["collection", "aliases", "session", "prompt"]
        case .collection(let collection):
            names += [SecretServiceProvider.propertiesInterface, SecretServiceProvider.collectionInterface]
            children = collection.items.keys.sorted()
        default:
            names += [SecretServiceProvider.propertiesInterface, interface(of: object)]
        }
        var out = "<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n"
            + " \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n<node>\n"
        for name in names {
            guard let interface = interfaces[name] else { continue }
            out += " <interface name=\"\(name)\">\n"
            for method in interface.methods {
                out += "  <method name=\"\(method.name)\">\n"
                for argument in method.arguments {
                    out += "   <arg name=\"\(argument.name)\" type=\"\(argument.type)\" direction=\"\(argument.out ? "out" : "in")\"/>\n"
                }
                out += "  </method>\n"
            }
            for property in interface.properties {
                out += "  <property name=\"\(property.name)\" type=\"\(property.type)\" access=\"\(property.writable ? "readwrite" : "read")\"/>\n"
            }
            for signal in interface.signals {
                out += "  <signal name=\"\(signal.name)\">\n"
                for (argument, type) in signal.arguments { out += "   <arg name=\"\(argument)\" type=\"\(type)\"/>\n" }
                out += "  </signal>\n"
            }
            out += " </interface>\n"
        }
        for child in children { out += " <node name=\"\(child)\"/>\n" }
        return out + "</node>\n"
    }
}
