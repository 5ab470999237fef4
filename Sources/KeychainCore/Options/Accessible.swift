/// When an item can be read: Apple's seven `kSecAttrAccessible` levels.
///
/// On Linux, "unlocked" is the user's session, and `ThisDeviceOnly` means sealed to this TPM and its
/// PCRs: such an item never moves to another machine through a backup.
public enum Accessible: String, CaseIterable, Sendable, Codable {
    /// While the device is unlocked.
    case whenUnlocked
    /// From the first unlock after boot until the next boot; fits background work. The default.
    case afterFirstUnlock
    /// Always, locked or not. Not recommended.
    case always
    /// While unlocked and a passcode is set; the item is lost when the passcode is removed.
    case whenPasscodeSetThisDeviceOnly
    /// `whenUnlocked`, never leaving this device.
    case whenUnlockedThisDeviceOnly
    /// `afterFirstUnlock`, never leaving this device.
    case afterFirstUnlockThisDeviceOnly
    /// `always`, never leaving this device. Not recommended.
    case alwaysThisDeviceOnly

    /// The lock states in which an item can be read.
    public enum Availability: Sendable, CaseIterable {
        case always
        case afterFirstUnlock
        case whenUnlocked
    }

    /// The value of a seed string such as `"afterFirstUnlockThisDeviceOnly"`.
    ///
    /// - Throws: `INVALID_ARGUMENT` naming the valid values.
    public init(parsing text: String) throws(KeychainError) {
        self = try Self.parseOption(text, named: "accessible")
    }

    /// Whether the item is bound to this device (this TPM) and never restored elsewhere.
    public var isThisDeviceOnly: Bool {
        switch self {
        case .whenPasscodeSetThisDeviceOnly, .whenUnlockedThisDeviceOnly,
             .afterFirstUnlockThisDeviceOnly, .alwaysThisDeviceOnly: true
        case .whenUnlocked, .afterFirstUnlock, .always: false
        }
    }

    /// Whether a write needs a device passcode, and the item dies with it.
    public var requiresPasscode: Bool {
        self == .whenPasscodeSetThisDeviceOnly
    }

    /// When the item can be read; `whenPasscodeSetThisDeviceOnly` is readable when unlocked.
    public var availability: Availability {
        switch self {
        case .always, .alwaysThisDeviceOnly: .always
        case .afterFirstUnlock, .afterFirstUnlockThisDeviceOnly: .afterFirstUnlock
        case .whenUnlocked, .whenUnlockedThisDeviceOnly, .whenPasscodeSetThisDeviceOnly: .whenUnlocked
        }
    }
}
