import KeychainBasics

/// Whose items a storage reaches: the part of an item's name that a caller never spells.
///
/// In the store a scope is the start of the service column (`uid:N/`, `group:NAME/`, nothing for
/// this process), as keychaind has always written it, so stored items, their authenticated data,
/// token objects and TPM tickets keep their names. A service of this process's scope may not read as
/// one of keychaind's (`uid:1600/bank`): no name, however it came (a call, a bundle), reaches another
/// scope's items.
package enum ItemScope: Hashable, Sendable {
    /// This process's own store, as the process names its services.
    case process
    /// keychaind: one uid's items (the kernel's `SO_PEERCRED`, never a field of a request).
    case user(UInt32)
    /// keychaind: an access group's shared items (the caller is a member).
    case group(String)
    /// keychaind: the values it hands a service manager's units (`LoadCredential=`), the unit as the
    /// service; an administrator stores them, the manager reads them (docs/credentials.md).
    case credentials(SystemdCredentials.Manager)
    /// keychaind: a confined application's own items (a system unit, a Flatpak app: the kernel's word,
    /// `CallerIdentity`), apart from its uid's unconfined items and its other applications'.
    case application(UInt32, ConfinedApplication)

    /// The store's name of `service` in this scope.
    /// - Throws: `INVALID_ARGUMENT` for a service of this process that names one of keychaind's scopes.
    package func storeName(_ service: String) throws(KeychainError) -> String {
        switch self {
        case .process:
            if let parsed = Self.parse(service) {
                throw KeychainError.invalidArgument("Invalid service '\(service)': it begins as keychaind's store names \(parsed.0.words), "
                                                    + "and a service never chooses whose items it holds: name it without that prefix")
            }
            return service
        case .user, .group, .credentials, .application: return storePrefix + service
        }
    }

    /// What begins the store names of this scope's items (`uid:N/`, `group:NAME/`, `app:N:unit:NAME/`,
    /// `app:N:flatpak:ID/`; nothing for the process's own): what `allServices` lists. An application's
    /// prefix starts `app:`, which no other scope's does and a service of this process cannot (`storeName`).
    package var storePrefix: String {
        switch self {
        case .process: ""
        case .user(let uid): "uid:\(uid)/"
        case .group(let name): "group:\(name)/"
        case .credentials(let manager): SystemdCredentials.namespace(of: manager)
        case .application(let uid, let application): "\(Self.applicationPrefix)\(uid):\(application.storeWords)/"
        }
    }

    package static let applicationPrefix = ItemNames.applicationNamespacePrefix

    /// A store name's scope and service, when it has one of keychaind's scopes (nil: this process's).
    package static func parse(_ storeName: String) -> (ItemScope, String)? {
        let bytes = storeName.utf8
        if storeName.hasPrefix("uid:") {
            let digits = bytes.dropFirst(4).prefix { $0 >= 0x30 && $0 <= 0x39 }
            let rest = bytes.dropFirst(4 + digits.count)
            guard !digits.isEmpty, rest.first == UInt8(ascii: "/"), let uid = UInt32(String(decoding: digits, as: UTF8.self)) else {
                return nil
            }
            return (.user(uid), String(decoding: rest.dropFirst(), as: UTF8.self))
        }
        if storeName.hasPrefix("group:") {
            let name = bytes.dropFirst(6).prefix { $0 != UInt8(ascii: "/") }
            let rest = bytes.dropFirst(6 + name.count)
            guard !name.isEmpty, rest.first == UInt8(ascii: "/") else { return nil }
            return (.group(String(decoding: name, as: UTF8.self)), String(decoding: rest.dropFirst(), as: UTF8.self))
        }
        if let (manager, unit) = SystemdCredentials.parse(storeName) { return (.credentials(manager), unit) }
        if storeName.hasPrefix(applicationPrefix) { return parseApplication(bytes.dropFirst(applicationPrefix.utf8.count)) }
        return nil
    }

    /// `N:KIND:NAME/service` after `app:`.
    private static func parseApplication(_ bytes: Substring.UTF8View) -> (ItemScope, String)? {
        let digits = bytes.prefix { $0 >= 0x30 && $0 <= 0x39 }
        let rest = bytes.dropFirst(digits.count)
        guard !digits.isEmpty, rest.first == UInt8(ascii: ":"), let uid = UInt32(String(decoding: digits, as: UTF8.self)),
              let slash = rest.firstIndex(of: UInt8(ascii: "/")),
              let application = ConfinedApplication(storeWords: Substring(rest[rest.index(after: rest.startIndex)..<slash]))
        else { return nil }
        return (.application(uid, application), String(decoding: rest[rest.index(after: slash)...], as: UTF8.self))
    }

    /// A store name as messages and prompts show it: the caller's service, never the scope before it.
    package static func shown(_ storeName: String) -> String { parse(storeName)?.1 ?? storeName }

    package var words: String {
        switch self {
        case .process: "this process"
        case .user(let uid): "uid \(uid)'s items"
        case .group(let name): "the items of the access group '\(name)'"
        case .credentials(let manager): "the systemd credentials of the \(manager)"
        case .application(let uid, let application): "the items of \(application.words) of uid \(uid)"
        }
    }

    package var isGroup: Bool { if case .group = self { true } else { false } }
}
