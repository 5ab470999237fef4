// Decoding options from JSON with the seed's checks: unknown keys and wrong values are
// INVALID_ARGUMENT naming the key, never a DecodingError or a silent default.

extension RawRepresentable where Self: CaseIterable, RawValue == String {
    /// "one of 'a', 'b'": the valid strings, for messages.
    package static var optionValues: String {
        "one of " + allCases.map { "'\($0.rawValue)'" }.joined(separator: ", ")
    }

    /// The case named `text`, or INVALID_ARGUMENT naming `option` and the valid strings.
    package static func parseOption(_ text: String, named option: String) throws(KeychainError) -> Self {
        guard let value = Self(rawValue: text) else {
            throw .invalidArgument("Invalid \(option): expected \(optionValues), got '\(text)'")
        }
        return value
    }
}

/// Any key of an options object (or of a sealed key's policy), so that the ones we don't know can be seen.
package struct AnyOptionKey: CodingKey {
    package let stringValue: String
    package var intValue: Int? { nil }

    package init(stringValue: String) {
        self.stringValue = stringValue
    }

    package init?(intValue: Int) {
        nil
    }
}

/// "prompt.title" for a key path; "keychain options" for the top level.
func optionPath(_ codingPath: [any CodingKey]) -> String {
    codingPath.isEmpty ? "keychain options" : codingPath.map(\.stringValue).joined(separator: ".")
}

extension Decoder {
    /// The container of an options object, once it is known to hold only the keys of `Key`.
    ///
    /// The seed rejects unknown options because a misspelt `accessControl` would otherwise store a
    /// secret without protection.
    func optionsContainer<Key: CodingKey & CaseIterable>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        let known = Key.allCases.map(\.stringValue)
        let all: KeyedDecodingContainer<AnyOptionKey>
        do {
            all = try container(keyedBy: AnyOptionKey.self)
        } catch {
            throw KeychainError.invalidArgument(
                "Invalid \(optionPath(codingPath)): expected an object with the key\(known.count == 1 ? "" : "s") "
                    + "\(known.joined(separator: ", ")), got \(describeValue())")
        }
        // Sorted: JSON objects have no order, the message should.
        let unknown = all.allKeys.filter { !known.contains($0.stringValue) }
            .map { optionPath(codingPath + [$0]) }.sorted()
        if unknown.count == 1 {
            throw KeychainError.invalidArgument("Invalid keychain options: unknown option '\(unknown[0])'")
        } else if !unknown.isEmpty {
            let list = unknown.map { "'\($0)'" }.joined(separator: ", ")
            throw KeychainError.invalidArgument("Invalid keychain options: unknown options \(list)")
        }
        return try container(keyedBy: Key.self)
    }

    /// What the value here is, for "got …" in a message: a literal, "an object" or "an array".
    func describeValue() -> String {
        if let value = try? singleValueContainer() {
            if value.decodeNil() { return "null" }
            if let bool = try? value.decode(Bool.self) { return String(bool) }
            if let int = try? value.decode(Int.self) { return String(int) }
            if let double = try? value.decode(Double.self) { return String(double) }
            if let string = try? value.decode(String.self) { return "'\(string)'" }
        }
        if (try? container(keyedBy: AnyOptionKey.self)) != nil { return "an object" }
        if (try? unkeyedContainer()) != nil { return "an array" }
        return "a value of another type"
    }
}

extension KeyedDecodingContainer {
    /// The option at `key`; nil when it is absent or null, so the default applies.
    ///
    /// - Throws: INVALID_ARGUMENT "Invalid <key path>: expected <expected>, got <value>".
    func option<T: Decodable>(_ type: T.Type, forKey key: Key, expected: @autoclosure () -> String) throws -> T? {
        guard contains(key), try !decodeNil(forKey: key) else { return nil }
        do {
            return try decode(T.self, forKey: key)
        } catch let error as KeychainError {
            throw error
        } catch {
            let got = (try? superDecoder(forKey: key))?.describeValue() ?? "a value of another type"
            throw KeychainError.invalidArgument("Invalid \(optionPath(codingPath + [key])): expected \(expected()), got \(got)")
        }
    }

    /// The option at `key`, one of the strings of `T`.
    func option<T: Decodable & RawRepresentable & CaseIterable>(_ type: T.Type, forKey key: Key) throws -> T?
    where T.RawValue == String {
        try option(type, forKey: key, expected: T.optionValues)
    }
}
