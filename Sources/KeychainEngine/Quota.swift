import KeychainCore
import KeychainStore
import SecureMemory
import KeychainBasics

/// The engine's quota on each namespace of a server's scopes (keychaind's uids, access groups and
/// credentials), so that one uid cannot take the store's space the others need (a quota of items and
/// bytes; the engine's time is the daemon's `FairShare`). docs/daemon.md, "Per-user limits".
package struct UserLimits: Sendable, Equatable {
    /// Items one namespace (a uid's own items, or one access group's) may hold.
    package var quotaItems = 4096
    /// Bytes one namespace may hold: its items' stored fields and its wrapping keys. 32 MiB holds the
    /// largest value (16 MiB) beside many small ones; a device with a thousand active users would
    /// need 32 GiB only if every one of them filled it.
    package var quotaBytes = 32 << 20

    package init() {}

    /// How keychaind's command line says the quota, for the messages that name the fix.
    static let flags = "keychaind --quota-items N --quota-bytes N"
}

/// The scope whose quota a stored service counts against: a uid's items or an access group's
/// through keychaind; nil for a service of the in-process library, which has no quota. A confined
/// application's items count against its uid's quota: a user who can make sandboxes with any app
/// id (bwrap) gains no room by it.
func quotaScope(of service: String) -> ItemScope? {
    guard let scope = ItemScope.parse(service)?.0 else { return nil }
    if case .application(let uid, _) = scope { return .user(uid) }
    return scope
}

extension ItemScope {
    /// Whose items a quota message speaks of.
    var quotaHolder: String {
        switch self {
        case .process: "This process"
        case .user(let uid): "uid \(uid)"
        case .group(let name): "The access group '\(name)'"
        case .credentials(let manager): "The \(manager)'s systemd credentials"
        case .application(let uid, let application): "\(application.words.prefix(1).uppercased())\(application.words.dropFirst()) of uid \(uid)"
        }
    }

    /// The ranges of store names the quota measures: a uid's own items and its applications'
    /// (`app:N:`), one scope's prefix for the others.
    var quotaPrefixes: [String] {
        if case .user(let uid) = self { return [storePrefix, "\(Self.applicationPrefix)\(uid):"] }
        return [storePrefix]
    }

    /// How the holder gives space back, for the quota's message.
    var quotaRemedy: String {
        switch self {
        case .credentials(.system): "Remove credentials no longer needed (keychainctl credential ls UNIT, credential rm UNIT ID)"
        case .credentials(.user): "Remove credentials no longer needed (keychainctl credential ls --user UNIT, credential rm --user UNIT ID)"
        default: "Remove items no longer needed (keychainctl rm, clear)"
        }
    }
}

extension KeychainError.Code {
    /// keychaind: the caller's namespace (its uid's items, or an access group's) would hold more
    /// items or bytes than the daemon's quota allows; nothing was written.
    public static let quotaExceeded = KeychainError.Code(rawValue: "QUOTA_EXCEEDED")
}

extension Engine {
    /// Refuses a write that would take the service's namespace past the daemon's quota
    /// (`quota`); a write that leaves the namespace no larger (a smaller value over
    /// a larger one, after the quota was lowered) is let through.
    ///
    /// - Parameters:
    ///   - usage: what the namespace holds now (the write transaction's view, or a read before the
    ///     TPM work, where `newKey` is not known yet).
    ///   - existing: the item the write replaces.
    func checkQuota(service: String, key: String, usage: StoreUsage, existing: ItemRecord?, newItemBytes: Int,
                    newKeyBytes: Int) throws(KeychainError) {
        guard let limits = quota, let scope = quotaScope(of: service) else { return }
        let items = usage.items + (existing == nil ? 1 : 0)
        let bytes = usage.bytes - (existing.map(StoreUsage.bytes(of:)) ?? 0) + newItemBytes + newKeyBytes
        let grows = items > usage.items || bytes > usage.bytes
        guard grows, items > limits.quotaItems || bytes > limits.quotaBytes else { return }
        let limit = items > limits.quotaItems ? "\(limits.quotaItems) items" : "\(Self.size(limits.quotaBytes))"
        throw KeychainError(.quotaExceeded, "\(scope.quotaHolder) would hold more than the keychain service's quota of \(limit) with item "
                            + "'\(key)' (it holds \(usage.items) items in \(Self.size(usage.bytes)); this write is "
                            + "\(Self.size(newItemBytes + newKeyBytes))); nothing was written. \(scope.quotaRemedy), "
                            + "or ask the administrator to raise the quota (\(UserLimits.flags))")
    }

    /// The bytes an item of `value` takes in `StoreUsage`, before it is sealed: the envelope adds the
    /// writer's public key, the salt, the nonce and the AEAD tag.
    static func itemBytes(service: String, key: String, label: String?, valueCount: Int) -> Int {
        service.utf8.count + key.utf8.count + (label?.utf8.count ?? 0) + Sodium.x25519KeyLength + ItemEnvelope.saltLength
            + Sodium.xchachaNonceLength + valueCount + Sodium.xchachaTagLength
    }

    /// What a namespace held when a write measured it, and the store's data version then: the write's
    /// transaction takes it as is when nothing was committed since (the version is the same once the
    /// transaction holds the write lock), so a write scans its namespace once.
    struct QuotaMeasure {
        let usage: StoreUsage
        let dataVersion: Int64
    }

    /// The quota check before any TPM or token work: a write over the quota costs no TPM command.
    /// - Returns: the measure, for the write's transaction; nil when no quota applies.
    func checkQuotaBeforeSealing(_ value: SecureBytes, service: String, key: String, label: String?,
                                 store: Store) throws(KeychainError) -> QuotaMeasure? {
        guard quota != nil, let scope = quotaScope(of: service) else { return nil }
        // The version first: a commit between it and the scan makes the transaction measure again.
        let (version, usage, existing) = try read {
            (try store.dataVersion(), try store.usage(servicePrefixes: scope.quotaPrefixes), try store.item(service: service, key: key))
        }
        try checkQuota(service: service, key: key, usage: usage, existing: existing,
                       newItemBytes: Self.itemBytes(service: service, key: key, label: label ?? existing?.label, valueCount: value.count),
                       newKeyBytes: 0)
        return QuotaMeasure(usage: usage, dataVersion: version)
    }

    /// "12.5 MiB", "300 bytes".
    static func size(_ bytes: Int) -> String {
        if bytes < 1024 { return "\(bytes) bytes" }
        if bytes < 1 << 20 { return oneDecimal(Double(bytes) / 1024) + " KiB" }
        return oneDecimal(Double(bytes) / Double(1 << 20)) + " MiB"
    }
}
