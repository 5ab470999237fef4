import KeychainBasics

/// The items keychaind hands to systemd units (`LoadCredential=ID:/run/keychain/credentials.sock`,
/// docs/credentials.md): the item of service UNIT and key ID in the scope `ItemScope.credentials` of
/// the unit's manager, kept apart from every user's and access group's items.
///
/// A system unit's credentials are the system manager's (uid 0); a user manager's (uid N) are its own,
/// for its own units: the manager is the peer's uid, never a part of the request. Administrators reach
/// them through keychaind as a storage whose access group is `accessGroup(for:)`, a name no
/// `groups.d` file can have (`AccessGroups.check` refuses a leading dot).
package enum SystemdCredentials {
    package enum Manager: Sendable, Hashable, CustomStringConvertible {
        case system
        case user(UInt32)

        /// The manager of a connection from `uid` (SO_PEERCRED): 0 is the system manager.
        /// - Important: any process of uid N passes for uid N's manager (nothing tells them apart: the
        ///   manager's forked child connects, in cgroups delegated to the user), so uid N's namespace holds
        ///   only what uid N stores for itself (docs/credentials.md, "Who can ask for which credential").
        package init(uid: UInt32) { self = uid == 0 ? .system : .user(uid) }

        /// The manager `word` names, as `word` spells it; nil for any other text (`uid:01`, `root`).
        package init?<S: StringProtocol>(word: S) {
            if word == "system" { self = .system; return }
            guard word.hasPrefix("uid:"), let uid = UInt32(word.dropFirst(4)), "uid:\(uid)" == word else { return nil }
            self = .user(uid)
        }

        /// How the store's credentials namespaces and keychain-journal-relay's datagrams name it:
        /// `system`, or `uid:N` (N in decimal, no leading zero).
        package var word: String {
            switch self {
            case .system: "system"
            case .user(let uid): "uid:\(uid)"
            }
        }

        package var description: String {
            switch self {
            case .system: "system manager"
            case .user(let uid): "user manager of uid \(uid)"
            }
        }
    }

    package static let accessGroupPrefix = ".systemd-credentials"

    /// The access group an administrator's storage names to reach `manager`'s credentials.
    package static func accessGroup(for manager: Manager) -> String {
        switch manager {
        case .system: accessGroupPrefix
        case .user(let uid): accessGroupPrefix + ".uid." + String(uid)
        }
    }

    /// The manager whose credentials `accessGroup` names, nil for any other group.
    package static func manager(accessGroup: String) -> Manager? {
        if accessGroup == accessGroupPrefix { return .system }
        let prefix = accessGroupPrefix + ".uid."
        guard accessGroup.hasPrefix(prefix), let uid = UInt32(accessGroup.dropFirst(prefix.count)),
              String(uid) == accessGroup.dropFirst(prefix.count), uid != 0 else { return nil }
        return .user(uid)
    }

    /// Where the store keeps `manager`'s credentials: before the unit's name, as `uid:N/` is before a user's services.
    package static func namespace(of manager: Manager) -> String {
        ItemNames.credentialsNamespacePrefix + manager.word + "/"
    }

    /// The manager and unit of a store name in a credentials namespace, nil for any other name.
    package static func parse(_ storeName: String) -> (Manager, String)? {
        guard storeName.hasPrefix(ItemNames.credentialsNamespacePrefix) else { return nil }
        let rest = storeName.dropFirst(ItemNames.credentialsNamespacePrefix.count)
        guard let slash = rest.firstIndex(of: "/"), let manager = Manager(word: rest[..<slash]) else { return nil }
        return (manager, String(rest[rest.index(after: slash)...]))
    }

    /// The storage of `unit`'s credentials as `manager` asks for them at the unit's start.
    /// - Throws: `INVALID_ARGUMENT` for a unit name no service can have.
    package static func storage(unit: String, manager: Manager) throws(KeychainError) -> StorageRef {
        try StorageRef(scope: .credentials(manager), options: KeychainOptions(service: unit), defaultService: nil)
    }

    /// The unit types systemd knows (`unit_type_from_string`): a unit name ends in one of them.
    package static let unitSuffixes: Set<String> = ["service", "socket", "target", "device", "mount", "automount", "swap", "timer", "path",
                                            "slice", "scope"]

    /// `INVALID_ARGUMENT` naming the rule unless `unit` is a name systemd gives a unit that runs
    /// (`unit_name_is_valid` with `UNIT_NAME_PLAIN | UNIT_NAME_INSTANCE`): at most 255 bytes of
    /// `[a-zA-Z0-9:_.\\-@]`, a suffix such as `.service`, and before it a name, or `prefix@instance`.
    package static func checkUnitName(_ unit: String) throws(KeychainError) {
        func refuse(_ rule: String) -> KeychainError {
            KeychainError.invalidArgument("Invalid unit name '\(unit)': \(rule) (systemd's unit-name rules; e.g. dbapp.service)")
        }
        let bytes = Array(unit.utf8)
        guard !bytes.isEmpty, bytes.count <= 255 else { throw refuse("it must be 1 to 255 bytes long") }
        guard let dot = bytes.lastIndex(of: UInt8(ascii: ".")), dot > 0,
              unitSuffixes.contains(String(decoding: bytes[(dot + 1)...], as: UTF8.self)) else {
            throw refuse("it must end in a unit type: ." + unitSuffixes.sorted().joined(separator: ", ."))
        }
        let allowed = Set(Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_.\\@".utf8))
        guard bytes[..<dot].allSatisfy(allowed.contains) else {
            throw refuse("only letters, digits and : - _ . \\ @ may come before the type")
        }
        if let at = bytes.firstIndex(of: UInt8(ascii: "@")) {
            guard at > 0 else { throw refuse("a name must come before @") }
            guard dot > at + 1 else { throw refuse("a template (NAME@.TYPE) never runs: name its instance, NAME@INSTANCE.TYPE") }
        }
    }

    /// `INVALID_ARGUMENT` naming the rule unless `id` is a credential name systemd accepts
    /// (`credential_name_valid`: a file name and an fd name): 1 to 255 bytes of printable ASCII,
    /// no `/` or `:`, and not `.` or `..`.
    package static func checkCredentialName(_ id: String) throws(KeychainError) {
        func refuse(_ rule: String) -> KeychainError {
            KeychainError.invalidArgument("Invalid credential ID '\(id)': \(rule) (systemd's credential-name rules)")
        }
        let bytes = Array(id.utf8)
        guard !bytes.isEmpty, bytes.count <= 255 else { throw refuse("it must be 1 to 255 bytes long") }
        guard id != ".", id != ".." else { throw refuse("it may not be . or ..") }
        guard !bytes.contains(UInt8(ascii: "/")) else { throw refuse("it may not contain /") }
        guard bytes.allSatisfy({ $0 >= 0x20 && $0 <= 0x7E && $0 != UInt8(ascii: ":") }) else {
            throw refuse("only printable ASCII other than : may be used")
        }
    }
}
