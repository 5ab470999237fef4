import Foundation
@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Synchronization
import Testing

/// A `KeychainService` that records each call and answers from a script: keychaind's request
/// handler tested without a TPM, a store or a socket.
final class RecordingService: KeychainService, @unchecked Sendable {
    struct Call: Equatable { var name: String; var scope: ItemScope?; var service: String?; var key: String? }
    let calls = Mutex<[Call]>([])
    /// What the calls that can fail throw; nil answers.
    let failure: KeychainError?
    init(failure: KeychainError? = nil) { self.failure = failure }

    private func record(_ name: String, _ storage: StorageRef? = nil, key: String? = nil) throws(KeychainError) {
        calls.withLock { $0.append(Call(name: name, scope: storage?.scope, service: storage?.service, key: key)) }
        if let failure { throw failure }
    }
    var names: [String] { calls.withLock { $0.map(\.name) } }
    /// Each getItem's storage options and the read's own prompt, as the service was handed them.
    let reads = Mutex<[(options: KeychainOptions, prompt: Prompt?)]>([])

    func setItem(_ key: String, _ value: SecureBytes, options: SetItemOptions?, in storage: StorageRef) async throws(KeychainError) {
        try record("setItem", storage, key: key)
    }
    func endWindows(in storage: StorageRef) async throws(KeychainError) { try record("endWindows", storage) }
    /// Each attestKey's nonce and the protection its storage's options give.
    let attested = Mutex<[(nonce: [UInt8], protection: String)]>([])
    func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation {
        try record("attestKey", storage)
        let protection = try storage.options.resolved(for: nil)
        attested.withLock { $0.append((nonce, protection.storageTag)) }
        let signed = AttestationAnswer.Signed(attest: "", signature: "")
        return KeyAttestation(format: KeyAttestation.formatName, version: 1,
                              claim: .init(service: storage.service, accessible: protection.accessible, accessControl: protection.accessControl),
                              attestationKeyName: "00", nonce: Data(nonce).base64EncodedString(), publicArea: "", policy: "", creationData: "",
                              creationCertification: signed)
    }
    func getItem(_ key: String, options: GetItemOptions?, in storage: StorageRef,
                 authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes? {
        try record("getItem", storage, key: key)
        reads.withLock { $0.append((storage.options, options?.prompt)) }
        return SecureBytes(copying: Array("value of \(key)".utf8))
    }
    func warmItem(_ key: String, in storage: StorageRef) -> WarmRead? { nil }
    func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool { try record("hasItem", storage, key: key); return true }
    func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError) { try record("removeItem", storage, key: key) }
    func clear(_ storage: StorageRef) async throws(KeychainError) { try record("clear", storage) }
    func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String] { try record("allKeys", storage); return ["a"] }
    func allServices(in storage: StorageRef) async throws(KeychainError) -> [String] { try record("allServices", storage); return ["a"] }
    func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo? { try record("itemInfo", storage, key: key); return nil }
    func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck {
        try record("storageCanUse", storage)
        return .init(available: true, reason: nil)
    }
    func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) { try record("enrollFinger") }
    func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool { try record("removeFinger"); return true }
    func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool { try record("deleteReader"); return true }
    func enrolledFingers() async throws(KeychainError) -> [String] { try record("enrolledFingers"); return [] }
    func biometryTypes() -> [BiometryType] { try? record("biometryTypes"); return [] }
    func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck {
        try record("deviceCanUse")
        return .init(available: true, reason: nil)
    }
    func initialize() async throws(KeychainError) -> DeviceStatus { try record("initialize"); throw KeychainError(.internal) }
    func status() async throws(KeychainError) -> DeviceStatus { try record("status"); throw KeychainError(.internal) }
    func resetTokenPINTries() async throws(KeychainError) { try record("resetTokenPINTries") }
    func tokenStatus() async throws(KeychainError) -> TokenStatus? { try record("tokenStatus"); return nil }
    func unlock(passcode: SecureBytes?) async throws(KeychainError) { try record("unlock") }
    func lock() async throws(KeychainError) { try record("lock") }
    func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError) {
        try record(old == nil ? "setPasscode" : new == nil ? "removePasscode" : "changePasscode")
    }
    func resetPasscodeTries() async throws(KeychainError) { try record("resetPasscodeTries") }
    func takeTPMCommandCount() async -> Int { try? record("takeTPMCommandCount"); return 7 }
    func dropCaches() async { try? record("dropCaches") }
    func identity() async throws(KeychainError) -> DeviceIdentity { try record("identity"); throw KeychainError(.internal) }
    func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?, in scope: ItemScope) async throws(KeychainError) -> ImportOutcome {
        calls.withLock { $0.append(Call(name: "importBundle", scope: scope, service: bundle.service, key: bundle.key)) }
        if let failure { throw failure }
        return .imported
    }
}

