import Foundation
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Synchronization
import Testing
@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon

/// keychaind's bytes pinned: each operation's request as the library's client sends it, its reply as
/// keychaind's handler makes it, the prompt keychaind asks with and each answer a client gives, byte
/// for byte as the protocol's second version wrote them (taken from the hand-written encoders and
/// decoders before the per-operation codecs replaced them).
@Suite("keychaind protocol: golden bytes", .offThePool)
struct WireGoldenTests {
    /// A socket that records each frame it gets: a `getItem` that carries `attempts` is asked a
    /// prompt first (its answer recorded too), and every request is then refused with an error reply.
    final class Recorder: @unchecked Sendable {
        /// Answers each request (as root) instead of the error reply; its replies are recorded too.
        let handler: DaemonRequestHandler?
        let directory: String
        var socket: String { directory + "/golden.sock" }
        let listener: Int32
        let frames = Mutex<[[UInt8]]>([])

        init(handler: DaemonRequestHandler? = nil) throws {
            self.handler = handler
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("wire-golden-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
            listener = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (i, b) in Array((directory + "/golden.sock").utf8).enumerated() { raw[i] = b }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            precondition(bound == 0 && listen(listener, 8) == 0, "bind/listen: errno \(errno)")
            Thread { [self] in
                while true {
                    let fd = accept(listener, nil, nil)
                    guard fd >= 0 else { return }
                    // A connection of its own thread: the client keeps one open while it makes another.
                    Thread { [self] in
                        while serve(fd) {}
                        close(fd)
                    }.start()
                }
            }.start()
        }

        private func serve(_ fd: Int32) -> Bool {
            guard let request = try? WireSocket.receive(fd, idle: 60, stall: 60) else { return false }
            frames.withLock { $0.append(request.encoded()) }
            if request.kind == WireOp.getItem.rawValue && request.bytes(WireTag.attempts) != nil {
                guard (try? WireSocket.send(fd, WireGoldenTests.prompt)) != nil,
                      let answer = try? WireSocket.receive(fd, idle: 60, stall: 60) else { return false }
                frames.withLock { $0.append(answer.encoded()) }
            }
            guard let handler else { return (try? WireSocket.send(fd, KeychainError(.internal, "recorded").wireMessage)) != nil }
            let reply = waitFor { () async -> WireMessage in
                await handler.respond(to: request, from: Peer(pid: 1, uid: 0, gid: 0, groups: []), options: Connection().options,
                                      authenticator: { _ in fatalError("no prompt in these calls") })
            }
            frames.withLock { $0.append(Self.sortingJSON(reply).encoded()) }
            return (try? WireSocket.send(fd, reply)) != nil
        }

        /// The reply with its JSON result's object keys sorted: JSONEncoder writes them in no fixed
        /// order (the client reads them by name), so the order is not part of the protocol.
        static func sortingJSON(_ reply: WireMessage) -> WireMessage {
            guard let json = reply.bytes(WireTag.resultJSON), let object = try? JSONSerialization.jsonObject(with: Data(json), options: [.fragmentsAllowed]),
                  let sorted = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .fragmentsAllowed]) else { return reply }
            var copy = WireMessage(kind: reply.kind)
            for (tag, bytes) in reply.fields { copy.add(tag, tag == WireTag.resultJSON ? [UInt8](sorted) : bytes) }
            return copy
        }

        /// The frames recorded since the last call, as hex.
        func take() -> [String] { frames.withLock { frames in defer { frames = [] }; return frames.map(hex) } }

        deinit {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// The prompt keychaind sends (`RemoteAuthenticator`'s bytes, pinned below).
    static let prompt: WireMessage = try! WireMessage.decode(unhex(goldenPrompt))

    final class Answering: Authenticator {
        let answer: AuthenticationAnswer
        let asked = Mutex<[String]>([])
        init(answer: AuthenticationAnswer) { self.answer = answer }
        var attemptsPerRead: Int { 2 }
        func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
            asked.withLock {
                $0.append("\(request.prompt.title ?? "-")|\(request.prompt.cancel ?? "-")|\(request.methods.map(\.rawValue))|"
                          + "\(request.service)|\(request.key)|\(request.attempt)|\(request.previousFailure ?? "-")")
            }
            return answer
        }
    }

    static func secure(_ text: String) -> SecureBytes { SecureBytes(copying: Array(text.utf8)) }

