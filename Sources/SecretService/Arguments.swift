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

    /// `s`.
    mutating func string(_ name: String) throws(DBusError) -> String {
        let value = try take(name)
        guard case .string(let text) = value else { throw mismatch(name, "a string (s)", value) }
        return text
    }

    /// `o`.
    mutating func objectPath(_ name: String) throws(DBusError) -> String {
        let value = try take(name)
        guard case .objectPath(let path) = value else { throw mismatch(name, "an object path (o)", value) }
        return path
    }

    /// `b`.
    mutating func bool(_ name: String) throws(DBusError) -> Bool {
        let value = try take(name)
        guard case .bool(let flag) = value else { throw mismatch(name, "a boolean (b)", value) }
        return flag
    }

    /// `v`: its content.
    mutating func variant(_ name: String) throws(DBusError) -> DBusValue {
        let value = try take(name)
        guard case .variant(let inner) = value else { throw mismatch(name, "a variant (v)", value) }
        return inner
    }

    /// `ao`.
    mutating func paths(_ name: String) throws(DBusError) -> [String] {
        let value = try take(name)
        guard case .array("o", let elements) = value else { throw mismatch(name, "a list of object paths (ao)", value) }
        var paths: [String] = []
        for element in elements {
            guard case .objectPath(let path) = element else { throw mismatch(name, "a list of object paths (ao)", value) }
            paths.append(path)
        }
        return paths
    }

    /// `a{ss}`.
    mutating func stringMap(_ name: String) throws(DBusError) -> [String: String] {
        let value = try take(name)
        guard let map = value.stringDictionary else { throw mismatch(name, "a string map (a{ss})", value) }
        return map
    }

    /// `a{sv}`: each property's name and the content of its variant, in order.
    mutating func properties(_ name: String) throws(DBusError) -> [(String, DBusValue)] {
        let value = try take(name)
        guard let entries = value.entries else { throw mismatch(name, "a property map (a{sv})", value) }
        var properties: [(String, DBusValue)] = []
        for (key, entry) in entries {
            guard case .variant(let inner) = entry else { throw mismatch(name, "a property map (a{sv})", value) }
            properties.append((key, inner))
        }
        return properties
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