/// keychaind's request handler over a recording service: each wire operation is one call of the
/// API, in the scope the kernel's uid gives (never the request's), with messages as thrown.
@Suite("keychaind's request handler (no TPM)", .offThePool)
struct RequestHandlerTests {
    static let user = Peer(pid: 1, uid: 1600, gid: 1600, groups: [])

    func respond(_ op: WireOp, service: String? = "mail", accessGroup: String? = nil, key: String? = "token", from peer: Peer = Self.user,
                 to backing: RecordingService, groups: AccessGroups = .init(directory: nil)) async throws -> WireMessage {
        var request = WireMessage(kind: op.rawValue)
        if op.isStorageCall { request.add(WireTag.options, KeychainOptions(service: service, accessGroup: accessGroup).wire.encoded()) }
        if op.isStorageCall { request.add(WireTag.key, key) }
        let handler = DaemonRequestHandler(service: backing, groups: groups)
        return await handler.respond(to: try WireMessage.decode(request.encoded()), from: peer, options: Connection().options,
                                     authenticator: { _ in fatalError("no prompt in these tests") })
    }

    @Test func eachStorageOperationIsOneCallInTheCallersOwnScope() async throws {
        let backing = RecordingService()
        let ops: [(WireOp, String)] = [(.setItem, "setItem"), (.getItem, "getItem"), (.hasItem, "hasItem"), (.removeItem, "removeItem"),
                                       (.clear, "clear"), (.allKeys, "allKeys"), (.itemInfo, "itemInfo")]
        for (op, _) in ops {
            let reply = try await respond(op, to: backing)
            #expect(reply.kind == WireKind.ok, "\(op)")
        }
        #expect(backing.names == ops.map(\.1))
        #expect(backing.calls.withLock { $0.allSatisfy { $0.scope == .user(1600) && $0.service == "mail" } })
        let read = try await respond(.getItem, to: backing)
        #expect(read.bytes(WireTag.resultBytes) == Array("value of token".utf8))
    }

