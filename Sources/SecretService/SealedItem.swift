import KeychainCLIText
import SecureMemory

/// What an item holds, as one keychain value: everything but the keyed hashes lives inside the
/// envelope (the keychain's authenticated encryption), so the store files show no attribute value,
/// no label, no content type and no secret.
///
/// Layout (version 1): `"ss1"`, then label, content type, the attribute count and each name and
/// value, then the secret; every field a 4-byte big-endian length and its bytes.
public struct SealedItem {
    public var label: String
    public var contentType: String
    public var attributes: [String: String]
    public var secret: SecureBytes

    public init(label: String, contentType: String, attributes: [String: String], secret: SecureBytes) {
        self.label = label
        self.contentType = contentType
        self.attributes = attributes
        self.secret = secret
    }

    static let magic: [UInt8] = Array("ss1".utf8)

    /// The value to store, in locked memory: it holds the secret.
    public func encoded() -> SecureBytes {
        var header = Self.magic
        func put(_ bytes: some Collection<UInt8>) {
            let n = UInt32(bytes.count)
            header += [UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
            header += bytes
        }
        put(label.utf8)
        put(contentType.utf8)
        let count = UInt32(attributes.count)
        header += [UInt8(count >> 24), UInt8(count >> 16 & 0xFF), UInt8(count >> 8 & 0xFF), UInt8(count & 0xFF)]
        for (name, value) in attributes.sorted(by: { $0.key < $1.key }) {
            put(name.utf8)
            put(value.utf8)
        }
        let n = UInt32(secret.count)
        header += [UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)]
        let out = SecureBytes(count: header.count + secret.count)
        out.withUnsafeMutableBytes { destination in
            destination.copyBytes(from: header)
            secret.withUnsafeBytes { source in
                if source.count > 0 { (destination.baseAddress! + header.count).copyMemory(from: source.baseAddress!, byteCount: source.count) }
            }
        }
        return out
    }

    /// Reads a stored value; nil when it is not an item of this provider (the caller reports DATA_CORRUPTED).
    public init?(decoding stored: SecureBytes) {
        var result: SealedItem?
        stored.withUnsafeBytes { raw in
            let bytes = raw.bindMemory(to: UInt8.self)
            var offset = 0
            func length() -> Int? {
                guard bytes.count - offset >= 4 else { return nil }
                let n = Int(bytes[offset]) << 24 | Int(bytes[offset + 1]) << 16 | Int(bytes[offset + 2]) << 8 | Int(bytes[offset + 3])
                offset += 4
                return n <= bytes.count - offset ? n : nil
            }
            func text() -> String? {
                guard let n = length() else { return nil }
                defer { offset += n }
                return String(validating: UnsafeBufferPointer(rebasing: bytes[offset..<offset + n]), as: UTF8.self)
            }
            guard bytes.count >= 3, Array(bytes[0..<3]) == Self.magic else { return }
            offset = 3
            guard let label = text(), let contentType = text(), bytes.count - offset >= 4 else { return }
            let count = Int(bytes[offset]) << 24 | Int(bytes[offset + 1]) << 16 | Int(bytes[offset + 2]) << 8 | Int(bytes[offset + 3])
            offset += 4
            var attributes: [String: String] = [:]
            for _ in 0..<min(count, bytes.count) {
                guard let name = text(), let value = text() else { return }
                attributes[name] = value
            }
            guard attributes.count == count, let n = length(), offset + n == bytes.count else { return }
            result = SealedItem(label: label, contentType: contentType, attributes: attributes,
                                secret: SecureBytes(copying: UnsafeRawBufferPointer(rebasing: raw[offset..<offset + n])))
        }
        guard let result else { return nil }
        self = result
    }
}

/// The keyed hashes an item is found by: HMAC-SHA256 under the provider's attribute key of each
/// attribute's name and value (length-prefixed), the first 16 bytes in hex. They are all the store
/// shows of the attributes (in the keychain item's label), so search works on locked collections
/// without their values being readable.
public struct AttributeHasher: Sendable {
    let key: SecureBytes

    public init(key: SecureBytes) { self.key = key }

    public func hash(name: String, value: String) -> String {
        var message: [UInt8] = []
        for field in [Array(name.utf8), Array(value.utf8)] {
            let n = UInt32(field.count)
            message += [UInt8(n >> 24), UInt8(n >> 16 & 0xFF), UInt8(n >> 8 & 0xFF), UInt8(n & 0xFF)] + field
        }
        let mac = Sodium.hmacSHA256(key: key, message: message)
        return lowerHex(mac[0..<16])
    }

    public func hashes(_ attributes: [String: String]) -> Set<String> {
        Set(attributes.map { hash(name: $0.key, value: $0.value) })
    }

    /// The keychain item's label: `h1:` and the sorted hashes, comma-separated.
    public static func label(_ hashes: Set<String>) -> String { "h1:" + hashes.sorted().joined(separator: ",") }

    /// The hashes of a stored label; nil for a label this provider did not write.
    public static func hashes(label: String?) -> Set<String>? {
        guard let label, label.hasPrefix("h1:") else { return nil }
        let list = label.dropFirst(3)
        return list.isEmpty ? [] : Set(list.split(separator: ",").map(String.init))
    }
}
