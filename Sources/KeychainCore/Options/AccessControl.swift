/// What unlocks an item, as in the seed's `AccessControl`: nothing, biometrics, the passcode, or both.
///
/// Anything but `none` locks the item with a key released only after the user passes the prompt:
/// a read shows the prompt, a write never does. On Linux, biometrics is the fingerprint reader and
/// the passcode is the device PIN.
public enum AccessControl: String, CaseIterable, Sendable, Codable {
    /// Nobody: no prompt. The default.
    case none
    /// Any enrolled biometrics, now or added later.
    case biometryAny
    /// Only the biometrics enrolled when the item was written: an enrollment change invalidates it.
    case biometryCurrentSet
    /// Biometrics or the device passcode.
    case biometryAnyOrPasscode
    /// The biometrics enrolled at write time, or the device passcode.
    case biometryCurrentSetOrPasscode
    /// The device passcode only.
    case passcode

    /// The value of a seed string such as `"biometryCurrentSet"`.
    ///
    /// - Throws: `INVALID_ARGUMENT` naming the valid values.
    public init(parsing text: String) throws(KeychainError) {
        self = try Self.parseOption(text, named: "accessControl")
    }

    /// Whether a write needs a biometric sensor with enrolled biometrics.
    ///
    /// The seed's "What a write needs" table: `biometryCurrentSetOrPasscode` needs them too (the
    /// passcode doesn't make up for them), `biometryAnyOrPasscode` doesn't (the passcode opens it).
    public var needsBiometry: Bool {
        switch self {
        case .biometryAny, .biometryCurrentSet, .biometryCurrentSetOrPasscode: true
        case .none, .biometryAnyOrPasscode, .passcode: false
        }
    }

    /// Whether the prompt offers biometrics at all: every value but `none` and `passcode`.
    public var usesBiometry: Bool {
        self != .none && self != .passcode
    }

    /// Whether the device passcode opens the item; a write of any value but `none` needs one set.
    public var allowsPasscode: Bool {
        switch self {
        case .biometryAnyOrPasscode, .biometryCurrentSetOrPasscode, .passcode: true
        case .none, .biometryAny, .biometryCurrentSet: false
        }
    }

    /// Whether the item is bound to today's enrollment: a change throws `KEY_INVALIDATED` at the next read.
    public var isCurrentSet: Bool {
        self == .biometryCurrentSet || self == .biometryCurrentSetOrPasscode
    }
}

extension Optional where Wrapped == AccessControl {
    /// `getItemInfo(key)?.accessControl == .none` compares with the seed's `AccessControl.None`: true
    /// only for an item that exists without a prompt, never for an absent one (Swift's own `==` would
    /// read `.none` as `Optional.none`, a nil check). Compare with `nil` for "absent".
    public static func == (lhs: AccessControl?, rhs: AccessControl) -> Bool {
        guard let lhs else { return false }
        return lhs.rawValue == rhs.rawValue
    }

    /// The negation of `==`: true for an absent item, as `!(lhs == rhs)`.
    public static func != (lhs: AccessControl?, rhs: AccessControl) -> Bool { !(lhs == rhs) }
}