    /// A key attestation is a storage call of the caller's own scope: the storage's protection and
    /// the nonce reach the service as sent, and its document comes back whole.
    @Test func aKeyAttestationIsOfTheCallersOwnKeyWithItsNonce() async throws {
        let backing = RecordingService()
        var request = WireMessage(kind: WireOp.attestKey.rawValue)
        request.add(WireTag.options, KeychainOptions(service: "uid:0/mail", accessible: .whenUnlockedThisDeviceOnly,
                                                     accessControl: .passcode).wire.encoded())
        request.add(WireTag.nonce, [1, 2, 3])
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        let reply = await handler.respond(to: try WireMessage.decode(request.encoded()), from: Self.user, options: Connection().options,
                                          authenticator: { _ in fatalError("no prompt in these tests") })
        #expect(reply.kind == WireKind.ok)
        #expect(backing.calls.withLock { $0 } == [.init(name: "attestKey", scope: .user(1600), service: "uid:0/mail", key: nil)])
        #expect(backing.attested.withLock { $0.map(\.nonce) } == [[1, 2, 3]])
        #expect(backing.attested.withLock { $0.map(\.protection) } == ["whenUnlockedThisDeviceOnly/passcode/0"])
        let document = try KeyAttestation(json: Data(try #require(reply.bytes(WireTag.resultBytes))))
        #expect(document.claim.service == "uid:0/mail" && document.nonce == Data([1, 2, 3]).base64EncodedString())
    }

    /// A service that spells another uid's scope is still the caller's own service.
    @Test func aServiceNamingAnotherScopeStaysInTheCallers() async throws {
        let backing = RecordingService()
        _ = try await respond(.getItem, service: "uid:0/mail", to: backing)
        let call = try #require(backing.calls.withLock { $0.first })
        #expect(call.scope == .user(1600) && call.service == "uid:0/mail")
        #expect(try ItemScope.user(1600).storeName("uid:0/mail") == "uid:1600/uid:0/mail")
        #expect(ItemScope.shown("uid:1600/uid:0/mail") == "uid:0/mail")
    }

    /// The service's error goes back as thrown: its message is not rewritten (the engine names the
    /// caller's service itself).
    @Test func anErrorGoesBackAsTheServiceThrewIt() async throws {
        let thrown = KeychainError(.dataCorrupted, "Item 'token' of service 'uid:7/x' cannot be trusted", underlying: .errno(5))
        let reply = try await respond(.getItem, to: RecordingService(failure: thrown))
        let decoded = try KeychainError(decoding: reply)
        #expect(decoded.code == .dataCorrupted && decoded.message == thrown.message && decoded.description == thrown.description)
    }

    @Test func anAccessGroupIsTheScopeOnlyForAMember() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("groups-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "uid 1600\n".write(toFile: directory + "/team.conf", atomically: true, encoding: .utf8)
        let groups = AccessGroups(directory: directory)
        let backing = RecordingService()
        #expect(try await respond(.hasItem, accessGroup: "team", to: backing, groups: groups).kind == WireKind.ok)
        #expect(backing.calls.withLock { $0.first?.scope } == .group("team"))
        let outsider = Peer(pid: 1, uid: 1700, gid: 1700, groups: [])
        let refused = try await respond(.hasItem, accessGroup: "team", from: outsider, to: backing, groups: groups)
        #expect(try KeychainError(decoding: refused).code == .accessDenied)
        #expect(backing.names == ["hasItem"], "the outsider's call never reached the service")
    }

    @Test func aDeviceChangeNeedsAnAdministratorAndReachesTheServiceOnce() async throws {
        let backing = RecordingService()
        let refused = try await respond(.lock, from: Self.user, to: backing)
        #expect(try KeychainError(decoding: refused).code == .accessDenied)
        #expect(backing.names.isEmpty)
        #expect(try await respond(.lock, from: Peer(pid: 1, uid: 0, gid: 0, groups: []), to: backing).kind == WireKind.ok)
        #expect(try await respond(.biometryTypes, from: Self.user, to: backing).kind == WireKind.ok)
        #expect(backing.names == ["lock", "biometryTypes"])
    }

    /// systemd credentials (`keychainctl credential`): root and the `admin` group administer them, in
    /// the manager's credentials scope; any other uid is refused before the service.
    @Test func systemdCredentialsAreTheScopeOnlyForAnAdministrator() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("groups-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "uid 1700\n".write(toFile: directory + "/admin.conf", atomically: true, encoding: .utf8)
        let groups = AccessGroups(directory: directory)
        let backing = RecordingService()
        let system = SystemdCredentials.accessGroup(for: .system)
        let refused = try await respond(.getItem, service: "db.service", accessGroup: system, key: "db-password", to: backing, groups: groups)
        let error = try KeychainError(decoding: refused)
        #expect(error.code == .accessDenied && error.message.contains("uid 1600 is neither"))
        #expect(backing.names.isEmpty, "a non-admin's call never reached the service")
        let root = Peer(pid: 1, uid: 0, gid: 0, groups: [])
        let admin = Peer(pid: 1, uid: 1700, gid: 1700, groups: [])
        #expect(try await respond(.setItem, service: "db.service", accessGroup: system, from: root, to: backing, groups: groups).kind == WireKind.ok)
        #expect(try await respond(.allKeys, service: "db.service", accessGroup: system, from: admin, to: backing, groups: groups).kind == WireKind.ok)
        let users = SystemdCredentials.accessGroup(for: .user(1600))
        #expect(try await respond(.hasItem, service: "app.service", accessGroup: users, from: root, to: backing, groups: groups).kind == WireKind.ok)
        #expect(backing.calls.withLock { $0.map(\.scope) } == [.credentials(.system), .credentials(.system), .credentials(.user(1600))])
        #expect(try SystemdCredentials.storage(unit: "db.service", manager: .system).storeName == "credential:system/db.service")
    }

    /// A user's own manager's credentials (`keychainctl credential … --user`): that uid reaches them without
    /// being an administrator; another non-admin uid naming them is refused before the service.
    @Test func aUsersOwnUnitsCredentialsAreThatUsersAlone() async throws {
        let backing = RecordingService()
        let own = SystemdCredentials.accessGroup(for: .user(Self.user.uid))
        #expect(try await respond(.setItem, service: "app.service", accessGroup: own, key: "api-key", to: backing).kind == WireKind.ok)
        #expect(backing.calls.withLock { $0.map(\.scope) } == [.credentials(.user(Self.user.uid))])
        let other = Peer(pid: 1, uid: 1601, gid: 1601, groups: [])
        for op in [WireOp.getItem, .setItem, .allKeys, .removeItem] {
            let refused = try await respond(op, service: "app.service", accessGroup: own, key: "api-key", from: other, to: backing)
            let error = try KeychainError(decoding: refused)
            #expect(error.code == .accessDenied && error.message.contains("uid 1601 is none of them"), "\(op): \(error.message)")
        }
        #expect(backing.calls.withLock { $0.count } == 1, "another uid's calls never reached the service")
        // uid 0's "user manager" is the system manager: no such group, so not a way around the admin check.
        #expect(SystemdCredentials.manager(accessGroup: SystemdCredentials.accessGroup(for: .user(0))) == nil)
    }

    /// keychaind's `identity` and `import`: an administrator's; a bundle lands in the caller's own scope.
    @Test func identityAndImportNeedAnAdministratorAndImportLandsInTheCallersScope() async throws {
        let backing = RecordingService()
        let bundle = ProvisioningBundle(format: ProvisioningBundle.formatName, version: 1, parent: "srk", target: "00", service: "mail",
                                        key: "token", label: nil, accessible: .afterFirstUnlock, accessControl: .none, itemVersion: 0,
                                        pcrs: nil, publicArea: "", duplicate: "", encryptedSeed: "", nonce: "", ciphertext: "")
        func request(_ op: WireOp) -> WireMessage {
            var message = WireMessage(kind: op.rawValue)
            if op == .importBundle { message.add(WireTag.bundle, [UInt8](bundle.json())) }
            return message
        }
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        for op in [WireOp.identity, .importBundle] {
            let refused = await handler.respond(to: request(op), from: Self.user, options: Connection().options,
                                                authenticator: { _ in fatalError("no prompt in these tests") })
            let error = try KeychainError(decoding: refused)
            #expect(error.code == .accessDenied && error.message.contains("uid 1600 is neither"), "\(op): \(error)")
        }
        #expect(backing.names.isEmpty, "a non-admin's call never reached the service")
        let root = Peer(pid: 1, uid: 0, gid: 0, groups: [])
        let imported = await handler.respond(to: request(.importBundle), from: root, options: Connection().options,
                                             authenticator: { _ in fatalError("no prompt in these tests") })
        #expect(imported.kind == WireKind.ok)
        #expect(backing.calls.withLock { $0.first } == .init(name: "importBundle", scope: .user(0), service: "mail", key: "token"))
    }

    @Test func aStorageCallWithoutOptionsOrWithBadOnesIsRefusedBeforeTheService() async throws {
        let backing = RecordingService()
        #expect(try KeychainError(decoding: try await respond(.getItem, service: nil, to: backing)).code == .invalidArgument)
        #expect(try KeychainError(decoding: try await respond(.getItem, service: "", to: backing)).code == .invalidArgument)
        #expect(backing.names.isEmpty)
    }

    /// The options and a read's prompt arrive typed, every field as the client set it; a word that is
    /// none of the library's is INVALID_ARGUMENT naming it, and the service is never called.
    @Test func optionsArriveTypedAndAnUnknownWordIsRefusedBeforeTheService() async throws {
        let backing = RecordingService()
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        func get(_ options: [UInt8], prompt: Prompt? = nil) async throws -> WireMessage {
            var request = WireMessage(kind: WireOp.getItem.rawValue)
            request.add(WireTag.options, options)
            request.add(WireTag.key, "token")
            request.add(WireTag.prompt, prompt?.wire.encoded())
            return await handler.respond(to: try WireMessage.decode(request.encoded()), from: Self.user, options: Connection().options,
                                         authenticator: { _ in fatalError("no prompt in these tests") })
        }
        let options = KeychainOptions(service: "mail", accessible: .whenUnlocked, accessControl: .biometryAnyOrPasscode, authValidity: 30,
                                      prompt: Prompt(title: "Sign in", cancel: "Use password"), android: .init(keyStorage: .strongbox))
        #expect(try await get(options.wire.encoded(), prompt: Prompt(subtitle: "for the mail")).kind == WireKind.ok)
        let read = try #require(backing.reads.withLock { $0.first })
        #expect(read.options == options && read.prompt == Prompt(subtitle: "for the mail"))

        let refused = try KeychainError(decoding: try await get(WireStorageOptions(service: "mail", accessControl: "faceID").encoded()))
        #expect(refused.code == .invalidArgument)
        #expect(refused.message == "The keychain service could not read the request: unknown AccessControl 'faceID'")
        #expect(backing.names == ["getItem"])
    }
}

extension RequestHandlerTests {
    /// A field of an operation that does not decode is INVALID_ARGUMENT naming it, a value the
    /// operation refuses is refused in its own words, and the service is never called.
    @Test func aRequestWhoseFieldsDoNotDecodeIsRefusedBeforeTheService() async throws {
        let backing = RecordingService()
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        let root = Peer(pid: 1, uid: 0, gid: 0, groups: [])
        let options = KeychainOptions(service: "mail").wire.encoded()
        let unread = "The keychain service could not read the request: "
        let cases: [(WireOp, [(UInt8, [UInt8])], String)] = [
            (.getItem, [(WireTag.options, options), (WireTag.key, [0xFF])], unread + "field 2 is not UTF-8"),
            (.getItem, [(WireTag.options, options), (WireTag.key, Array("k".utf8)), (WireTag.attempts, [1])],
             unread + "field 10 is not an 8-byte integer"),
            (.getItems, [(WireTag.options, options), (WireTag.keys, WireList.encode([[0xFF]]))], unread + "a key is not UTF-8"),
            (.getItems, [(WireTag.options, options)], "A batch read names 1 to 1024 keys, got 0"),
            (.setItem, [(WireTag.options, options), (WireTag.key, Array("k".utf8)), (WireTag.accessible, Array("sometimes".utf8))],
             unread + "unknown Accessible 'sometimes'"),
            (.storageCanUse, [(WireTag.options, options), (WireTag.accessControl, Array("faceID".utf8))], "Invalid accessControl 'faceID'"),
            (.deviceCanUse, [], "Invalid accessControl ''"),
            (.removeFinger, [(WireTag.finger, [0xFF])], unread + "field 11 is not UTF-8"),
            (.importBundle, [], "The keychain service got an import without its bundle"),
        ]
        for (op, fields, message) in cases {
            var request = WireMessage(kind: op.rawValue)
            for (tag, bytes) in fields { request.add(tag, bytes) }
            let reply = await handler.respond(to: request, from: root, options: Connection().options,
                                              authenticator: { _ in fatalError("no prompt in these tests") })
            let error = try KeychainError(decoding: reply)
            #expect(error.code == .invalidArgument && error.message == message, "\(op): \(error)")
        }
        #expect(backing.names.isEmpty)
    }

    /// A new passcode the PIN index cannot take (under 4 or over 32 bytes) is refused by keychaind in the
    /// library's words before the service, for a set and a change alike; 4 and 32 bytes reach it.
    @Test func aNewPasscodeOfTheWrongLengthIsRefusedBeforeTheService() async throws {
        let backing = RecordingService()
        let handler = DaemonRequestHandler(service: backing, groups: .init(directory: nil))
        let root = Peer(pid: 1, uid: 0, gid: 0, groups: [])
        func send(_ op: WireOp, old: [UInt8]?, new: [UInt8]) async -> WireMessage {
            var request = WireMessage(kind: op.rawValue)
            WireDevice(passcode: old, newPasscode: new).encode(into: &request)
            return await handler.respond(to: request, from: root, options: Connection().options,
                                         authenticator: { _ in fatalError("no prompt in these tests") })
        }
        let calls: [(WireOp, [UInt8]?)] = [(.setPasscode, nil), (.changePasscode, Array("1234".utf8))]
        for (op, old) in calls {
            for length in [0, 3, 33] {
                let error = try KeychainError(decoding: await send(op, old: old, new: Array(repeating: 0x31, count: length)))
                #expect(error.code == .invalidArgument && error.message == "Invalid passcode: expected 4 to 32 bytes, got \(length)",
                        "\(op), \(length) bytes: \(error)")
            }
        }
        #expect(backing.names.isEmpty)
        for length in [4, 32] {
            #expect(await send(.setPasscode, old: nil, new: Array(repeating: 0x31, count: length)).kind == WireKind.ok)
        }
        #expect(backing.names == ["setPasscode", "setPasscode"])
    }
}

/// Scopes in the store: the process's own services can never spell one of keychaind's.
@Suite("item scopes", .offThePool)
struct ItemScopeTests {
    @Test func storeNamesParseBackToTheirScope() throws {
        for (scope, service) in [(ItemScope.user(1600), "bank"), (.user(0), "a/b"), (.group("team"), "vpn"), (.group("x.y-z"), "uid:1/k"),
                                 (.credentials(.system), "db.service"), (.credentials(.user(1000)), "a/b.service")] {
            let name = try scope.storeName(service)
            let parsed = try #require(ItemScope.parse(name))
            #expect(parsed.0 == scope && parsed.1 == service)
            #expect(ItemScope.shown(name) == service)
        }
        for plain in ["bank", "uid:", "uid:x/y", "uid:/y", "group:/y", "uid:12", "group:team", "credential:", "credential:uid:x/y",
                      "credential:uid:01/y", "credential:systemd/y"] {
            #expect(ItemScope.parse(plain) == nil, "\(plain)")
            #expect(try ItemScope.process.storeName(plain) == plain)
        }
    }

