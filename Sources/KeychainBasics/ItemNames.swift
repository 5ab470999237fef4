/// The bounds of an item's names: the one check that every way in shares (a write through the
/// library or keychaind, `import`, `restore`, `backup`, and `Transaction.putItem` itself), so that
/// nothing the store holds is refused by a restore of its backup.
///
/// Lengths are counted as the seed's JavaScript counts them (`string.length`, UTF-16 code units):
/// a letter with 300 combining accents is one character to Swift and 301 to the seed. 256 code
/// units are at most 768 UTF-8 bytes (a code unit of the BMP takes up to 3 bytes, a surrogate pair
/// 4 bytes for 2 units), so the service's length bounds its bytes too.
///
/// Each check returns the seed's `INVALID_ARGUMENT` message, or nil when the name is valid.
public enum ItemNames {
    /// The longest service the seed accepts, in characters (UTF-16 code units).
    public static let maxServiceLength = 256
    /// The longest access group, in characters (UTF-16 code units), as for a service.
    public static let maxAccessGroupLength = 256
    public static let maxKeyBytes = 1024
    public static let maxLabelBytes = 4096

    /// keychaind's namespaces before a caller's service in the store: `uid:N/`, `app:N:KIND:NAME/` and `group:NAME/`;
    /// `credential:system/` and `credential:uid:N/` before a unit's name (systemd credentials).
    public static let uidNamespacePrefix = "uid:"
    public static let groupNamespacePrefix = "group:"
    public static let credentialsNamespacePrefix = "credential:"
    /// A confined application's items: `app:N:unit:NAME.service/`, `app:N:flatpak:ID/` (at most 255
    /// bytes of name, so the namespace is at most 300 characters).
    public static let applicationNamespacePrefix = "app:"

    public static func serviceProblem(_ service: String) -> String? {
        let length = service.utf16.count
        guard length == 0 || length > maxServiceLength else { return nil }
        let got = length == 0 ? "an empty string" : "\(length) characters"
        return "Invalid service: expected a non-empty string of up to \(maxServiceLength) characters, got \(got)"
    }

    public static func accessGroupProblem(_ group: String) -> String? {
        let length = group.utf16.count
        if length == 0 {
            return "Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group"
        }
        guard length > maxAccessGroupLength else { return nil }
        return "Invalid accessGroup: expected a non-empty string of up to \(maxAccessGroupLength) characters, got \(length) characters"
    }

    public static func keyProblem(_ key: String) -> String? {
        let bytes = key.utf8.count
        guard bytes == 0 || bytes > maxKeyBytes else { return nil }
        return "Invalid key: expected a non-empty string of up to \(maxKeyBytes) bytes, got \(bytes == 0 ? "an empty string" : "\(bytes) bytes")"
    }

    public static func labelProblem(_ label: String?) -> String? {
        guard let bytes = label?.utf8.count, bytes > maxLabelBytes else { return nil }
        return "Invalid label: expected a string of up to \(maxLabelBytes) bytes, got \(bytes) bytes"
    }

    /// A service as the store names it: a caller's service, or keychaind's namespace before one.
    public static func storedServiceProblem(_ stored: String) -> String? {
        guard let problem = serviceProblem(stored) else { return nil }
        let units = Array(stored.utf16)
        let uid = Array(uidNamespacePrefix.utf16), group = Array(groupNamespacePrefix.utf16)
        let slash = "/".utf16.first!
        let system = Array((credentialsNamespacePrefix + "system/").utf16)
        if units.starts(with: system) { return serviceProblem(String(decoding: units[system.count...], as: UTF16.self)) }
        let userUnits = Array((credentialsNamespacePrefix + uidNamespacePrefix).utf16)
        if units.starts(with: userUnits), let end = units[userUnits.count...].firstIndex(of: slash), end > userUnits.count,
           units[userUnits.count..<end].allSatisfy({ (0x30...0x39).contains($0) }) {
            return serviceProblem(String(decoding: units[(end + 1)...], as: UTF16.self))
        }
        if units.starts(with: uid), let end = units[uid.count...].firstIndex(of: slash), end > uid.count,
           units[uid.count..<end].allSatisfy({ (0x30...0x39).contains($0) }) {
            return serviceProblem(String(decoding: units[(end + 1)...], as: UTF16.self))
        }
        let application = Array(applicationNamespacePrefix.utf16)
        if units.starts(with: application), let end = units[application.count...].firstIndex(of: slash), end <= 300 {
            return serviceProblem(String(decoding: units[(end + 1)...], as: UTF16.self))
        }
        if units.starts(with: group) {
            // A group's name may hold a slash: some split must give a valid group and a valid service.
            var last = problem
            for end in units.indices.dropFirst(group.count) where units[end] == slash {
                let name = String(decoding: units[group.count..<end], as: UTF16.self)
                let rest = String(decoding: units[(end + 1)...], as: UTF16.self)
                guard let why = accessGroupProblem(name) ?? serviceProblem(rest) else { return nil }
                last = why
            }
            return last
        }
        return problem
    }

    /// What `putItem` refuses: the first name of the record out of its bounds.
    public static func problem(service: String, key: String, label: String?) -> String? {
        storedServiceProblem(service) ?? keyProblem(key) ?? labelProblem(label)
    }
}
