/// A write's overrides of its storage's defaults; a field left out keeps the storage's value.
///
/// The service and the access group belong to the storage, so a call can't change them (seed).
///
/// The access control is given to the initializer as a plain `AccessControl`, never an optional:
/// `SetItemOptions(accessControl: .none)` is the seed's `AccessControl.None` (an item without a
/// prompt), not Swift's `Optional.none`. Leave the argument out to keep the storage's value.
public struct SetItemOptions: Sendable, Hashable {
    public var accessible: Accessible?
    /// The override, nil when the write keeps the storage's. Read-only, so that no assignment of
    /// `.none` can mean "no override": give it to the initializer or to `overrideAccessControl(with:)`.
    public private(set) var accessControl: AccessControl?
    public var authValidity: Int?
    /// Kept next to the item, outside the secret: readable without a prompt (e.g. a username).
    public var label: String?
    public var synchronizable: Bool?

    /// Overrides that keep the storage's access control.
    public init(
        accessible: Accessible? = nil,
        authValidity: Int? = nil,
        label: String? = nil,
        synchronizable: Bool? = nil
    ) {
        self.init(accessible: accessible, accessControlOverride: nil, authValidity: authValidity, label: label,
                  synchronizable: synchronizable)
    }

    /// Overrides with an access control of the write's own; `.none` stores the item without a prompt.
    public init(
        accessible: Accessible? = nil,
        accessControl: AccessControl,
        authValidity: Int? = nil,
        label: String? = nil,
        synchronizable: Bool? = nil
    ) {
        self.init(accessible: accessible, accessControlOverride: accessControl, authValidity: authValidity, label: label,
                  synchronizable: synchronizable)
    }

    package init(accessible: Accessible?, accessControlOverride: AccessControl?, authValidity: Int?, label: String?,
         synchronizable: Bool?) {
        self.accessible = accessible
        self.accessControl = accessControlOverride
        self.authValidity = authValidity
        self.label = label
        self.synchronizable = synchronizable
    }

    /// Gives the write `value` as its access control; `.none` stores the item without a prompt.
    public mutating func overrideAccessControl(with value: AccessControl) {
        accessControl = value
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
