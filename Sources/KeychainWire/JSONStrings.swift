/// A JSON array of strings, as keychaind sends getAllKeys, read without Foundation (keychainctl's
/// front, `KeychainClient`); nil for anything else (the library, with Foundation's decoder, reads
/// and words what this does not).
public enum WireJSONStrings {
    public static func decode(_ bytes: [UInt8]) -> [String]? {
        guard let text = String(validating: bytes, as: UTF8.self) else { return nil }
        var scalars = Array(text.unicodeScalars)[...]
        func skipSpace() { while let c = scalars.first, c == " " || c == "\n" || c == "\r" || c == "\t" { scalars.removeFirst() } }
        func hex4() -> UInt32? {
            guard scalars.count >= 4 else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                guard let digit = UInt32(String(scalars.removeFirst()), radix: 16) else { return nil }
                value = value << 4 | digit
            }
            return value
        }
        func string() -> String? {
            guard scalars.popFirst() == "\"" else { return nil }
            var out = String.UnicodeScalarView()
            while let c = scalars.popFirst() {
                switch c {
                case "\"": return String(out)
                case "\\":
                    switch scalars.popFirst() {
                    case "\""?: out.append("\"")
                    case "\\"?: out.append("\\")
                    case "/"?: out.append("/")
                    case "b"?: out.append("\u{8}")
                    case "f"?: out.append("\u{c}")
                    case "n"?: out.append("\n")
                    case "r"?: out.append("\r")
                    case "t"?: out.append("\t")
                    case "u"?:
                        guard var value = hex4() else { return nil }
                        if (0xD800..<0xDC00).contains(value) {
                            guard scalars.popFirst() == "\\", scalars.popFirst() == "u", let low = hex4(),
                                  (0xDC00..<0xE000).contains(low) else { return nil }
                            value = 0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let scalar = Unicode.Scalar(value) else { return nil }
                        out.append(scalar)
                    default: return nil
                    }
                case _ where c.value < 0x20: return nil
                default: out.append(c)
                }
            }
            return nil
        }
        var result: [String] = []
        skipSpace()
        guard scalars.popFirst() == "[" else { return nil }
        skipSpace()
        if scalars.first == "]" {
            scalars.removeFirst()
        } else {
            while true {
                skipSpace()
                guard let item = string() else { return nil }
                result.append(item)
                skipSpace()
                let next = scalars.popFirst()
                if next == "]" { break }
                guard next == "," else { return nil }
            }
        }
        skipSpace()
        return scalars.isEmpty ? result : nil
    }
}
