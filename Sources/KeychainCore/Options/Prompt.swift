/// The texts of the prompt a read shows; a field left `nil` keeps the system's (or the storage's) text.
public struct Prompt: Sendable, Hashable, Codable {
    public var title: String?
    public var subtitle: String?
    public var description: String?
    /// The cancel button, e.g. "Use password"; pressing it throws `USER_CANCELED`.
    public var cancel: String?

    public init(title: String? = nil, subtitle: String? = nil, description: String? = nil, cancel: String? = nil) {
        self.title = title
        self.subtitle = subtitle
        self.description = description
        self.cancel = cancel
    }

    /// This (the storage's) prompt with a call's prompt over it, field by field: the call's field wins
    /// where it is set, as the seed's `getItem('pin', { prompt: { title } })` keeps the storage's cancel.
    public func merged(with call: Prompt?) -> Prompt {
        guard let call else { return self }
        return Prompt(
            title: call.title ?? title,
            subtitle: call.subtitle ?? subtitle,
            description: call.description ?? description,
            cancel: call.cancel ?? cancel)
    }

    private enum CodingKeys: String, CodingKey, CaseIterable {
        case title, subtitle, description, cancel
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.optionsContainer(keyedBy: CodingKeys.self)
        self.init(
            title: try container.option(String.self, forKey: .title, expected: "a string"),
            subtitle: try container.option(String.self, forKey: .subtitle, expected: "a string"),
            description: try container.option(String.self, forKey: .description, expected: "a string"),
            cancel: try container.option(String.self, forKey: .cancel, expected: "a string"))
    }
}
