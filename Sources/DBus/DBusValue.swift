import SecureMemory

/// One D-Bus value, as the Secret Service's calls carry them: the protocol logic reads and writes these,
/// never an sd-bus message, so it is tested without a bus.
///
/// `ay` is always `.bytes`, in a `SecureBytes`: a secret, its IV and a session's public key travel as `ay`.
public indirect enum DBusValue: Sendable {
    case byte(UInt8)
    case bool(Bool)
    case int32(Int32)
    case uint32(UInt32)
    case int64(Int64)
    case uint64(UInt64)
    case double(Double)
    case string(String)
    case objectPath(String)
    case signature(String)
    case bytes(SecureBytes)
    /// An array of anything but bytes; `element` is its element's signature (needed when it is empty).
    case array(element: String, [DBusValue])
    case dictEntry(DBusValue, DBusValue)
    case structure([DBusValue])
    case variant(DBusValue)

    /// The value's own signature.
    public var signature: String {
        switch self {
        case .byte: "y"
        case .bool: "b"
        case .int32: "i"
        case .uint32: "u"
        case .int64: "x"
        case .uint64: "t"
        case .double: "d"
        case .string: "s"
        case .objectPath: "o"
        case .signature: "g"
        case .bytes: "ay"
        case .array(let element, _): "a" + element
        case .dictEntry(let key, let value): "{" + key.signature + value.signature + "}"
        case .structure(let fields): "(" + fields.map(\.signature).joined() + ")"
        case .variant: "v"
        }
    }

    /// `a{ss}`.
    public static func stringMap(_ map: [String: String]) -> DBusValue {
        .array(element: "{ss}", map.sorted { $0.key < $1.key }.map { .dictEntry(.string($0.key), .string($0.value)) })
    }

    /// `a{sv}`.
    public static func properties(_ map: [(String, DBusValue)]) -> DBusValue {
        .array(element: "{sv}", map.map { .dictEntry(.string($0.0), .variant($0.1)) })
    }

    /// `ao`.
    public static func paths(_ paths: [String]) -> DBusValue {
        .array(element: "o", paths.map { .objectPath($0) })
    }

    public var string: String? {
        switch self {
        case .string(let text), .objectPath(let text), .signature(let text): text
        default: nil
        }
    }

    public var variantContent: DBusValue? { if case .variant(let inner) = self { inner } else { nil } }

    /// The entries of an `a{s…}` dictionary, in order.
    public var entries: [(String, DBusValue)]? {
        guard case .array(_, let elements) = self else { return nil }
        var result: [(String, DBusValue)] = []
        for element in elements {
            guard case .dictEntry(.string(let key), let value) = element else { return nil }
            result.append((key, value))
        }
        return result
    }

    /// An `a{ss}` as a dictionary; nil for any other shape.
    public var stringDictionary: [String: String]? {
        guard case .array("{ss}", _) = self, let entries else { return nil }
        var map: [String: String] = [:]
        for (key, value) in entries {
            guard case .string(let text) = value else { return nil }
            map[key] = text
        }
        return map
    }

    /// An `ao` as paths.
    public var pathList: [String]? {
        guard case .array("o", let elements) = self else { return nil }
        return elements.compactMap { if case .objectPath(let path) = $0 { path } else { nil } }
    }
}

/// A method call, decoded: who sent it, to what, and its arguments.
public struct DBusCall: Sendable {
    public var sender: String
    public var path: String
    /// Empty when the caller gave none (the spec allows it; members are then looked up by name).
    public var interface: String
    public var member: String
    public var signature: String
    public var arguments: [DBusValue]

    public init(sender: String, path: String, interface: String, member: String, signature: String, arguments: [DBusValue]) {
        self.sender = sender
        self.path = path
        self.interface = interface
        self.member = member
        self.signature = signature
        self.arguments = arguments
    }
}

/// A D-Bus error: its name and a message for the person reading the client's output.
public struct DBusError: Error, Sendable, Equatable {
    public var name: String
    public var message: String

    public init(_ name: String, _ message: String) {
        self.name = name
        self.message = message
    }

    public static func == (lhs: DBusError, rhs: DBusError) -> Bool { lhs.name == rhs.name }

    public static func invalidArgs(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.InvalidArgs", message) }
    public static func unknownMethod(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.UnknownMethod", message) }
    public static func unknownObject(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.UnknownObject", message) }
    public static func unknownProperty(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.UnknownProperty", message) }
    public static func propertyReadOnly(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.PropertyReadOnly", message) }
    public static func notSupported(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.NotSupported", message) }
    public static func failed(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.Failed", message) }
    public static func accessDenied(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.AccessDenied", message) }
    /// A count or a total a caller would take past its bound (the name is the D-Bus standard's).
    public static func limitsExceeded(_ message: String) -> DBusError { .init("org.freedesktop.DBus.Error.LimitsExceeded", message) }
    public static func isLocked(_ message: String) -> DBusError { .init("org.freedesktop.Secret.Error.IsLocked", message) }
    public static func noSession(_ message: String) -> DBusError { .init("org.freedesktop.Secret.Error.NoSession", message) }
    public static func noSuchObject(_ message: String) -> DBusError { .init("org.freedesktop.Secret.Error.NoSuchObject", message) }
}

/// A signal to emit.
public struct DBusSignal: Sendable {
    public var path: String
    public var interface: String
    public var member: String
    public var arguments: [DBusValue]
    /// The one connection it goes to (a unique name); nil: every connection that listens.
    public var destination: String?

    public init(path: String, interface: String, member: String, arguments: [DBusValue], destination: String? = nil) {
        self.path = path
        self.interface = interface
        self.member = member
        self.arguments = arguments
        self.destination = destination
    }
}
