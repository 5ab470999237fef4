import KeychainCLIText

/// An application id as xdg-desktop-portal hands it to a Secret portal backend, validated once at
/// the edge: what names the application's secret in the keychain.
///
/// The rule is the portal's own (`xdp_is_valid_app_id`, 1.16): Flatpak's app-id rule, except that an
/// element may start with a digit and two elements are enough (`snap.NAME`): at most 255 bytes,
/// elements of ASCII letters, digits and `_` separated by single dots, a `-` allowed in the last.
/// The portal never sends anything else for a sandboxed app; it sends `""` for a host program.
struct PortalAppID: Sendable, Hashable {
    static let maxBytes = 255
    let value: String

    /// The id, or the message a person can act on (the field bounded and escaped).
    static func parse(_ text: String) -> Result<PortalAppID, DBusError> {
        if text.isEmpty {
            return .failure(.invalidArgs("The app id is empty: the portal sends no id for a program outside a sandbox "
                                         + "(Flatpak or snap), and only a sandboxed app has a portal secret"))
        }
        let bytes = text.utf8
        guard bytes.count <= maxBytes else {
            return .failure(.invalidArgs("The app id is \(bytes.count) bytes; an app id has at most \(maxBytes)"))
        }
        let elements = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        let valid = elements.count >= 2 && elements.enumerated().allSatisfy { index, element in
            !element.isEmpty && element.allSatisfy { isNameByte($0, dash: index == elements.count - 1) }
        }
        guard valid else {
            return .failure(.invalidArgs("The app id '\(logField(bytes, limit: 64))' is not an app id: expected reverse-DNS "
                                         + "elements of letters, digits and '_' separated by dots (at least two; '-' only "
                                         + "in the last), as org.example.App"))
        }
        return .success(PortalAppID(value: text))
    }

    private static func isNameByte(_ byte: UInt8, dash: Bool) -> Bool {
        (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a) || (byte >= 0x30 && byte <= 0x39)
            || byte == UInt8(ascii: "_") || (dash && byte == UInt8(ascii: "-"))
    }
}
