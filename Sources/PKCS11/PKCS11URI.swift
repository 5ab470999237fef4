import KeychainBasics
import SecureMemory

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An RFC 7512 PKCS#11 URI: which module to load, which token (and object) to use, where the PIN is.
///
/// `pkcs11:token=Keychain;serial=1234?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin`
///
/// Values are percent-decoded. An unknown path attribute is an error, since it would narrow the match
/// in a way we can't apply; an unknown query attribute is ignored and may repeat, as RFC 7512 §2.3
/// allows for vendor-specific ones. A path attribute in the query (or a query attribute in the path)
/// is an error: read as a vendor attribute it would be ignored, and the URI would match any token.
public struct PKCS11URI: Sendable, Equatable, CustomStringConvertible {
    /// The `type` path attribute: the class of the object the URI names.
    public enum ObjectType: String, Sendable, CaseIterable {
        case certificate = "cert"
        case data
        case privateKey = "private"
        case publicKey = "public"
        case secretKey = "secret-key"
    }

    /// `library-version`: "M" or "M.m" (a missing minor is 0).
    public struct Version: Hashable, Sendable, CustomStringConvertible {
        public var major: UInt8
        public var minor: UInt8
        public init(major: UInt8, minor: UInt8 = 0) { self.major = major; self.minor = minor }
        public var description: String { "\(major).\(minor)" }
    }

    // The token: CK_TOKEN_INFO.
    public var token: String?
    public var manufacturer: String?
    public var model: String?
    public var serial: String?
    // The slot: CK_SLOT_INFO and CK_SLOT_ID.
    public var slotDescription: String?
    public var slotManufacturer: String?
    public var slotID: UInt?
    // The module: CK_INFO.
    public var libraryManufacturer: String?
    public var libraryDescription: String?
    public var libraryVersion: Version?
    // An object on the token: CKA_LABEL, CKA_ID, CKA_CLASS.
    public var object: String?
    public var id: [UInt8]?
    public var type: ObjectType?
    // Query attributes.
    /// The module's file; a relative path is looked up in p11-kit's module directory.
    public var modulePath: String?
    /// A module registered with p11-kit (the name of its `.module` file). `modulePath` wins over it.
    public var moduleName: String?
    /// A file whose first line is the user PIN (`pin-source=file:/path` or an absolute path).
    public var pinSource: String?
    /// The user PIN itself, kept in locked memory. Never printed by `description`.
    public var pinValue: SecureBytes?

    /// A URI with no attributes: it matches every token of the module.
    public init() {}

    public init(_ string: String) throws(PKCS11URIError) {
        let scheme = "pkcs11:"
        guard string.utf8.count >= scheme.utf8.count,
              string.prefix(scheme.count).lowercased() == scheme else {
            throw PKCS11URIError("a PKCS#11 URI starts with 'pkcs11:'")
        }
        let rest = string.dropFirst(scheme.count)
        if rest.contains("#") {
            throw PKCS11URIError("a PKCS#11 URI has no fragment: write '#' in a value as %23")
        }
        let parts = rest.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        var seen = Set<String>()
        if !parts[0].isEmpty {
            for attribute in parts[0].split(separator: ";", omittingEmptySubsequences: false) {
                let (name, value) = try Self.attribute(attribute, component: "path")
                guard seen.insert(name).inserted else {
                    throw PKCS11URIError("the path attribute '\(name)' is given twice")
                }
                try setPathAttribute(name, value)
            }
        }
        if parts.count > 1, !parts[1].isEmpty {
            for attribute in parts[1].split(separator: "&", omittingEmptySubsequences: false) {
                let (name, value) = try Self.attribute(attribute, component: "query")
                if Self.pathAttributes.contains(name) {
                    throw PKCS11URIError("'\(name)' is a path attribute: write it before the '?' (pkcs11:\(name)=…?module-path=…)")
                }
                // RFC 7512 §2.3: only vendor-specific query attributes may repeat.
                guard seen.insert(name).inserted || !Self.queryAttributes.contains(name) else {
                    throw PKCS11URIError("the query attribute '\(name)' is given twice")
                }
                try setQueryAttribute(name, value)
            }
        }
        if pinValue != nil && pinSource != nil {
            throw PKCS11URIError("give either pin-value or pin-source, not both")
        }
    }

    /// The user PIN from `pin-value`, or the first line of the `pin-source` file; nil when neither is set.
    public func pin() throws(PKCS11URIError) -> SecureBytes? {
        if let pinValue { return pinValue }
        guard let pinSource else { return nil }
        return try Self.firstLine(ofFile: pinSource)
    }

