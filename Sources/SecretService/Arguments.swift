import Keychain

/// A call's arguments, read in order as the types its method declares: every method's arguments are
/// decoded into a typed value (`ServiceMethod`, `ItemMethod`, …) before anything runs. A value of
/// another shape is `InvalidArgs` naming the argument, never a crash: the bus checks the signature
/// first (`Introspection`), and this holds for a call made any other way too.
struct Arguments {
    private let call: DBusCall
    private var next = 0

    init(_ call: DBusCall) { self.call = call }

    private mutating func take(_ name: String) throws(DBusError) -> DBusValue {
        guard next < call.arguments.count else {
            throw .invalidArgs("\(call.member) takes its argument '\(name)', which the call does not carry")
        }
        defer { next += 1 }
        return call.arguments[next]
    }

    private func mismatch(_ name: String, _ type: String, _ value: DBusValue) -> DBusError {
        .invalidArgs("\(call.member)'s argument '\(name)' is \(type), got (\(value.signature))")
    }

    /// The next argument as `read` finds it; `InvalidArgs` saying it is not `expected` when `read` finds nothing.
    private mutating func take<T>(
        _ name: String, as expected: String, _ read: (DBusValue) -> T?
    ) throws(DBusError) -> T {
        let value = try take(name)
        guard let found = read(value) else { throw mismatch(name, expected, value) }
        return found
    }

    /// `s`.
    mutating func string(_ name: String) throws(DBusError) -> String {
        try take(name, as: "a string (s)") { if case .string(let text) = $0 { text } else { nil } }
    }

    /// `o`.
    mutating func objectPath(_ name: String) throws(DBusError) -> String {
        try take(name, as: "an object path (o)") { if case .objectPath(let path) = $0 { path } else { nil } }
    }

    /// `b`.
    mutating func bool(_ name: String) throws(DBusError) -> Bool {
        try take(name, as: "a boolean (b)") { if case .bool(let flag) = $0 { flag } else { nil } }
    }

    /// `v`: its content.
    mutating func variant(_ name: String) throws(DBusError) -> DBusValue {
        try take(name, as: "a variant (v)") { if case .variant(let inner) = $0 { inner } else { nil } }
    }

    /// `ao`.
    mutating func paths(_ name: String) throws(DBusError) -> [String] {
        try take(name, as: "a list of object paths (ao)") { value in
            guard case .array("o", let elements) = value else { return nil }
            let paths = elements.compactMap { if case .objectPath(let path) = $0 { path } else { nil } }
            return paths.count == elements.count ? paths : nil
        }
    }

    /// `a{ss}`.
    mutating func stringMap(_ name: String) throws(DBusError) -> [String: String] {
        try take(name, as: "a string map (a{ss})") { $0.stringDictionary }
    }

    /// `a{sv}`: each property's name and the content of its variant, in order.
    mutating func properties(_ name: String) throws(DBusError) -> [(String, DBusValue)] {
        try take(name, as: "a property map (a{sv})") { value in
            guard let entries = value.entries else { return nil }
            let properties = entries.compactMap { key, entry in if case .variant(let inner) = entry { (key, inner) } else { nil } }
            return properties.count == entries.count ? properties : nil
        }
    }

    /// `(oayays)`: a secret as a client sends it.
    mutating func secret(_ name: String) throws(DBusError) -> ClientSecret {
        guard case .structure(let fields) = try take(name), fields.count == 4, case .objectPath(let session) = fields[0],
              case .bytes(let parameters) = fields[1], case .bytes(let value) = fields[2], case .string(let contentType) = fields[3] else {
            throw .invalidArgs("A secret is (oayays): session, parameters, value, content type")
        }
        return ClientSecret(session: session, parameters: parameters, value: value, contentType: contentType)
    }
}

/// A secret as a client sends it (`(oayays)`): still encrypted with its session's key, when it has one.
struct ClientSecret {
    var session: String
    var parameters: SecureBytes
    var value: SecureBytes
    var contentType: String
}
