import Keychain

/// Bringing another provider's items (gnome-keyring's) into this provider's store, read over the
/// session bus while that provider owns org.freedesktop.secrets (docs/secret-service.md, "Importing").
extension SecretServiceProvider {
    /// What an import did: collections read, items written, items already here (a re-run), and the
    /// collections left locked (their prompt was dismissed): nothing of those was imported.
    public struct ImportReport: Sendable {
        public var collections = 0
        public var imported = 0
        public var alreadyHere = 0
        public var leftLocked: [String] = []
    }

    /// Reads every collection of the provider that owns the name on `source` (except its in-memory
    /// `session`), each locked one unlocked through that provider's own prompt, and writes each item
    /// (label, attributes, content type, secret) into the collection of the same label here (`login`
    /// for its `login`), made when missing. An item whose label, attributes and secret are already
    /// in that collection is not written again. Secrets cross the bus only in a DH session.
    public func importItems(from source: Bus, promptTimeout: Duration = .seconds(300)) throws(DBusError) -> ImportReport {
        let name = Self.busName
        func get(_ path: String, _ interface: String, _ property: String) throws(DBusError) -> DBusValue {
            guard let value = try source.call(name, path, Self.propertiesInterface, "Get", [.string(interface), .string(property)]).first?.variantContent else {
                throw .failed("\(path) answered Get(\(property)) with no value")
            }
            return value
        }
        let client = try SessionCrypto.keyPair()
        let opened = try source.call(name, Self.base, Self.serviceInterface, "OpenSession",
                                     [.string("dh-ietf1024-sha256-aes128-cbc-pkcs7"), .variant(.bytes(SecureBytes(copying: client.publicKey)))])
        guard opened.count == 2, case .bytes(let serverPublic)? = opened[0].variantContent, case .objectPath(let session) = opened[1] else {
            throw .failed("The provider that owns \(name) opened no DH session")
        }
        let key = try SessionCrypto.sessionKey(client, peerPublic: serverPublic)
        defer { _ = try? source.call(name, session, Self.sessionInterface, "Close") }

        var report = ImportReport()
        guard let paths = try get(Self.base, Self.serviceInterface, "Collections").pathList else {
            throw .failed("The provider's Collections is not a list of paths")
        }
        for path in paths.sorted() where path != Self.collectionPrefix + "session" {
            let label = try get(path, Self.collectionInterface, "Label").string ?? ""
            if try get(path, Self.collectionInterface, "Locked").bool {
                let unlock = try source.call(name, Self.base, Self.serviceInterface, "Unlock", [.paths([path])])
                if unlock.count == 2, case .objectPath(let prompt) = unlock[1], prompt != "/" {
                    _ = try source.callAwaitingSignal(name, prompt, Self.promptInterface, "Prompt", [.string("")],
                                                      signal: (Self.promptInterface, "Completed"), timeout: promptTimeout)
                }
                guard try !get(path, Self.collectionInterface, "Locked").bool else {
                    report.leftLocked.append(label.isEmpty ? path : label)
                    continue
                }
            }
            report.collections += 1
            let target = try importTarget(label: label, sourcePath: path)
            let items = try get(path, Self.collectionInterface, "Items").pathList ?? []
            guard !items.isEmpty else { continue }
            let secrets = try source.call(name, Self.base, Self.serviceInterface, "GetSecrets", [.paths(items), .objectPath(session)])
            var byItem: [String: DBusValue] = [:]
            for case .dictEntry(.objectPath(let item), let secret) in secrets.first?.arrayElements ?? [] { byItem[item] = secret }
            for item in items {
                guard case .structure(let fields)? = byItem[item], fields.count == 4, case .bytes(let iv) = fields[1],
                      case .bytes(let ciphertext) = fields[2], case .string(let contentType) = fields[3] else {
                    throw .failed("The provider gave no secret for \(item)")
                }
                let secret = try SessionCrypto.decrypt(ciphertext, iv: iv, key: key)
                let itemLabel = try get(item, Self.itemInterface, "Label").string ?? ""
                let attributes = try get(item, Self.itemInterface, "Attributes").stringDictionary ?? [:]
                try Self.check(label: itemLabel, attributes: attributes)
                let hashes = hasher.hashes(attributes)
                var same = false
                for id in target.items.matching(hashes) where !same && target.items[id]?.hashes == hashes {
                    let here = try open(target, id)
                    same = here.label == itemLabel && here.secret == secret
                }
                if same {
                    report.alreadyHere += 1
                    continue
                }
                try write(target, nextItemID(target), SealedItem(label: itemLabel, contentType: contentType, attributes: attributes, secret: secret),
                          hashes: hashes)
                report.imported += 1
            }
        }
        return report
    }

    /// Our collection for another provider's: `login` for its `login`, else the one of the same label, made when missing.
    private func importTarget(label: String, sourcePath: String) throws(DBusError) -> Collection {
        if sourcePath == Self.collectionPrefix + "login", let login = collections["login"] { return login }
        if let same = collections.values.first(where: { $0.storage != nil && $0.record.label == label }) { return same }
        let path = try createCollection([("org.freedesktop.Secret.Collection.Label", .string(label))], alias: "")
        guard case .collection(let made) = try resolve(path) else { throw .failed("The collection made for \(label) is missing") }
        return made
    }
}

extension DBusValue {
    var arrayElements: [DBusValue]? { if case .array(_, let values) = self { values } else { nil } }
}