    /// Every call of the library's client, each made once; what each sent is in `golden`.
    static func calls(_ client: any KeychainService, _ storage: StorageRef) async -> [(String, () async throws -> String)] {
        let (pin, new) = (secure("1234"), secure("5678"))
        let getOptions = GetItemOptions(prompt: Prompt(subtitle: "for the mail"))
        let setOptions = SetItemOptions(accessible: .always, accessControlOverride: .passcode, authValidity: 5, label: "L", synchronizable: false)
        let bundle = Self.bundle
        return [
            ("setItem", { try await client.setItem("token", secure("v"), options: setOptions, in: storage); return "ok" }),
            ("setItemPlain", { try await client.setItem("token", secure("v"), options: nil, in: storage); return "ok" }),
            ("getItem", { show(try await client.getItem("token", options: getOptions, in: storage, authenticator: nil)) }),
            ("hasItem", { "\(try await client.hasItem("token", in: storage))" }),
            ("removeItem", { try await client.removeItem("token", in: storage); return "ok" }),
            ("clear", { try await client.clear(storage); return "ok" }),
            ("allKeys", { "\(try await client.allKeys(in: storage))" }),
            ("allServices", { "\(try await client.allServices(in: storage))" }),
            ("itemInfo", { "\(try await client.itemInfo("token", in: storage) as Any)" }),
            ("storageCanUse", { "\(try await client.canUseAccessControl(.biometryAny, in: storage))" }),
            ("endWindows", { try await client.endWindows(in: storage); return "ok" }),
            ("attestKey", { "\(try await client.attestKey(nonce: [1, 2, 3], in: storage))" }),
            ("enrollFinger", { try await client.enrollFinger("thumb", passcode: pin); return "ok" }),
            ("removeFinger", { "\(try await client.removeFinger("thumb", passcode: nil))" }),
            ("deleteReader", { "\(try await client.deleteReader(passcode: pin))" }),
            ("enrolledFingers", { "\(try await client.enrolledFingers())" }),
            ("biometryTypes", { "\(client.biometryTypes())" }),
            ("deviceCanUse", { "\(try await client.canUseAccessControl(.passcode))" }),
            ("initialize", { "\(try await client.initialize())" }),
            ("status", { "\(try await client.status())" }),
            ("resetTokenPINTries", { try await client.resetTokenPINTries(); return "ok" }),
            ("tokenStatus", { "\(try await client.tokenStatus() as Any)" }),
            ("unlock", { try await client.unlock(passcode: pin); return "ok" }),
            ("lock", { try await client.lock(); return "ok" }),
            ("setPasscode", { try await client.setPasscode(old: nil, new: new); return "ok" }),
            ("changePasscode", { try await client.setPasscode(old: pin, new: new); return "ok" }),
            ("removePasscode", { try await client.setPasscode(old: pin, new: nil); return "ok" }),
            ("resetPasscodeTries", { try await client.resetPasscodeTries(); return "ok" }),
            ("takeTPMCommandCount", { "\(await client.takeTPMCommandCount())" }),
            ("dropCaches", { await client.dropCaches(); return "ok" }),
            ("identity", { "\(try await client.identity())" }),
            ("importBundle", { "\(try await client.importBundle(bundle, passcode: nil, in: .user(1600)))" }),
            // New bytes: the hand encoder added the passcode after the bundle, out of tag order, and trapped.
            ("importBundleWithPasscode", { "\(try await client.importBundle(bundle, passcode: pin, in: .user(1600)))" }),
            ("getItems", {
                try await client.getItems(["token", "absent", "locked"], in: storage, authenticator: nil).map { read in
                    switch read { case .success(let value): show(value); case .failure(let error): "\(error)" }
                }.joined(separator: ", ")
            }),
        ]
    }

    static func show(_ value: SecureBytes?) -> String { value.map { "\($0.withUnsafeBytes { Array($0) })" } ?? "nil" }


