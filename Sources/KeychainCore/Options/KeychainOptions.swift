import FoundationEssentials
import KeychainBasics

/// A storage's service and the defaults of its calls, the seed's `createKeychain` options.
///
/// Every key is optional and the defaults are the seed's. `validated()` applies the seed's rules;
/// a storage checks its options once, when it is made.
public struct KeychainOptions: Sendable, Hashable, Codable {
    /// The service whose items this storage sees; nil is the default service.
    public var service: String?
    public var accessible: Accessible
    public var accessControl: AccessControl
    /// Seconds after a passed prompt during which reads need no new one; 0 asks at every read.
    public var authValidity: Int
    /// Whether items may be synced to the user's other devices.
    ///
    /// - Important: Linux has no iCloud. The option is accepted and checked by the same rules as
    ///   on iOS, but not stored and never synced.
    public var synchronizable: Bool
    /// The group whose items this storage sees; nil is the default group. Fixed per storage.
    public var accessGroup: String?
    /// The storage's prompt texts; nil keeps the system's.
    public var prompt: Prompt?
    public var android: AndroidOptions

    /// The longest service the seed accepts, in characters (UTF-16 code units, as JavaScript counts).
    public static let maxServiceLength = ItemNames.maxServiceLength

    public init(
        service: String? = nil,
        accessible: Accessible = .afterFirstUnlock,
        accessControl: AccessControl = .none,
        authValidity: Int = 0,
        synchronizable: Bool = false,
        accessGroup: String? = nil,
        prompt: Prompt? = nil,
        android: AndroidOptions = .init()
    ) {
        self.service = service
        self.accessible = accessible
        self.accessControl = accessControl
        self.authValidity = authValidity
        self.synchronizable = synchronizable
        self.accessGroup = accessGroup
        self.prompt = prompt
        self.android = android
    }

    /// These options, once they pass the seed's rules: those of `createKeychain`, then those of a write.
    ///
    /// - Throws: `INVALID_ARGUMENT` with the seed's message for the first rule broken.
    public func validated() throws(KeychainError) -> KeychainOptions {
        if let problem = service.flatMap(ItemNames.serviceProblem) ?? accessGroup.flatMap(ItemNames.accessGroupProblem) {
            throw .invalidArgument(problem)
        }
        // Seed: a storage that can't hold a single valid item fails where it is made.
        _ = try resolved(for: nil)
        return self
    }

    /// The protection of one write: these defaults with the call's overrides, checked by the same rules.
    public func resolved(for call: SetItemOptions?) throws(KeychainError) -> ItemProtection {
        try ItemProtection(
            accessible: call?.accessible ?? accessible,
            accessControl: call?.accessControl ?? accessControl,
            authValidity: call?.authValidity ?? authValidity,
            synchronizable: call?.synchronizable ?? synchronizable)
    }

    /// The prompt of one read: the storage's, with the call's fields over it.
    public func resolvedPrompt(for call: GetItemOptions?) -> Prompt {
        (prompt ?? Prompt()).merged(with: call?.prompt)
    }

    /// Options from a JSON config file, decoded and validated.
    ///
    /// - Throws: `INVALID_ARGUMENT` for malformed JSON, an unknown key at any level, a value of the
    ///   wrong type or outside its choices, or a broken rule.
    public static func fromJSON(_ data: Data) throws(KeychainError) -> KeychainOptions {
        let options: KeychainOptions
        do {
            options = try JSONDecoder().decode(KeychainOptions.self, from: data)
        } catch let error as KeychainError {
            throw error
        } catch {
            // Every other failure was named in init(from:); what is left is JSON that doesn't parse.
            let cause = (error as? DecodingError).flatMap(\.underlyingDescription) ?? String(describing: error)
            throw KeychainError(.invalidArgument, "Invalid keychain options: not valid JSON", underlying: .other(cause))
        }
        return try options.validated()
    }

    private enum CodingKeys: String, CodingKey, CaseIterable {
        case service, accessible, accessControl, authValidity, synchronizable, accessGroup, prompt, android
    }

    /// Decodes the seed's keys, rejecting any other; null is the same as a missing key.
    ///
    /// Doesn't apply the rules: `fromJSON` and a storage's creation do.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.optionsContainer(keyedBy: CodingKeys.self)
        let defaults = KeychainOptions()
        self.init(
            service: try container.option(
                String.self, forKey: .service,
                expected: "a non-empty string of up to \(Self.maxServiceLength) characters"),
            accessible: try container.option(Accessible.self, forKey: .accessible) ?? defaults.accessible,
            accessControl: try container.option(AccessControl.self, forKey: .accessControl) ?? defaults.accessControl,
            authValidity: try container.option(
                Int.self, forKey: .authValidity,
                expected: "a whole number of seconds, 0 or more") ?? defaults.authValidity,
            synchronizable: try container.option(
                Bool.self, forKey: .synchronizable, expected: "true or false") ?? defaults.synchronizable,
            accessGroup: try container.option(String.self, forKey: .accessGroup, expected: "a non-empty string"),
            // Nested objects name their own errors by their key path.
            prompt: try container.decodeIfPresent(Prompt.self, forKey: .prompt),
            android: try container.decodeIfPresent(AndroidOptions.self, forKey: .android) ?? defaults.android)
    }
}

extension DecodingError {
    /// The parser's own words, e.g. where the JSON stops parsing.
    fileprivate var underlyingDescription: String? {
        guard case .dataCorrupted(let context) = self else { return nil }
        return context.underlyingError.map(String.init(describing:)) ?? context.debugDescription
    }
}
