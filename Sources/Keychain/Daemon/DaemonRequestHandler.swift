import FoundationEssentials
import KeychainWire
import SecureMemory

/// keychaind's requests as calls of the keychain API: each wire operation is one `KeychainService`
/// call in the caller's scope (`uid N`, or an access group it is a member of), with the options
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
                         options: ([UInt8]?) throws(KeychainError) -> KeychainOptions?,
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
            let asker = try wire { () throws(WireError) in try request.uint(WireTag.attempts) }.map { authenticator(Int(min($0, 10))) }
            // The caller's failures (reader, passcode) count against its own budgets.
            let caller = DaemonRequestHandler(service: service.serving(DaemonCaller(uid: peer.uid, isAdmin: { [groups] in groups.isAdmin(peer) })),
                                              groups: groups)
            if op == .importBundle { return try await caller.importCall(request, in: .user(peer.uid)) }
            guard op.isStorageCall else { return try await caller.deviceCall(op, request) }
            guard let options = try options(request.bytes(WireTag.options)), let service = options.service else {
                throw KeychainError(.invalidArgument, "The keychain service got a storage call without its options")
            }
            let storage = try StorageRef(scope: try scope(of: options, for: peer), options: options, defaultService: service)
            return try await caller.storageCall(op, request, in: storage, authenticator: asker)
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
                               options: ([UInt8]?) throws(KeychainError) -> KeychainOptions?) -> WireMessage? {
        guard request.kind == WireOp.getItem.rawValue else { return nil }
        do throws(KeychainError) {
            guard let options = try options(request.bytes(WireTag.options)), let service = options.service,
                  let key = try wire({ () throws(WireError) in try request.string(WireTag.key) }) else { return nil }
            let storage = try StorageRef(scope: try scope(of: options, for: peer), options: options, defaultService: service)
            guard let read = self.service.warmItem(key, in: storage) else { return nil }
            var reply = WireMessage(kind: WireKind.ok)
            if case .value(let value) = read { reply.add(WireTag.resultBytes, value.wireBytes) }
            return reply
        } catch {
            return nil
        }
    }

    /// The caller's own items, or its access group's when it names one it is a member of; a service
    /// manager's systemd credentials for root and the `admin` group (`SystemdCredentials.accessGroup`),
    /// and a user's own manager's for that user.
    package func scope(of options: KeychainOptions, for peer: Peer) throws(KeychainError) -> ItemScope {
        guard let group = options.accessGroup else { return .user(peer.uid) }
        if let manager = SystemdCredentials.manager(accessGroup: group) {
            guard manager == .user(peer.uid) || groups.isAdmin(peer) else { throw SystemdCredentials.refusal(peer, for: manager) }
            return .credentials(manager)
        }
        guard try groups.isMember(peer, of: group) else {
            throw KeychainError(.accessDenied, "uid \(peer.uid) is not a member of the access group '\(group)' (or there is no such "
                                + "group): ask the administrator to add it to groups.d/\(group).conf")
        }
        return .group(group)
    }

    /// One storage call of `request` (`op`) in `storage`'s scope; the reply.
    package func storageCall(_ op: WireOp, _ request: WireMessage, in storage: StorageRef,
                             authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        var reply = WireMessage(kind: WireKind.ok)
        let key = try wire { () throws(WireError) in try request.string(WireTag.key) } ?? ""
        switch op {
        case .setItem:
            var bytes = request.bytes(WireTag.value) ?? []
            defer { bytes.wipe() }
            let call = try wire { () throws(WireError) in try SetItemOptions(wire: request) }
            try await service.setItem(key, SecureBytes(copying: bytes), options: call, in: storage)
        case .getItem:
            let prompt = try wire { () throws(WireError) in
                try request.bytes(WireTag.prompt).map { bytes throws(WireError) in Prompt(wire: try WirePrompt(decoding: bytes)) }
            }
            if let value = try await service.getItem(key, options: prompt.map { GetItemOptions(prompt: $0) }, in: storage,
                                                     authenticator: authenticator) {
                reply.add(WireTag.resultBytes, value.wireBytes)
            }
        case .hasItem: reply.add(WireTag.resultBool, try await service.hasItem(key, in: storage))
        case .removeItem: try await service.removeItem(key, in: storage)
        case .clear: try await service.clear(storage)
        case .allKeys: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.allKeys(in: storage)))
        case .allServices: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.allServices(in: storage)))
        case .itemInfo:
            if let info = try await service.itemInfo(key, in: storage) { reply.add(WireTag.resultJSON, WireJSON.encode(info)) }
        case .storageCanUse:
            reply.add(WireTag.resultJSON, WireJSON.encode(try await service.canUseAccessControl(try accessControl(request), in: storage)))
        case .endWindows: try await service.endWindows(in: storage)
        case .getItems: return try await batchRead(request, in: storage, authenticator: authenticator)
        case .attestKey:
            let document = try await service.attestKey(nonce: request.bytes(WireTag.nonce) ?? [], in: storage).json()
            reply.add(WireTag.resultBytes, [UInt8](document))
        default: throw KeychainError(.internal, "not a storage call: \(op)")
        }
        return reply
    }

    /// A batch read: each key's outcome as `getItem`'s reply, in order, up to `WireList.replyBudget`
    /// bytes (at least one); the client asks again for the keys left out.
    private func batchRead(_ request: WireMessage, in storage: StorageRef,
                           authenticator: (any Authenticator)?) async throws(KeychainError) -> WireMessage {
        let keys = try wire { () throws(WireError) in
            try WireList.decode(request.bytes(WireTag.keys) ?? []).map { bytes throws(WireError) in
                guard let key = String(validating: bytes, as: UTF8.self) else { throw WireError(.malformed, "a key is not UTF-8") }
                return key
            }
        }
        guard (1...WireList.maxKeys).contains(keys.count) else {
            throw KeychainError(.invalidArgument, "A batch read names 1 to \(WireList.maxKeys) keys, got \(keys.count)")
        }
        var outcomes: [[UInt8]] = []
        var size = 0
        defer { for index in outcomes.indices { outcomes[index].wipe() } }
        // One key at a time, stopping at the budget: a batch never holds more than one value beyond its reply,
        // and a key left out is not read (nor prompted for) until the client asks again.
        for key in keys {
            var outcome: WireMessage
            do throws(KeychainError) {
                let value = try await service.getItem(key, options: nil, in: storage, authenticator: authenticator)
                outcome = WireMessage(kind: WireKind.ok)
                outcome.add(WireTag.resultBytes, value?.wireBytes)
            } catch {
                outcome = error.wireMessage
            }
            defer { outcome.wipe() }
            var bytes = outcome.encoded()
            guard outcomes.isEmpty || size + bytes.count <= WireList.replyBudget else {
                bytes.wipe()
                break
            }
            size += bytes.count + 4
            outcomes.append(bytes)
        }
        var reply = WireMessage(kind: WireKind.ok)
        reply.add(WireTag.resultItems, WireList.encode(outcomes))
        return reply
    }

    /// One device call; the reply. Who may make it was checked (`WireOp.needsAdmin`).
    package func deviceCall(_ op: WireOp, _ request: WireMessage) async throws(KeychainError) -> WireMessage {
        var reply = WireMessage(kind: WireKind.ok)
        let passcode = request.bytes(WireTag.passcode).map(secure)
        let newPasscode = request.bytes(WireTag.newPasscode).map(secure)
        let finger = try wire { () throws(WireError) in try request.string(WireTag.finger) } ?? ""
        let empty = SecureBytes(copying: [])
        switch op {
        case .enrollFinger: try await service.enrollFinger(finger, passcode: passcode)
        case .removeFinger: reply.add(WireTag.resultBool, try await service.removeFinger(finger, passcode: passcode))
        case .deleteReader: reply.add(WireTag.resultBool, try await service.deleteReader(passcode: passcode))
        case .enrolledFingers: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.enrolledFingers()))
        case .biometryTypes: reply.add(WireTag.resultJSON, WireJSON.encode(service.biometryTypes()))
        case .deviceCanUse: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.canUseAccessControl(try accessControl(request))))
        case .initialize: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.initialize()))
        case .status: reply.add(WireTag.resultJSON, WireJSON.encode(try await service.status()))
        case .resetTokenPINTries: try await service.resetTokenPINTries()
        case .tokenStatus:
            if let status = try await service.tokenStatus() { reply.add(WireTag.resultJSON, WireJSON.encode(status)) }
        case .unlock: try await service.unlock(passcode: passcode)
        case .lock: try await service.lock()
        case .setPasscode:
            let new = newPasscode ?? empty
            try KeychainDevice.checkPasscode(new)
            try await service.setPasscode(old: nil, new: new)
        case .changePasscode:
            let new = newPasscode ?? empty
            try KeychainDevice.checkPasscode(new)
            try await service.setPasscode(old: passcode ?? empty, new: new)
        case .removePasscode: try await service.setPasscode(old: passcode ?? empty, new: nil)
        case .resetPasscodeTries: try await service.resetPasscodeTries()
        case .takeTPMCommandCount: reply.add(WireTag.resultNumber, UInt64(await service.takeTPMCommandCount()))
        case .dropCaches: await service.dropCaches()
        case .identity: reply.add(WireTag.resultBytes, [UInt8](try await service.identity().json()))
        default: throw KeychainError(.internal, "not a device call: \(op)")
        }
        return reply
    }

    /// An import of the bundle `request` carries, into `scope` (the caller's own items; the system's
    /// credentials for a credential bundle). Who may make it was checked (`WireOp.needsAdmin`).
    package func importCall(_ request: WireMessage, in scope: ItemScope) async throws(KeychainError) -> WireMessage {
        guard let document = request.bytes(WireTag.bundle) else {
            throw KeychainError(.invalidArgument, "The keychain service got an import without its bundle")
        }
        let bundle = try ProvisioningBundle(json: Data(document))
        let outcome = try await service.importBundle(bundle, passcode: request.bytes(WireTag.passcode).map(secure), in: scope)
        var reply = WireMessage(kind: WireKind.ok)
        reply.add(WireTag.resultJSON, WireJSON.encode(outcome))
        return reply
    }

    private func secure(_ bytes: [UInt8]) -> SecureBytes {
        var bytes = bytes
        defer { bytes.wipe() }
        return SecureBytes(copying: bytes)
    }

    private func accessControl(_ request: WireMessage) throws(KeychainError) -> AccessControl {
        let raw = try wire { () throws(WireError) in try request.string(WireTag.accessControl) } ?? ""
        guard let value = AccessControl(rawValue: raw) else { throw .invalidArgument("Invalid accessControl '\(raw)'") }
        return value
    }

    private func wire<T>(_ body: () throws(WireError) -> T) throws(KeychainError) -> T {
        do { return try body() } catch { throw KeychainError(wire: error) }
    }
}