    /// A service manager has one spelling, read back the same way by the store's credentials
    /// namespaces and keychain-journal-relay's datagrams; no other text reads as a manager.
    @Test func aManagersWordReadsBackAndNothingElseReadsAsOne() throws {
        for manager in [SystemdCredentials.Manager.system, .user(0), .user(1000), .user(UInt32.max)] {
            #expect(SystemdCredentials.Manager(word: manager.word) == manager)
            let parsed = try #require(SystemdCredentials.parse(SystemdCredentials.namespace(of: manager) + "db.service"))
            #expect(parsed == (manager, "db.service"))
        }
        #expect(SystemdCredentials.Manager.user(1000).word == "uid:1000" && SystemdCredentials.Manager.system.word == "system")
        for word in ["", "root", "System", "system ", "systemd", "uid:", "uid:01", "uid:+1", "uid:-1", "uid: 1", "uid:4294967296", "uid:1/", "uid:x"] {
            #expect(SystemdCredentials.Manager(word: word) == nil, "\(word)")
        }
    }

    @Test func aServiceOfThisProcessCannotNameAnotherScope() {
        for spelled in ["uid:1600/bank", "uid:0/", "group:team/vpn", "credential:system/db.service", "credential:uid:1000/app.service"] {
            #expect(throws: KeychainError(.invalidArgument)) { try ItemScope.process.storeName(spelled) }
            #expect(throws: KeychainError(.invalidArgument)) {
                try StorageRef(scope: .process, options: .init(service: spelled), defaultService: "app")
            }
        }
    }
}

