/// Where an item's key lives, Android's `keyStorage`: on Linux, the TPM or a PKCS#11 token.
public enum KeyStorage: String, CaseIterable, Sendable, Codable {
    /// The TPM 2.0. The default.
    case tee
    /// A PKCS#11 token, the dedicated secure element.
    case strongbox

    /// The value of `"tee"` or `"strongbox"`.
    ///
    /// - Throws: `INVALID_ARGUMENT` naming the valid values.
    public init(parsing text: String) throws(KeychainError) {
        self = try Self.parseOption(text, named: "android.keyStorage")
    }
}

/// The seed's `android` options, kept under the same key so one config serves every platform.
public struct AndroidOptions: Sendable, Hashable, Codable {
    public var keyStorage: KeyStorage

    public init(keyStorage: KeyStorage = .tee) {
        self.keyStorage = keyStorage
    }

    private enum CodingKeys: String, CodingKey, CaseIterable {
        case keyStorage
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.optionsContainer(keyedBy: CodingKeys.self)
        self.init(keyStorage: try container.option(KeyStorage.self, forKey: .keyStorage) ?? .tee)
    }
}
