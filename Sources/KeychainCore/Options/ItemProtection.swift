/// The protection one item is written with: a storage's defaults with a call's overrides, checked.
///
/// Made only through the throwing initialiser, so a value always obeys the seed's rules; the same
/// rules check a storage's options at creation and every write.
public struct ItemProtection: Sendable, Hashable {
    public let accessible: Accessible
    public let accessControl: AccessControl
    /// Seconds after a passed prompt during which reads need no new one; 0 asks at every read.
    public let authValidity: Int
    /// Recorded on the item; Linux has no iCloud, so the item is never synced.
    public let synchronizable: Bool

    /// - Throws: `INVALID_ARGUMENT` with the seed's message when the combination breaks a rule.
    public init(
        accessible: Accessible = .afterFirstUnlock,
        accessControl: AccessControl = .none,
        authValidity: Int = 0,
        synchronizable: Bool = false
    ) throws(KeychainError) {
        guard authValidity >= 0 else {
            throw .invalidArgument("Invalid authValidity: expected a whole number of seconds, 0 or more, got \(authValidity)")
        }
        // Seed (AccessControl): the CurrentSet values can't have a window, each read checks today's biometrics.
        if authValidity > 0, accessControl.isCurrentSet {
            let other: AccessControl = accessControl == .biometryCurrentSet ? .biometryAny : .biometryAnyOrPasscode
            throw .invalidArgument(
                "accessControl '\(accessControl.rawValue)' can't be used with authValidity > 0 (got \(authValidity)): "
                    + "set authValidity to 0, or use '\(other.rawValue)' to allow a window")
        }
        // Seed (Apple): a ThisDeviceOnly item never leaves the device, so it can't be synced.
        if synchronizable, accessible.isThisDeviceOnly {
            let fix = accessible.movable.map { "set synchronizable to false, or use accessible '\($0.rawValue)'" }
                ?? "set synchronizable to false"
            throw .invalidArgument(
                "synchronizable can't be used with accessible '\(accessible.rawValue)': "
                    + "a ThisDeviceOnly item never leaves this device; \(fix)")
        }
        // Seed (AccessControl): an item behind authentication can't be synchronizable.
        if synchronizable, accessControl != .none {
            throw .invalidArgument(
                "synchronizable can't be used with accessControl '\(accessControl.rawValue)': "
                    + "an item behind authentication never leaves this device; set synchronizable to false, or use accessControl 'none'")
        }
        self.accessible = accessible
        self.accessControl = accessControl
        self.authValidity = authValidity
        self.synchronizable = synchronizable
    }

    /// "<accessible>/<accessControl>", e.g. "whenUnlockedThisDeviceOnly/biometryCurrentSet", then
    /// "/<authValidity>" for the values that can have a window, e.g. "whenUnlocked/biometryAny/60".
    ///
    /// Stable: the store keys its wrapping keys by it, since these fields decide the TPM policy; the
    /// window is the item's (as Android makes it the key's), so items of different windows never
    /// share a wrapping key. Tags of two fields with a windowed value were written before windows
    /// were stored: their reads take the reading storage's window.
    public var storageTag: String {
        let base = "\(accessible.rawValue)/\(accessControl.rawValue)"
        return accessControl.takesWindow ? base + "/\(authValidity)" : base
    }

    /// The protection a storage tag names; the window is the tag's when it holds one, else `authValidity`.
    ///
    /// Nil when the tag isn't "<accessible>/<accessControl>[/<seconds>]" of seed strings, or the whole breaks a rule.
    public init?(storageTag: String, authValidity: Int = 0, synchronizable: Bool = false) {
        let parts = storageTag.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2 || parts.count == 3,
              let accessible = Accessible(rawValue: String(parts[0])),
              let accessControl = AccessControl(rawValue: String(parts[1])) else { return nil }
        var window = authValidity
        if parts.count == 3 {
            guard accessControl.takesWindow, let stored = Int(parts[2]), stored >= 0, String(stored) == parts[2] else { return nil }
            window = stored
        }
        guard let protection = try? ItemProtection(
                accessible: accessible, accessControl: accessControl,
                authValidity: window, synchronizable: synchronizable)
        else { return nil }
        self = protection
    }

    /// The window a storage tag stores (token suffix allowed); nil for tags without one: no access
    /// control, CurrentSet (never a window), or written before windows were stored.
    package static func storedWindow(ofTag tag: String) -> Int? {
        let parts = tag.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        return Int(parts[2].prefix { $0.isASCII && $0.isNumber })
    }
}

extension AccessControl {
    /// The values whose items can have an authValidity window (seed: not None, not the CurrentSet ones).
    package var takesWindow: Bool { self != .none && !isCurrentSet }
}

extension Accessible {
    /// The same availability without ThisDeviceOnly, for the fix in a message; nil when there is none.
    fileprivate var movable: Accessible? {
        switch self {
        case .whenUnlockedThisDeviceOnly: .whenUnlocked
        case .afterFirstUnlockThisDeviceOnly: .afterFirstUnlock
        case .alwaysThisDeviceOnly: .always
        case .whenPasscodeSetThisDeviceOnly: nil
        case .whenUnlocked, .afterFirstUnlock, .always: self
        }
    }
}
