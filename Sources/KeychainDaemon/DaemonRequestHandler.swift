import KeychainEngine
import FoundationEssentials
import KeychainWire
import SecureMemory

/// A storage call's options as a request carries them: whether its service is the client's default
/// (`WireStorageOptions.serviceIsDefault`), which a confined application's own id replaces.
package struct RequestOptions: Sendable {
    package var options: KeychainOptions
    package var serviceIsDefault: Bool
}

/// keychaind's requests as calls of the keychain API: each wire operation is one `KeychainService`
/// call in the caller's scope (`uid N`, its confined application's, or an access group it is a
/// member of), with the options
/// checked once, here, where they enter. Errors go back as the service threw them.
///
/// No sockets here: `DaemonServer` reads the frames and does the prompts' I/O, and any other
/// listener can hand its requests to `respond` (or a typed scope to `storageCall`) the same way.
package struct DaemonRequestHandler: Sendable {
    package let service: any KeychainService
    package let groups: AccessGroups

    package init(service: any KeychainService, groups: AccessGroups) {
        (self.service, self.groups) = (service, groups)
    }

    /// The reply to one request of `peer`.
    /// - Parameters:
    ///   - options: decodes the request's storage options (keychaind keeps a connection's last decoding).
    ///   - authenticator: the caller's authenticator for a read that carries `attempts` (the client has one).
    package func respond(to request: WireMessage, from peer: Peer,
                         options: ([UInt8]?) throws(KeychainError) -> RequestOptions?,
                         authenticator: (_ attemptsPerRead: Int) -> any Authenticator) async -> WireMessage {
        do throws(KeychainError) {
            guard let op = WireOp(rawValue: request.kind), !Self.unknownForTests.contains(request.kind) else {
                throw KeychainError(.invalidArgument, "The keychain service does not know request \(request.kind): update the client or the service")
            }
            if op.needsAdmin && !groups.isAdmin(peer) {
                let what = switch op {
                case .lock: "lock the device (it locks it for every user; unlocking needs only the passcode)"
                case .enrolledFingers: "list the enrolled fingers' names (biometryTypes and canUseAccessControl answer everyone)"
                case .takeTPMCommandCount: "read and reset the TPM command count (it counts every user's calls)"
                default: "change the device (passcode, fingers, initialize)"
                }
                throw KeychainError(.accessDenied, "Only root or a member of the access group '\(AccessGroups.adminGroup)' may \(what); "
                                    + "uid \(peer.uid) is neither")
            }
            // The caller's failures (reader, passcode) count against its own budgets.
            let caller = DaemonRequestHandler(service: service.serving(Caller(uid: peer.uid, isAdmin: { [groups] in groups.isAdmin(peer) })),
                                              groups: groups)
            if op == .importBundle { return try await caller.importCall(request, in: try scope(of: KeychainOptions(), for: peer)) }
            guard op.isStorageCall else { return try await caller.deviceCall(op, request) }
            let fields = try wire { () throws(WireError) in try WireStorage(from: request) }
            guard let options = try options(fields.options), let storage = try storage(options, for: peer) else {
                throw KeychainError(.invalidArgument, "The keychain service got a storage call without its options")
            }
            return try await caller.storageCall(op, request, in: storage, authenticator: authenticator)
        } catch {
            return error.wireMessage
        }
    }

    #if DEBUG
    /// Test hook (debug builds): `KEYCHAIN_TEST_UNKNOWN_OPS=12,…` makes keychaind answer those requests
    /// as a keychaind that predates them does (a client's fallback is tested against a real daemon).
    private static let unknownForTests = Set((ProcessInfo.processInfo.environment["KEYCHAIN_TEST_UNKNOWN_OPS"] ?? "")
        .split(separator: ",").compactMap { UInt8($0) })
    #else
    private static let unknownForTests: Set<UInt8> = []
    #endif

    /// The reply to a read the service answers at once (`KeychainService.warmItem`: a key it opened,
    /// no TPM, prompt or write), made on the caller's thread; nil for every other request, and for any
    /// read that needs more (or fails): `respond` answers those, its checks and errors included.
    package func respondAtOnce(to request: WireMessage, from peer: Peer,
                               options: ([UInt8]?) throws(KeychainError) -> RequestOptions?) -> WireMessage? {
        guard request.kind == WireOp.getItem.rawValue else { return nil }
        do throws(KeychainError) {
            let fields = try wire { () throws(WireError) in try WireStorage(from: request) }
            guard let options = try options(fields.options), let key = fields.key, let storage = try storage(options, for: peer) else {
                return nil
            }
            guard let read = self.service.warmItem(key, in: storage) else { return nil }
            if case .value(let value) = read { return WireCall.getItem.reply(WireBytes(value.wireBytes)) }
            return WireCall.getItem.reply(WireBytes(nil))
        } catch {
            return nil
        }
    }

    /// The storage a request's options name for `peer`; nil when they name no service. A confined
    /// application's default service is its own id, the kernel's (`CallerIdentity`), never the one
    /// its client sent (`KEYCHAIN_APP_ID`); an unconfined caller's is the one its client sent.
    package func storage(_ request: RequestOptions, for peer: Peer) throws(KeychainError) -> StorageRef? {
        var options = request.options
        if request.serviceIsDefault, let application = peer.application { options.service = application.defaultService }
        guard let service = options.service else { return nil }
        return try StorageRef(scope: try scope(of: options, for: peer), options: options, defaultService: service)
    }

    /// The caller's own items (its confined application's, when it is one), or its access group's
    /// when it names one it is a member of; a service manager's systemd credentials for root and the
    /// `admin` group (`SystemdCredentials.accessGroup`), and a user's own manager's for that user.
    package func scope(of options: KeychainOptions, for peer: Peer) throws(KeychainError) -> ItemScope {
        guard let group = options.accessGroup else {
            guard let application = peer.application else { return .user(peer.uid) }
            return .application(peer.uid, application)
        }
        if let manager = SystemdCredentials.manager(accessGroup: group) {
            // A user's own manager's credentials are its unconfined programs' (a sandboxed app's are its items).
            guard (manager == .user(peer.uid) && !peer.isSandboxed) || groups.isAdmin(peer) else {
                throw SystemdCredentials.refusal(peer, for: manager)
            }
            return .credentials(manager)
        }
        guard try groups.isMember(peer, of: group) else {
            let who = peer.application.map { "\($0.words) (uid \(peer.uid))" } ?? "uid \(peer.uid)"
            let line = peer.application.map { application -> String in
                switch application {
                case .unit(let name): " as 'unit \(name)'"
                case .flatpak(let id): " as 'app \(id)'"
                }
            } ?? ""
            throw KeychainError(.accessDenied, "\(who) is not a member of the access group '\(group)' (or there is no such "
                                + "group): ask the administrator to add it to groups.d/\(group).conf\(line)")
        }
        return .group(group)
    }

    /// One storage call of `request` (`op`) in `storage`'s scope; the reply.
    /// - Parameter authenticator: the caller's, for a read that carries `attempts` (the client has one).
    package func storageCall(_ op: WireOp, _ request: WireMessage, in storage: StorageRef,
                             authenticator: (_ attemptsPerRead: Int) -> any Authenticator) async throws(KeychainError) -> WireMessage {
        func asker(_ attempts: UInt64?) -> (any Authenticator)? { attempts.map { authenticator(Int(min($0, 10))) } }
        func key<Reply>(_ call: WireCall<WireStorage, Reply>) throws(KeychainError) -> String { try fields(call, request).key ?? "" }
        switch op {
        case .setItem:
            // The value's bytes are the request's (keychaind wipes it); the service gets them in secure memory.
            let fields = try fields(.setItem, request)
            let options = try wire { () throws(WireError) in try SetItemOptions(wire: fields.options) }
            try await service.setItem(fields.storage.key ?? "", SecureBytes(copying: fields.value), options: options, in: storage)
            return WireNone.reply
        case .getItem:
            let fields = try fields(.getItem, request)
            let value = try await service.getItem(fields.storage.key ?? "", options: fields.prompt.map { GetItemOptions(prompt: Prompt(wire: $0)) },
                                                  in: storage, authenticator: asker(fields.attempts))
            return WireCall.getItem.reply(WireBytes(value?.wireBytes))
        case .getItems:
            let fields = try fields(.getItems, request)
            return try await batchRead(fields.keys, in: storage, authenticator: asker(fields.attempts))
        case .hasItem: return WireCall.hasItem.reply(WireFlag(try await service.hasItem(try key(.hasItem), in: storage)))
        case .removeItem:
            try await service.removeItem(try key(.removeItem), in: storage)
            return WireNone.reply
        case .clear:
            try await service.clear(storage)
            return WireNone.reply
        case .allKeys: return WireCall.allKeys.reply(WireJSONResult(WireJSON.encode(try await service.allKeys(in: storage))))
        case .allServices: return WireCall.allServices.reply(WireJSONResult(WireJSON.encode(try await service.allServices(in: storage))))
        case .itemInfo:
            let info = try await service.itemInfo(try key(.itemInfo), in: storage)
            return WireCall.itemInfo.reply(WireJSONResult(info.map { WireJSON.encode($0) }))
        case .storageCanUse:
            let value = try accessControl(try fields(.storageCanUse, request))
            return WireCall.storageCanUse.reply(WireJSONResult(WireJSON.encode(try await service.canUseAccessControl(value, in: storage))))
        case .endWindows:
            try await service.endWindows(in: storage)
            return WireNone.reply
        case .attestKey:
            let document = try await service.attestKey(nonce: try fields(.attestKey, request).nonce, in: storage).json()
            return WireCall.attestKey.reply(WireBytes([UInt8](document)))
        default: throw KeychainError(.internal, "not a storage call: \(op)")
        }
    }

    /// A batch read: each key's outcome as `getItem`'s reply, in order, up to `WireList.replyBudget`
    /// bytes (at least one); the client asks again for the keys left out.
    private func batchRead(_ keys: [String], in storage: StorageRef,
                           authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        guard (1...WireList.maxKeys).contains(keys.count) else {
            throw KeychainError(.invalidArgument, "A batch read names 1 to \(WireList.maxKeys) keys, got \(keys.count)")
        }
        var outcomes = WireOutcomes([])
        var size = 0
        defer { outcomes.wipe() }
        // One key at a time, stopping at the budget: a batch never holds more than one value beyond its reply,
        // and a key left out is not read (nor prompted for) until the client asks again.
        for key in keys {
            var outcome: WireMessage
            do throws(KeychainError) {
                let value = try await service.getItem(key, options: nil, in: storage, authenticator: authenticator)
                outcome = WireCall.getItem.reply(WireBytes(value?.wireBytes))
            } catch {
                outcome = error.wireMessage
            }
            defer { outcome.wipe() }
            var bytes = outcome.encoded()
            guard outcomes.outcomes.isEmpty || size + bytes.count <= WireList.replyBudget else {
                bytes.wipe()
                break
            }
            size += bytes.count + 4
            outcomes.outcomes.append(bytes)
        }
        return WireCall.getItems.reply(outcomes)
    }

    /// One device call; the reply. Who may make it was checked (`WireOp.needsAdmin`).
    package func deviceCall(_ op: WireOp, _ request: WireMessage) async throws(KeychainError) -> WireMessage {
        switch op {
        case .enrollFinger, .removeFinger, .deleteReader, .unlock, .setPasscode, .changePasscode, .removePasscode:
            return try await secretCall(op, try wire { () throws(WireError) in try WireDevice(from: request) })
        case .enrolledFingers: return WireCall.enrolledFingers.reply(WireJSONResult(WireJSON.encode(try await service.enrolledFingers())))
        case .biometryTypes: return WireCall.biometryTypes.reply(WireJSONResult(WireJSON.encode(service.biometryTypes())))
        case .deviceCanUse:
            let value = try accessControl(try fields(.deviceCanUse, request))
            return WireCall.deviceCanUse.reply(WireJSONResult(WireJSON.encode(try await service.canUseAccessControl(value))))
        case .initialize: return WireCall.initialize.reply(WireJSONResult(WireJSON.encode(try await service.initialize())))
        case .status: return WireCall.status.reply(WireJSONResult(WireJSON.encode(try await service.status())))
        case .resetTokenPINTries: try await service.resetTokenPINTries()
        case .tokenStatus: return WireCall.tokenStatus.reply(WireJSONResult(try await service.tokenStatus().map { WireJSON.encode($0) }))
        case .lock: try await service.lock()
        case .resetPasscodeTries: try await service.resetPasscodeTries()
        case .takeTPMCommandCount: return WireCall.takeTPMCommandCount.reply(WireNumber(UInt64(await service.takeTPMCommandCount())))
        case .dropCaches: await service.dropCaches()
        case .identity: return WireCall.identity.reply(WireBytes([UInt8](try await service.identity().json())))
        default: throw KeychainError(.internal, "not a device call: \(op)")
        }
        return WireNone.reply
    }

    /// The device calls that name a finger or carry a passcode: the passcodes' bytes are the request's
    /// (keychaind wipes it), the service gets them in secure memory.
    private func secretCall(_ op: WireOp, _ fields: WireDevice) async throws(KeychainError) -> WireMessage {
        let passcode = fields.passcode.map { SecureBytes(copying: $0) }
        let newPasscode = fields.newPasscode.map { SecureBytes(copying: $0) }
        let (finger, empty) = (fields.finger ?? "", SecureBytes(copying: []))
        switch op {
        case .removeFinger: return WireCall.removeFinger.reply(WireFlag(try await service.removeFinger(finger, passcode: passcode)))
        case .deleteReader: return WireCall.deleteReader.reply(WireFlag(try await service.deleteReader(passcode: passcode)))
        case .enrollFinger: try await service.enrollFinger(finger, passcode: passcode)
        case .unlock: try await service.unlock(passcode: passcode)
        case .setPasscode:
            let new = newPasscode ?? empty
            try new.checkAsNewPasscode()
            try await service.setPasscode(old: nil, new: new)
        case .changePasscode:
            let new = newPasscode ?? empty
            try new.checkAsNewPasscode()
            try await service.setPasscode(old: passcode ?? empty, new: new)
        case .removePasscode: try await service.setPasscode(old: passcode ?? empty, new: nil)
        default: throw KeychainError(.internal, "not a device call with a finger or passcode: \(op)")
        }
        return WireNone.reply
    }

    /// An import of the bundle `request` carries, into `scope` (the caller's own items; the system's
    /// credentials for a credential bundle). Who may make it was checked (`WireOp.needsAdmin`).
    package func importCall(_ request: WireMessage, in scope: ItemScope) async throws(KeychainError) -> WireMessage {
        let fields = try fields(.importBundle, request)
        guard let document = fields.bundle else {
            throw KeychainError(.invalidArgument, "The keychain service got an import without its bundle")
        }
        let bundle = try ProvisioningBundle(json: Data(document))
        let outcome = try await service.importBundle(bundle, passcode: fields.passcode.map { SecureBytes(copying: $0) }, in: scope)
        return WireCall.importBundle.reply(WireJSONResult(WireJSON.encode(outcome)))
    }

    /// The request's fields as `call` defines them; a request that does not decode is INVALID_ARGUMENT.
    private func fields<Request, Reply>(_ call: WireCall<Request, Reply>, _ request: WireMessage) throws(KeychainError) -> Request {
        try wire { () throws(WireError) in try call.request(from: request) }
    }

    private func accessControl(_ fields: WireCanUse) throws(KeychainError) -> AccessControl {
        let raw = fields.accessControl ?? ""
        guard let value = AccessControl(rawValue: raw) else { throw .invalidArgument("Invalid accessControl '\(raw)'") }
        return value
    }

    private func wire<T>(_ body: () throws(WireError) -> T) throws(KeychainError) -> T {
        do { return try body() } catch { throw KeychainError(wire: error) }
    }
}
