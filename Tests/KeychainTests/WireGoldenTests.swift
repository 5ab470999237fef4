import Foundation
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Synchronization
import Testing
@testable import Keychain
@testable import KeychainDaemon

/// keychaind's bytes pinned: each operation's request as the library's client sends it, the prompt
/// keychaind asks with and each answer a client gives, byte for byte as the protocol's second
/// version wrote them (taken from the hand-written encoders before the codecs replaced them).
@Suite("keychaind protocol: golden bytes", .offThePool)
struct WireGoldenTests {
    /// A socket that records each frame it gets: a `getItem` that carries `attempts` is asked a
    /// prompt first (its answer recorded too), and every request is then refused with an error reply.
    final class Recorder: @unchecked Sendable {
        let directory: String
        var socket: String { directory + "/golden.sock" }
        let listener: Int32
        let frames = Mutex<[[UInt8]]>([])

        init() throws {
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
            return (try? WireSocket.send(fd, KeychainError(.internal, "recorded").wireMessage)) != nil
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
    static func calls(_ client: DaemonClient, _ storage: StorageRef) async -> [(String, () async throws -> Void)] {
        let (pin, new) = (secure("1234"), secure("5678"))
        let getOptions = GetItemOptions(prompt: Prompt(subtitle: "for the mail"))
        let setOptions = SetItemOptions(accessible: .always, accessControlOverride: .passcode, authValidity: 5, label: "L", synchronizable: false)
        return [
            ("setItem", { try await client.setItem("token", secure("v"), options: setOptions, in: storage) }),
            ("setItemPlain", { try await client.setItem("token", secure("v"), options: nil, in: storage) }),
            ("getItem", { _ = try await client.getItem("token", options: getOptions, in: storage, authenticator: nil) }),
            ("hasItem", { _ = try await client.hasItem("token", in: storage) }),
            ("removeItem", { try await client.removeItem("token", in: storage) }),
            ("clear", { try await client.clear(storage) }),
            ("allKeys", { _ = try await client.allKeys(in: storage) }),
            ("allServices", { _ = try await client.allServices(in: storage) }),
            ("itemInfo", { _ = try await client.itemInfo("token", in: storage) }),
            ("storageCanUse", { _ = try await client.canUseAccessControl(.biometryAny, in: storage) }),
            ("endWindows", { try await client.endWindows(in: storage) }),
            ("attestKey", { _ = try await client.attestKey(nonce: [1, 2, 3], in: storage) }),
            ("enrollFinger", { try await client.enrollFinger("thumb", passcode: pin) }),
            ("removeFinger", { _ = try await client.removeFinger("thumb", passcode: nil) }),
            ("deleteReader", { _ = try await client.deleteReader(passcode: pin) }),
            ("enrolledFingers", { _ = try await client.enrolledFingers() }),
            ("biometryTypes", { _ = client.biometryTypes() }),
            ("deviceCanUse", { _ = try await client.canUseAccessControl(.passcode) }),
            ("initialize", { _ = try await client.initialize() }),
            ("status", { _ = try await client.status() }),
            ("resetTokenPINTries", { try await client.resetTokenPINTries() }),
            ("tokenStatus", { _ = try await client.tokenStatus() }),
            ("unlock", { try await client.unlock(passcode: pin) }),
            ("lock", { try await client.lock() }),
            ("setPasscode", { try await client.setPasscode(old: nil, new: new) }),
            ("changePasscode", { try await client.setPasscode(old: pin, new: new) }),
            ("removePasscode", { try await client.setPasscode(old: pin, new: nil) }),
            ("resetPasscodeTries", { try await client.resetPasscodeTries() }),
            ("takeTPMCommandCount", { _ = await client.takeTPMCommandCount() }),
            ("dropCaches", { await client.dropCaches() }),
            ("identity", { _ = try await client.identity() }),
        ]
    }


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
            "getItem": ["0202" + o + "0200000005746f6b656e09000000130200020000000c666f7220746865206d61696c"],
            "hasItem": ["0203" + o + "0200000005746f6b656e"],
            "identity": ["0228"],
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
        guard case .prompt(let prompt, let continuation) = mailbox.next() else { Issue.record("no prompt"); return }
        continuation.resume(returning: nil)
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