/// Issue 22 item 8: a provisioning bundle's bytes never choose whose items it writes.
@Suite("a bundle lands in the importer's scope", .offThePool)
struct BundleScopeTests {
    static let victim: UInt32 = 1600

    func ctl(_ daemon: KeychainDaemon, _ args: [String], input: String = "", uid: UInt32) throws -> (status: Int32, out: String, err: String) {
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let result = try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", keychainctl] + args,
                             input: Array(input.utf8), environment: daemon.environment)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// uid 1600 keeps a token in its service `bank`; root imports a bundle sealed for the service
    /// `uid:1600/bank` into keychaind's store. Before the fix the bundle's value replaced uid 1600's token.
    @Test func aBundleNamingAUsersScopeDoesNotLandAmongItsItems() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        #expect(try ctl(daemon, ["set", "bank", "token"], input: "the user's own", uid: Self.victim).status == 0)
        // Root, in its own process on keychaind's store (each takes its turn at the TPM).
        let device = KeychainDevice(configuration: tpm.configuration(store: daemon.store))
        let identity = try await device.identity()
        let planted = try Provisioning.seal(SecureBytes(copying: Array("planted".utf8)), service: "uid:\(Self.victim)/bank", key: "token",
                                            for: identity)
        await #expect(throws: KeychainError(.invalidArgument)) { try await device.importBundle(planted) }
        // The importer names the user: the bundle's service is that user's service.
        let given = try Provisioning.seal(SecureBytes(copying: Array("provisioned".utf8)), service: "bank", key: "pin", for: identity)
        let administration = try KeychainAdministration(configuration: tpm.configuration(store: daemon.store))
        #expect(try await administration.importBundle(given, forUser: Self.victim) == .imported)

        #expect(try ctl(daemon, ["get", "bank", "token"], uid: Self.victim).out == "the user's own")
        #expect(try ctl(daemon, ["get", "bank", "pin"], uid: Self.victim).out == "provisioned")
        #expect(try ctl(daemon, ["ls", "bank"], uid: 1700).out.isEmpty, "no other uid got it")
    }
}