    /// The storage options field both tests' storages send (service, accessible, access control, …).
    static let requestOptions = "010000005d020001000000046d61696c020000001061667465724669727374556e6c6f636b03000000046e6f6e650400000008000000000000000005000000010006000000047465616d070000000b020001000000044d61696c0800000003746565"
    static let answerOptions = "0100000044020001000000046d61696c020000001061667465724669727374556e6c6f636b03000000046e6f6e65040000000800000000000000000500000001000800000003746565"
    static let golden: [String: [String]] = {
        let o = requestOptions
        return [
            "allKeys": ["0206" + o],
            "allServices": ["020b" + o],
            "attestKey": ["020a" + o + "0f00000003010203"],
            "biometryTypes": ["0218"],
            "changePasscode": ["02210c00000004313233340d0000000435363738"],
            "clear": ["0205" + o],
            "deleteReader": ["02160c0000000431323334"],
            "deviceCanUse": ["0219050000000870617373636f6465"],
            "dropCaches": ["0225"],
            "endWindows": ["0209" + o],
            "enrollFinger": ["02140b000000057468756d620c0000000431323334"],
            "enrolledFingers": ["0217"],
            "getItems": ["020c" + o + "100000001d00000005746f6b656e00000006616273656e74000000066c6f636b6564"],
            "getItem": ["0202" + o + "0200000005746f6b656e09000000130200020000000c666f7220746865206d61696c"],
            "hasItem": ["0203" + o + "0200000005746f6b656e"],
            "identity": ["0228"],
            "importBundle": ["0229" + "0e00000145" + hex(Array(bundleDocument.utf8))],
            "importBundleWithPasscode": ["0229" + "0c0000000431323334" + "0e00000145" + hex(Array(bundleDocument.utf8))],
            "initialize": ["021a"],
            "itemInfo": ["0207" + o + "0200000005746f6b656e"],
            "lock": ["021f"],
            "removeFinger": ["02150b000000057468756d62"],
            "removeItem": ["0204" + o + "0200000005746f6b656e"],
            "removePasscode": ["02220c0000000431323334"],
            "resetPasscodeTries": ["0223"],
            "resetTokenPINTries": ["021c"],
            "setItem": ["0201" + o + "0200000005746f6b656e0300000001760400000006616c77617973050000000870617373636f64650600000008000000000000000507000000014c080000000100"],
            "setItemPlain": ["0201" + o + "0200000005746f6b656e030000000176"],
            "setPasscode": ["02200d0000000435363738"],
            "status": ["021b"],
            "storageCanUse": ["0208" + o + "050000000b62696f6d65747279416e79"],
            "takeTPMCommandCount": ["0224"],
            "tokenStatus": ["021d"],
            "unlock": ["021e0c0000000431323334"],
        ]
    }()