    /// The URI in canonical form, without `pin-value`.
    public var description: String {
        var path: [String] = []
        func add(_ name: String, _ value: String?) {
            if let value { path.append(name + "=" + Self.encode(Array(value.utf8), keeping: Self.pathCharacters)) }
        }
        add("library-manufacturer", libraryManufacturer)
        add("library-description", libraryDescription)
        add("library-version", libraryVersion?.description)
        add("slot-manufacturer", slotManufacturer)
        add("slot-description", slotDescription)
        add("slot-id", slotID.map { String($0) })
        add("manufacturer", manufacturer)
        add("model", model)
        add("serial", serial)
        add("token", token)
        add("object", object)
        if let id { path.append("id=" + Self.encode(id, keeping: [])) }
        add("type", type?.rawValue)

        var query: [String] = []
        if let moduleName { query.append("module-name=" + Self.encode(Array(moduleName.utf8), keeping: Self.queryCharacters)) }
        if let modulePath { query.append("module-path=" + Self.encode(Array(modulePath.utf8), keeping: Self.queryCharacters)) }
        if let pinSource { query.append("pin-source=file:" + Self.encode(Array(pinSource.utf8), keeping: Self.queryCharacters)) }
        return "pkcs11:" + path.joined(separator: ";") + (query.isEmpty ? "" : "?" + query.joined(separator: "&"))
    }

    // MARK: Parsing

    /// RFC 7512 §2.3's path attributes (`pk11-pattr`), and its standard query attributes (`pk11-qattr`).
    static let pathAttributes: Set<String> = [
        "token", "manufacturer", "serial", "model", "library-manufacturer", "library-description", "library-version",
        "object", "type", "id", "slot-description", "slot-manufacturer", "slot-id",
    ]
    static let queryAttributes: Set<String> = ["pin-source", "pin-value", "module-name", "module-path"]

