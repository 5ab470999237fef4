/// The keychain's one hex codec: what it writes (names, tags, codes, values) and what it reads back.
public enum Hex {
    private static let lower = Array("0123456789abcdef".utf8)
    private static let upper = Array("0123456789ABCDEF".utf8)

    /// `bytes` in hex, two digits each, appended to `out` (a secret's buffer stays the caller's).
    @inline(__always)
    public static func write(_ bytes: some Sequence<UInt8>, uppercase: Bool = false, into out: (UInt8) -> Void) {
        let digits = uppercase ? upper : lower
        for byte in bytes {
            out(digits[Int(byte >> 4)])
            out(digits[Int(byte & 0xF)])
        }
    }

    /// `bytes` in hex, two digits each.
    public static func encode(_ bytes: some Sequence<UInt8>, uppercase: Bool = false) -> String {
        var text: [UInt8] = []
        text.reserveCapacity(bytes.underestimatedCount * 2)
        write(bytes, uppercase: uppercase) { text.append($0) }
        return String(decoding: text, as: UTF8.self)
    }

    /// `value` in hex, at least `digits` long (zeros in front).
    public static func encode(_ value: some BinaryInteger, digits: Int, uppercase: Bool = false) -> String {
        let text = String(value, radix: 16, uppercase: uppercase)
        return String(repeating: "0", count: max(0, digits - text.count)) + text
    }

    /// The value of one hex digit (either case), nil for anything else.
    public static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// The bytes of an even run of hex digits (either case), nil for an odd count or any other character.
    public static func decode(_ text: some Collection<UInt8>) -> [UInt8]? {
        guard text.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.count / 2)
        var high: UInt8?
        for c in text {
            guard let value = nibble(c) else { return nil }
            if let h = high { bytes.append(h << 4 | value); high = nil } else { high = value }
        }
        return bytes
    }
}
