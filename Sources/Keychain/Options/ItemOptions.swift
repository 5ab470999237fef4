/// A write's overrides of its storage's defaults; a nil field keeps the storage's value.
///
/// The service and the access group belong to the storage, so a call can't change them (seed).
public struct SetItemOptions: Sendable, Hashable {
    public var accessible: Accessible?
    public var accessControl: AccessControl?
    public var authValidity: Int?
    /// Kept next to the item, outside the secret: readable without a prompt (e.g. a username).
    public var label: String?
    public var synchronizable: Bool?

    public init(
        accessible: Accessible? = nil,
        accessControl: AccessControl? = nil,
        authValidity: Int? = nil,
        label: String? = nil,
        synchronizable: Bool? = nil
    ) {
        self.accessible = accessible
        self.accessControl = accessControl
        self.authValidity = authValidity
        self.label = label
        self.synchronizable = synchronizable
    }
}

/// A read's overrides of its storage's defaults.
public struct GetItemOptions: Sendable, Hashable {
    /// Merged over the storage's prompt field by field.
    public var prompt: Prompt?

    public init(prompt: Prompt? = nil) {
        self.prompt = prompt
    }
}