    static let goldenAnswers: [String: [String]] = {
        let o = answerOptions
        return [
            "cancel": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "028332000000080000000000000002"],
            "fallback": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "028332000000080000000000000003"],
            "finger": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "02833200000008000000000000000033000000057468756d62"],
            "interrupted": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "028332000000080000000000000004"],
            "passcode": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "028332000000080000000000000001340000000431323334"],
            "unavailable": ["0202" + o + "0200000005746f6b656e0a000000080000000000000002", "028332000000080000000000000005350000000b6e6f207465726d696e616c"],
        ]
    }()

    static let goldenPrompt = "0282280000000e0200010000000154040000000143290000001a5b2266696e6765727072696e74222c2270617373636f6465225d2a000000046d61696c2b00000005746f6b656e2c0000000800000000000000022d000000086e6f206d61746368"

    @Test func eachOperationsRequestIsTheBytesTheProtocolPinned() async throws {
        let recorder = try Recorder()
        let client = DaemonClient(socketPath: recorder.socket)
        let storage = try StorageRef(scope: .user(1600), options: KeychainOptions(service: "mail", accessGroup: "team",
                                                                                     prompt: Prompt(title: "Mail")),
                                     defaultService: "mail", forWire: true)
        var seen: [String: [String]] = [:]
        for (name, call) in await Self.calls(client, storage) {
            _ = try? await call()
            seen[name] = recorder.take()
        }
        #expect(seen == Self.golden)
    }

    /// Each request's reply as keychaind's handler makes it from the service's answer, byte for byte,
    /// and read back by the library's client as the service answered.
    @Test func eachOperationsReplyIsTheBytesTheProtocolPinnedAndReadsBackAsAnswered() async throws {
        let service = GoldenService()
        let recorder = try Recorder(handler: DaemonRequestHandler(service: service, groups: .init(directory: nil)))
        let client = DaemonClient(socketPath: recorder.socket)
        let options = KeychainOptions(service: "mail", prompt: Prompt(title: "Mail"))
        let storage = try StorageRef(scope: .user(1600), options: options, defaultService: "mail", forWire: true)
        let local = try StorageRef(scope: .user(0), options: options, defaultService: "mail")
        let direct = await Self.calls(service, local)
        var replies: [String: String] = [:]
        for ((name, call), (_, directCall)) in zip(await Self.calls(client, storage), direct) {
            let (answered, expected) = (await Self.outcome(call), await Self.outcome(directCall))
            let frames = recorder.take()
            replies[name] = frames.dropFirst().joined(separator: " ")
            #expect(answered == expected, "\(name)")
        }
        #expect(replies == Self.goldenReplies)
    }

    /// What a call returned or threw, in words (the error's code, message and cause).
    static func outcome(_ call: () async throws -> String) async -> String {
        do { return try await call() } catch { return "\(error)" }
    }

    @Test func eachPromptAnswerIsTheBytesTheProtocolPinned() async throws {
        let recorder = try Recorder()
        let client = DaemonClient(socketPath: recorder.socket)
        let storage = try StorageRef(scope: .user(1600), options: KeychainOptions(service: "mail"), defaultService: "mail", forWire: true)
        let answers: [(String, AuthenticationAnswer)] = [("finger", .finger("thumb")), ("passcode", .passcode(Self.secure("1234"))),
                                                         ("cancel", .cancel), ("fallback", .fallback), ("interrupted", .interrupted),
                                                         ("unavailable", .unavailable("no terminal"))]
        var seen: [String: [String]] = [:]
        for (name, answer) in answers {
            let authenticator = Answering(answer: answer)
            _ = try? await client.getItem("token", options: nil, in: storage, authenticator: authenticator)
            seen[name] = recorder.take()
            #expect(authenticator.asked.withLock { $0 } == ["T|C|[\"fingerprint\", \"passcode\"]|mail|token|2|no match"], "\(name)")
        }
        #expect(seen == Self.goldenAnswers)
    }


    /// keychaind's prompt as `RemoteAuthenticator` sends it is the one the recorder asks with.
    @Test func keychaindsPromptIsTheBytesTheProtocolPinned() async throws {
        let mailbox = Mailbox()
        let remote = RemoteAuthenticator(mailbox: mailbox, attemptsPerRead: 2)
        let request = AuthenticationRequest(prompt: Prompt(title: "T", cancel: "C"), methods: [.fingerprint, .passcode], service: "mail",
                                            key: "token", attempt: 2, previousFailure: "no match")
        let asked = Task { await remote.authenticate(request) }
        guard case .prompt(let prompt, let handover) = mailbox.next() else { Issue.record("no prompt"); return }
        handover.deliver(nil)
        guard case .interrupted = await asked.value else { Issue.record("not interrupted"); return }
        #expect(hex(prompt.encoded()) == Self.goldenPrompt)
    }

    /// keychaind reads each answer as the client meant it, and one that does not say (an unknown
    /// number, a finger or passcode missing) as `interrupted`, which changes nothing.
    @Test func anAnswerIsReadAsSentAndOneThatDoesNotSayIsInterrupted() {
        let answers: [WirePromptAnswer] = [.finger("thumb"), .passcode([1, 2]), .cancel, .fallback, .interrupted, .unavailable("no tty")]
        for answer in answers { #expect(WirePromptAnswer(decoding: answer.message) == answer) }
        for number: UInt64 in [0, 1, 6, 255] {
            var bare = WireMessage(kind: WireKind.answer)
            bare.add(WireTag.answerKind, number)
            #expect(WirePromptAnswer(decoding: bare) == .interrupted, "\(number)")
        }
        var unavailable = WireMessage(kind: WireKind.answer)
        unavailable.add(WireTag.answerKind, WirePromptAnswer.Kind.unavailable.rawValue)
        #expect(WirePromptAnswer(decoding: unavailable) == .unavailable("the client's prompt reaches no one"))
        #expect(WirePromptAnswer(decoding: WireMessage(kind: WireKind.answer)) == .interrupted)
    }
}

private func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

