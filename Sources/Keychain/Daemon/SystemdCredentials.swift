import KeychainStore

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

        package var description: String {
            switch self {
            case .system: "system manager"
            case .user(let uid): "user manager of uid \(uid)"
            }
        }
    }

    static let accessGroupPrefix = ".systemd-credentials"

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
    static func namespace(of manager: Manager) -> String {
        switch manager {
        case .system: ItemNames.credentialsNamespacePrefix + "system/"
        case .user(let uid): ItemNames.credentialsNamespacePrefix + "uid:\(uid)/"
        }
    }

    /// The manager and unit of a store name in a credentials namespace, nil for any other name.
    static func parse(_ storeName: String) -> (Manager, String)? {
        guard storeName.hasPrefix(ItemNames.credentialsNamespacePrefix) else { return nil }
        let rest = storeName.dropFirst(ItemNames.credentialsNamespacePrefix.count)
        if rest.hasPrefix("system/") { return (.system, String(rest.dropFirst("system/".count))) }
        guard rest.hasPrefix("uid:"), let slash = rest.firstIndex(of: "/") else { return nil }
        let digits = rest[rest.index(rest.startIndex, offsetBy: 4)..<slash]
        guard let uid = UInt32(digits), String(uid) == digits else { return nil }
        return (.user(uid), String(rest[rest.index(after: slash)...]))
    }

    /// The storage of `unit`'s credentials as `manager` asks for them at the unit's start.
    /// - Throws: `INVALID_ARGUMENT` for a unit name no service can have.
    package static func storage(unit: String, manager: Manager) throws(KeychainError) -> StorageRef {
        try StorageRef(scope: .credentials(manager), options: KeychainOptions(service: unit), defaultService: nil)
    }

    /// The message for a caller who may not administer `manager`'s credentials.
    static func refusal(_ peer: Peer, for manager: Manager) -> KeychainError {
        switch manager {
        case .system:
            KeychainError(.accessDenied, "Only root or a member of the access group '\(AccessGroups.adminGroup)' may store, read, list "
                          + "or remove systemd credentials; uid \(peer.uid) is neither")
        case .user(let uid):
            KeychainError(.accessDenied, "Only uid \(uid), root or a member of the access group '\(AccessGroups.adminGroup)' may store, "
                          + "read, list or remove the systemd credentials of uid \(uid)'s user units; uid \(peer.uid) is none of them "
                          + "(your own user units' are `keychainctl credential … --user`)")
        }
    }
}