    private mutating func setPathAttribute(_ name: String, _ value: [UInt8]) throws(PKCS11URIError) {
        switch name {
        case "token": token = try Self.text(value, name)
        case "manufacturer": manufacturer = try Self.text(value, name)
        case "model": model = try Self.text(value, name)
        case "serial": serial = try Self.text(value, name)
        case "slot-description": slotDescription = try Self.text(value, name)
        case "slot-manufacturer": slotManufacturer = try Self.text(value, name)
        case "library-manufacturer": libraryManufacturer = try Self.text(value, name)
        case "library-description": libraryDescription = try Self.text(value, name)
        case "object": object = try Self.text(value, name)
        case "id": id = value
        case "slot-id":
            let text = try Self.text(value, name)
            guard text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let number = UInt(text) else {
                throw PKCS11URIError("slot-id must be a decimal number, not '\(text)'")
            }
            slotID = number
        case "library-version":
            let text = try Self.text(value, name)
            let numbers = text.split(separator: ".", omittingEmptySubsequences: false)
            guard numbers.count <= 2,
                  numbers.allSatisfy({ !$0.isEmpty && $0.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } }),
                  let major = UInt8(numbers[0]), let minor = numbers.count == 2 ? UInt8(numbers[1]) : 0 else {
                throw PKCS11URIError("library-version must be 'M' or 'M.m' (each 0...255), not '\(text)'")
            }
            libraryVersion = Version(major: major, minor: minor)
        case "type":
            let text = try Self.text(value, name)
            guard let objectType = ObjectType(rawValue: text) else {
                let known = ObjectType.allCases.map(\.rawValue).joined(separator: ", ")
                throw PKCS11URIError("type must be one of \(known), not '\(text)'")
            }
            type = objectType
        default:
            if Self.queryAttributes.contains(name) {
                throw PKCS11URIError("'\(name)' is a query attribute: write it after a '?' (pkcs11:token=…?\(name)=…)")
            }
            throw PKCS11URIError("unknown path attribute '\(name)'")
        }
    }

    private mutating func setQueryAttribute(_ name: String, _ value: [UInt8]) throws(PKCS11URIError) {
        switch name {
        case "module-path":
            modulePath = try Self.text(value, name)
            if modulePath!.isEmpty { throw PKCS11URIError("module-path is empty") }
        case "module-name":
            moduleName = try Self.text(value, name)
            if moduleName!.isEmpty { throw PKCS11URIError("module-name is empty") }
        case "pin-source":
            pinSource = try Self.filePath(fromPINSource: Self.text(value, name))
        case "pin-value":
            var bytes = value
            pinValue = SecureBytes(copying: bytes)
            for index in bytes.indices { bytes[index] = 0 }
        default:
            break
        }
    }

    /// Splits `name=value`, checks the name and percent-decodes the value.
    private static func attribute(_ text: Substring, component: String) throws(PKCS11URIError) -> (String, [UInt8]) {
        guard let equals = text.firstIndex(of: "=") else {
            throw PKCS11URIError(text.isEmpty
                ? "an empty attribute in the \(component) (a stray separator)"
                : "the \(component) attribute '\(text)' has no '='")
        }
        let name = String(text[..<equals])
        guard !name.isEmpty, name.utf8.allSatisfy({ isLowerAlphanumeric($0) || $0 == UInt8(ascii: "-") }) else {
            throw PKCS11URIError("'\(name)' is not an attribute name")
        }
        return (name, try decode(text[text.index(after: equals)...], attribute: name))
    }

    private static func decode(_ text: Substring, attribute: String) throws(PKCS11URIError) -> [UInt8] {
        var bytes: [UInt8] = []
        var input = text.utf8.makeIterator()
        while let byte = input.next() {
            if byte == UInt8(ascii: "%") {
                guard let high = input.next().flatMap(Hex.nibble), let low = input.next().flatMap(Hex.nibble) else {
                    throw PKCS11URIError("\(attribute): '%' must be followed by two hex digits")
                }
                bytes.append(high << 4 | low)
            } else if byte <= 0x20 || byte == 0x7F {
                throw PKCS11URIError("\(attribute): spaces and control characters must be percent-encoded (' ' is %20)")
            } else {
                bytes.append(byte)
            }
        }
        return bytes
    }

    private static func text(_ bytes: [UInt8], _ attribute: String) throws(PKCS11URIError) -> String {
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw PKCS11URIError("\(attribute) is not valid UTF-8")
        }
        return text
    }

    /// `file:/p`, `file:///p`, `file://localhost/p` or `/p`; other sources (programs, relative paths) are refused.
    private static func filePath(fromPINSource source: String) throws(PKCS11URIError) -> String {
        var path = Substring(source)
        if path.lowercased().hasPrefix("file:") {
            path = path.dropFirst(5)
            if path.hasPrefix("//") {
                path = path.dropFirst(2)
                if path.lowercased().hasPrefix("localhost") { path = path.dropFirst(9) }
            }
        }
        guard path.hasPrefix("/") else {
            throw PKCS11URIError("pin-source must be a file: URI or an absolute path, not '\(source)'")
        }
        return String(path)
    }

    // MARK: The PIN file

    /// The longest first line we read from a `pin-source` file.
    static let maximumPINFileLine = 1024

    private static func firstLine(ofFile path: String) throws(PKCS11URIError) -> SecureBytes {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let code = errno
            throw PKCS11URIError("cannot read pin-source \(path): \(String(cString: strerror(code)))", errno: code)
        }
        defer { close(descriptor) }
        // Read into locked memory; one byte more than we accept tells a long line from a full one.
        let buffer = SecureBytes(count: maximumPINFileLine + 1)
        let result: Result<Int, PKCS11URIError> = buffer.withUnsafeMutableBytes { bytes in
            var filled = 0
            while filled < bytes.count {
                let n: Int
                switch valueOrErrno({ read(descriptor, bytes.baseAddress! + filled, bytes.count - filled) }) {
                case .success(let count): n = count
                case .failure(let code):
                    return .failure(PKCS11URIError("cannot read pin-source \(path): \(code)", errno: code.rawValue))
                }
                if n == 0 { break }
                filled += n
            }
            var end = bytes[..<filled].firstIndex(of: UInt8(ascii: "\n")) ?? filled
            if end > maximumPINFileLine {
                return .failure(PKCS11URIError("the first line of pin-source \(path) is longer than \(maximumPINFileLine) bytes"))
            }
            if end > 0 && bytes[end - 1] == UInt8(ascii: "\r") { end -= 1 }
            if end == 0 { return .failure(PKCS11URIError("the first line of pin-source \(path) is empty")) }
            return .success(end)
        }
        let length = try result.get()
        return buffer.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[..<length])) }
    }

    // MARK: Characters

    /// Kept as they are in path values; everything else is percent-encoded.
    private static let pathCharacters = Set(":[]@!$'()*+,=".utf8)
    /// Kept as they are in query values.
    private static let queryCharacters = Set(":[]@!$'()*+,=/?|".utf8)

    private static func encode(_ bytes: [UInt8], keeping extra: Set<UInt8>) -> String {
        var out = ""
        for byte in bytes {
            if isLowerAlphanumeric(byte) || (byte >= 0x41 && byte <= 0x5A) || "-._~".utf8.contains(byte)
                || extra.contains(byte) {
                out.unicodeScalars.append(Unicode.Scalar(byte))
            } else {
                out += "%" + Hex.encode([byte], uppercase: true)
            }
        }
        return out
    }

    private static func isLowerAlphanumeric(_ byte: UInt8) -> Bool {
        (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39)
    }
}