private func unhex(_ text: String) -> [UInt8] {
    let digits = Array(text.utf8)
    return stride(from: 0, to: digits.count, by: 2).map { UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
}

extension WireGoldenTests {
    /// The bundle `importBundle` sends (its JSON document travels as it is).
    static let bundle = ProvisioningBundle(format: ProvisioningBundle.formatName, version: 1, parent: "srk", target: "00", service: "mail",
                                           key: "token", label: nil, accessible: .afterFirstUnlock, accessControl: .none, itemVersion: 0,
                                           pcrs: nil, publicArea: "", duplicate: "", encryptedSeed: "", nonce: "", ciphertext: "")

    /// `bundle`'s document, as the client sends it (pretty-printed, keys sorted: `ProvisioningJSON`).
    static let bundleDocument = """
        {
          "accessControl" : "none",
          "accessible" : "afterFirstUnlock",
          "ciphertext" : "",
          "duplicate" : "",
          "encryptedSeed" : "",
          "format" : "keychain-linux bundle",
          "itemVersion" : 0,
          "key" : "token",
          "nonce" : "",
          "parent" : "srk",
          "publicArea" : "",
          "service" : "mail",
          "target" : "00",
          "version" : 1
        }
        """

    /// Each reply as `GoldenService`'s answers make it (JSON objects' keys sorted: `Recorder.sortingJSON`).
    static let goldenReplies: [String: String] = [
        "allKeys": "0280160000000c5b2261222c22625c2f63225d",
        "allServices": "028016000000085b226d61696c225d",
        "attestKey": "028014000001627b0a2020226174746573746174696f6e4b65794e616d6522203a20223030222c0a202022636c61696d22203a207b0a2020202022616363657373436f6e74726f6c22203a20226e6f6e65222c0a202020202261636365737369626c6522203a2022616c77617973222c0a20202020227365727669636522203a20226d61696c220a20207d2c0a2020226372656174696f6e43657274696669636174696f6e22203a207b0a202020202261747465737422203a2022222c0a20202020227369676e617475726522203a2022220a20207d2c0a2020226372656174696f6e4461746122203a2022222c0a202022666f726d617422203a20226b6579636861696e2d6c696e7578206b6579206174746573746174696f6e222c0a2020226e6f6e636522203a202241514944222c0a202022706f6c69637922203a2022222c0a2020227075626c69634172656122203a2022222c0a20202276657273696f6e22203a20310a7d",
        "biometryTypes": "0280160000000f5b2266696e6765727072696e74225d",
        "changePasscode": "0280",
        "clear": "0280",
        "deleteReader": "0280150000000100",
        "deviceCanUse": "028016000000127b22617661696c61626c65223a747275657d",
        "dropCaches": "0280",
        "endWindows": "0280",
        "enrollFinger": "0280",
        "enrolledFingers": "028016000000095b227468756d62225d",
        "getItem": "0280140000000e76616c7565206f6620746f6b656e",
        "getItems": "02801800000085000000150280140000000e76616c7565206f6620746f6b656e0000000202800000006202811e0000001541555448454e5449434154494f4e5f4641494c45441f00000012546865206974656d206973206c6f636b6564200000000800000000000000002100000008000000000000098e220000001054504d5f52435f415554485f4641494c",
        "hasItem": "0280150000000101",
        "identity": "02811e0000001448415244574152455f554e415641494c41424c451f000000064e6f2054504d2000000008000000000000000221000000080000000000000002",
        "importBundle": "0280160000000a22696d706f7274656422",
        "importBundleWithPasscode": "0280160000000a22696d706f7274656422",
        "initialize": "028016000000c27b226c6f636b6f7574417574686f72697a6174696f6e536574223a747275652c226c6f636b5374617465223a22756e6c6f636b6564222c226f776e6572417574686f72697a6174696f6e536574223a66616c73652c2270617373636f6465536574223a747275652c2273656375726974794c6576656c223a22736f66747761726554504d222c2273746f72616765526f6f744b6579223a2270696e6e6564222c2274706d223a22737774706d222c227761726e696e6773223a5b227765616b225d7d",
        "itemInfo": "028016000000947b22616363657373436f6e74726f6c223a2270617373636f6465222c2261636365737369626c65223a22616c77617973222c2263726561746564223a312c226b6579223a22746f6b656e222c226c6162656c223a224c222c226d6f646966696564223a322c2273656375726974794c6576656c223a22736f66747761726554504d222c2273657276696365223a226d61696c227d",
        "lock": "0280",
        "removeFinger": "0280150000000101",
        "removeItem": "0280",
        "removePasscode": "0280",
        "resetPasscodeTries": "0280",
        "resetTokenPINTries": "0280",
        "setItem": "0280",
        "setItemPlain": "0280",
        "setPasscode": "0280",
        "status": "028016000000c27b226c6f636b6f7574417574686f72697a6174696f6e536574223a747275652c226c6f636b5374617465223a22756e6c6f636b6564222c226f776e6572417574686f72697a6174696f6e536574223a66616c73652c2270617373636f6465536574223a747275652c2273656375726974794c6576656c223a22736f66747761726554504d222c2273746f72616765526f6f744b6579223a2270696e6e6564222c2274706d223a22737774706d222c227761726e696e6773223a5b227765616b225d7d",
        "storageCanUse": "0280160000002a7b22617661696c61626c65223a66616c73652c22726561736f6e223a226e6f74456e726f6c6c6564227d",
        "takeTPMCommandCount": "028017000000080000000000000007",
        "tokenStatus": "0280160000007e7b226c6162656c223a2274222c226d616e756661637475726572223a226d222c226d6f64656c223a226f222c2273657269616c223a2273222c227573657250696e436f756e744c6f77223a66616c73652c227573657250696e46696e616c547279223a747275652c227573657250696e4c6f636b6564223a66616c73657d",
        "unlock": "0280",
    ]
}

/// A `KeychainService` with one fixed answer a call: every kind of result a reply carries (a value, none,
/// a boolean, a list, a document, a number, an error with its cause).
final class GoldenService: KeychainService {
    static let locked = KeychainError(.authenticationFailed, "The item is locked", underlying: .tpm(code: 0x98E, name: "TPM_RC_AUTH_FAIL"))
    static let status = try! JSONDecoder().decode(DeviceStatus.self, from: Data("""
        {"passcodeSet":true,"lockState":"unlocked","securityLevel":"softwareTPM","tpm":"swtpm","ownerAuthorizationSet":false,
         "lockoutAuthorizationSet":true,"storageRootKey":"pinned","warnings":["weak"]}
        """.utf8))

    func setItem(_ key: String, _ value: SecureBytes, options: SetItemOptions?, in storage: StorageRef) async throws(KeychainError) {}
    func getItem(_ key: String, options: GetItemOptions?, in storage: StorageRef,
                 authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes? {
        switch key {
        case "absent": return nil
        case "locked": throw Self.locked
        default: return SecureBytes(copying: Array("value of \(key)".utf8))
        }
    }
    func warmItem(_ key: String, in storage: StorageRef) -> WarmRead? { nil }
    func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool { true }
    func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError) {}
    func clear(_ storage: StorageRef) async throws(KeychainError) {}
    func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String] { ["a", "b/c"] }
    func allServices(in storage: StorageRef) async throws(KeychainError) -> [String] { ["mail"] }
    func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo? {
        ItemInfo(key: key, service: storage.service, accessible: .always, accessControl: .passcode, label: "L",
                 created: Date(timeIntervalSinceReferenceDate: 1), modified: Date(timeIntervalSinceReferenceDate: 2),
                 securityLevel: .softwareTPM, token: nil)
    }
    func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck {
        .init(available: false, reason: .notEnrolled)
    }
    func getItems(_ keys: [String], in storage: StorageRef, authenticator: (any Authenticator)?) async throws(KeychainError) -> [ItemRead] {
        var reads: [ItemRead] = []
        for key in keys {
            do { reads.append(.success(try await getItem(key, options: nil, in: storage, authenticator: authenticator))) } catch {
                reads.append(.failure(error))
            }
        }
        return reads
    }
    func endWindows(in storage: StorageRef) async throws(KeychainError) {}
    func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation {
        KeyAttestation(format: KeyAttestation.formatName, version: 1,
                       claim: .init(service: storage.service, accessible: .always, accessControl: .none),
                       attestationKeyName: "00", nonce: Data(nonce).base64EncodedString(), publicArea: "", policy: "", creationData: "",
                       creationCertification: AttestationAnswer.Signed(attest: "", signature: ""))
    }
    func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) {}
    func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool { true }
    func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool { false }
    func enrolledFingers() async throws(KeychainError) -> [String] { ["thumb"] }
    func biometryTypes() -> [BiometryType] { [.fingerprint] }
    func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck { .init(available: true, reason: nil) }
    func initialize() async throws(KeychainError) -> DeviceStatus { Self.status }
    func status() async throws(KeychainError) -> DeviceStatus { Self.status }
    func resetTokenPINTries() async throws(KeychainError) {}
    func tokenStatus() async throws(KeychainError) -> TokenStatus? {
        TokenStatus(label: "t", manufacturer: "m", model: "o", serial: "s", userPinLocked: false, userPinFinalTry: true, userPinCountLow: false)
    }
    func unlock(passcode: SecureBytes?) async throws(KeychainError) {}
    func lock() async throws(KeychainError) {}
    func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError) {}
    func resetPasscodeTries() async throws(KeychainError) {}
    func takeTPMCommandCount() async -> Int { 7 }
    func dropCaches() async {}
    func identity() async throws(KeychainError) -> DeviceIdentity {
        throw KeychainError(.hardwareUnavailable, "No TPM", underlying: .errno(ENOENT))
    }
    func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?, in scope: ItemScope) async throws(KeychainError) -> ImportOutcome {
        .imported
    }
}
