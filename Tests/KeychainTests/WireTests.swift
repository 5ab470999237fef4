import Foundation
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import Testing
@testable import Keychain
@testable import KeychainEngine

/// keychaind's wire format: round trips, and a decoder that refuses without crashing.
@Suite("keychaind protocol", .offThePool)
struct WireTests {

    static func sample() -> WireMessage {
        var message = WireMessage(kind: WireOp.setItem.rawValue)
        message.add(WireTag.options, KeychainOptions(service: "svc", accessControl: .passcode).wire.encoded())
        message.add(WireTag.key, "k")
        message.add(WireTag.value, [0, 1, 2, 255])
        message.add(WireTag.accessible, "always")
        message.add(WireTag.authValidity, UInt64(5))
        message.add(WireTag.synchronizable, false)
        return message
    }

    @Test func aMessageRoundTripsAndHasOneEncoding() throws {
        let encoded = Self.sample().encoded()
        let decoded = try WireMessage.decode(encoded)
        #expect(decoded.kind == WireOp.setItem.rawValue)
        #expect(decoded.encoded() == encoded)
        #expect(try decoded.string(WireTag.key) == "k")
        #expect(try decoded.uint(WireTag.authValidity) == 5)
        let call = try #require(try SetItemOptions(wire: WireCall.setItem.request(from: decoded).options))
        #expect(call.accessible == .always && call.authValidity == 5 && call.synchronizable == false && call.accessControl == nil)
    }

    @Test func repeatedOrOutOfOrderFieldsAnotherVersionAndCutMessagesAreRefused() {
        let good = Self.sample().encoded()
        #expect(throws: WireError(.version, "")) { try WireMessage.decode([Wire.version + 1] + good.dropFirst()) }
        #expect(throws: WireError(.malformed, "")) { try WireMessage.decode([Wire.version]) }
        for cut in 3..<good.count where !Self.endsAField(good, at: cut) {
            #expect(throws: WireError(.malformed, "")) { try WireMessage.decode(Array(good.prefix(cut))) }
        }
        let twice: [UInt8] = [Wire.version, 2, 2, 0, 0, 0, 1, 65, 2, 0, 0, 0, 1, 66]
        #expect(throws: WireError(.malformed, "")) { try WireMessage.decode(twice) }
        let backwards: [UInt8] = [Wire.version, 2, 3, 0, 0, 0, 0, 2, 0, 0, 0, 0]
        #expect(throws: WireError(.malformed, "")) { try WireMessage.decode(backwards) }
        let huge: [UInt8] = [Wire.version, 2, 2, 0xFF, 0xFF, 0xFF, 0xFF, 0]
        #expect(throws: WireError(.malformed, "")) { try WireMessage.decode(huge) }
    }

    static func endsAField(_ bytes: [UInt8], at cut: Int) -> Bool {
        var at = 2
        while at < cut {
            guard bytes.count - at >= 5 else { return false }
            let length = Int(bytes[at + 1]) << 24 | Int(bytes[at + 2]) << 16 | Int(bytes[at + 3]) << 8 | Int(bytes[at + 4])
            at += 5 + length
        }
        return at == cut
    }

    /// 200,000 inputs: random bytes, and the valid message with bytes flipped, cut, repeated and
    /// spliced. The decoder and the request's field readers never crash and never accept a message
    /// whose encoding differs from its input (one encoding per message).
    @Test func theDecoderSurvivesFuzzing() {
        var random = SeededGenerator(seed: 13)
        let good = Self.sample().encoded()
        var accepted = 0
        for round in 0..<200_000 {
            var input: [UInt8]
            switch round % 4 {
            case 0: input = (0..<Int.random(in: 0...64, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            case 1:
                input = good
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    input[Int.random(in: 0..<input.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                }
            case 2: input = Array(good.prefix(Int.random(in: 0...good.count, using: &random)))
            default:
                let from = Int.random(in: 2..<good.count, using: &random)
                input = Array(good.prefix(from)) + Array(good[Int.random(in: 2..<good.count, using: &random)...])
            }
            guard let message = try? WireMessage.decode(input) else { continue }
            accepted += 1
            #expect(message.encoded() == input)
            _ = try? SetItemOptions(wire: WireCall.setItem.request(from: message).options)
            _ = try? message.bytes(WireTag.options).map { bytes throws(WireError) in try KeychainOptions(wire: WireStorageOptions(decoding: bytes)) }
            _ = try? KeychainError(decoding: message)
            for tag in message.fields.map(\.tag) { _ = try? message.string(tag); _ = try? message.uint(tag); _ = try? message.bool(tag) }
        }
        #expect(accepted > 1000, "mutations that stay valid reach the field readers")
    }

    /// The fuzzed requests, sent to a running daemon: it answers or drops each one, and then serves a
    /// well-formed call.
    @Test func aDaemonSurvivesFuzzedRequests() async throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let storage = try createKeychain(.init(service: "svc"), configuration: daemon.configuration())
        try await storage.setItem("k", "v")
        var random = SeededGenerator(seed: 31)
        let good = Self.sample().encoded()
        for _ in 0..<300 {
            var input = good
            for _ in 0..<Int.random(in: 1...3, using: &random) {
                input[Int.random(in: 0..<input.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
            }
            input[0] = Wire.version
            guard case .success(let fd) = WireSocket.connect(path: daemon.socket) else { Issue.record("connect"); return }
            defer { close(fd) }
            let frame = [UInt8(input.count >> 24 & 0xFF), UInt8(input.count >> 16 & 0xFF), UInt8(input.count >> 8 & 0xFF),
                         UInt8(input.count & 0xFF)] + input
            _ = frame.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if let reply = try? WireSocket.receive(fd, idle: 60, stall: 60) {
                #expect(reply.kind == WireKind.ok || reply.kind == WireKind.error)
            }
        }
        #expect(try await storage.getItem("k") == "v")
    }

    /// The value sets the front checks its options against are the library's, word for word.
    @Test func theWiresValueSetsAreTheLibrarysEnums() {
        #expect(WireValues.accessible == Accessible.allCases.map(\.rawValue))
        #expect(WireValues.accessControl == AccessControl.allCases.map(\.rawValue))
        #expect(WireValues.keyStorage == KeyStorage.allCases.map(\.rawValue))
    }

    /// Every cause survives the error codec, and reads as the library writes it.
    @Test func anErrorAndItsCauseRoundTrip() throws {
        let causes: [KeychainError.Cause?] = [nil, .tpm(code: 0x98E, name: "TPM2_RC_AUTH_FAIL"), .sqlite(code: -5, message: "busy"),
                                              .errno(-13), .pkcs11(code: 0xA0, name: "CKR_PIN_INCORRECT"), .other("why")]
        for cause in causes {
            let error = KeychainError(.hardwareUnavailable, "a message", underlying: cause)
            let decoded = try KeychainError(decoding: try WireMessage.decode(error.wireMessage.encoded()))
            #expect(decoded.description == error.description)
            #expect(try WireErrorReply(decoding: error.wireMessage).cause?.description == cause?.description)
        }
        #expect(KeychainError.Cause.tpm(code: 0x98E, name: "X").description == "TPM X (0x0000098E)")
    }

    /// A storage's options cross the socket as typed fields: every field, each away from its default,
    /// and the defaults, come back as they were sent (inside a request, through its encoding).
    @Test func aStoragesOptionsRoundTripAsFields() throws {
        let every = KeychainOptions(service: "mail", accessible: .whenPasscodeSetThisDeviceOnly, accessControl: .biometryCurrentSetOrPasscode,
                                    authValidity: -5, synchronizable: true, accessGroup: "team",
                                    prompt: Prompt(title: "T", subtitle: "S", description: "D", cancel: "C"),
                                    android: AndroidOptions(keyStorage: .strongbox))
        let some = KeychainOptions(service: "a\"b\\c\u{1}é/", prompt: Prompt(title: "only the title"))
        for options in [every, some, KeychainOptions(service: "x")] {
            var request = WireMessage(kind: WireOp.getItem.rawValue)
            request.add(WireTag.options, options.wire.encoded())
            let carried = try #require(try WireMessage.decode(request.encoded()).bytes(WireTag.options))
            #expect(try KeychainOptions(wire: WireStorageOptions(decoding: carried)) == options)
        }
        #expect(try WireStorageOptions(decoding: every.wire.encoded()).prompt == WirePrompt(title: "T", subtitle: "S", description: "D", cancel: "C"))
        #expect(try WirePrompt(decoding: Prompt(cancel: "Use password").wire.encoded()) == WirePrompt(cancel: "Use password"))
    }

    /// keychainctl's front (no Foundation) sends the service and access group alone: they read as the
    /// library's options with every other field its default.
    @Test func theFrontsStorageOptionsAreTheLibrarysOptions() throws {
        for (service, group) in [("mail", nil), ("a\"b\\c\u{1}\u{1F}é/", "team"), ("x", "g\n")] as [(String, String?)] {
            let sent = WireStorageOptions(service: service, accessGroup: group).encoded()
            #expect(try KeychainOptions(wire: WireStorageOptions(decoding: sent)) == KeychainOptions(service: service, accessGroup: group))
        }
    }

    /// A word that is none of the library's, a field of the wrong shape or a nested message of
    /// another kind is refused, naming it; never a default in its place.
    @Test func aWrongOptionsFieldIsRefusedNamingIt() {
        func refusal(_ bytes: [UInt8]) -> String? {
            do { _ = try KeychainOptions(wire: WireStorageOptions(decoding: bytes)); return nil } catch { return error.detail }
        }
        #expect(refusal(WireStorageOptions(service: "s", accessible: "sometimes").encoded()) == "unknown Accessible 'sometimes'")
        #expect(refusal(WireStorageOptions(service: "s", accessControl: "faceID").encoded()) == "unknown AccessControl 'faceID'")
        #expect(refusal(WireStorageOptions(service: "s", keyStorage: "cloud").encoded()) == "unknown KeyStorage 'cloud'")
        var notFields = WireMessage(kind: WireOp.getItem.rawValue)
        notFields.add(1, "s")
        #expect(refusal(notFields.encoded()) == "the storage options field is not a list of fields")
        var badBool = WireMessage(kind: WireKind.fields)
        badBool.add(5, [2])
        #expect(refusal(badBool.encoded()) == "field 5 is not a boolean")
        var badText = WireMessage(kind: WireKind.fields)
        badText.add(1, [0xFF])
        #expect(refusal(badText.encoded()) == "field 1 is not UTF-8")
        #expect(refusal(Array(#"{"service":"mail"}"#.utf8)) == "protocol version 123, this side speaks \(Wire.version)")
    }

    /// The one rule that finds keychaind, shared by the library's default, both keychainctl tools and
    /// the Secret Service provider: the named socket first, a named store keeps the process's own
    /// store, else the system's socket only when it exists.
    @Test func keychaindIsFoundByOneRule() {
        func resolve(_ environment: [String: String], systemSocketExists: Bool) -> String? {
            DaemonSocket.resolve(variable: { environment[$0] }, exists: { $0 == DaemonSocket.system && systemSocketExists })
        }
        #expect(resolve(["KEYCHAIN_SOCKET": "/tmp/k.sock", "KEYCHAIN_STORE": "/s"], systemSocketExists: true) == "/tmp/k.sock")
        #expect(resolve(["KEYCHAIN_STORE": "/s"], systemSocketExists: true) == nil)
        #expect(resolve([:], systemSocketExists: true) == "/run/keychain/keychaind.sock")
        #expect(resolve(["KEYCHAIN_SOCKET": "", "KEYCHAIN_STORE": ""], systemSocketExists: true) == "/run/keychain/keychaind.sock")
        #expect(resolve([:], systemSocketExists: false) == nil)
        #expect(KeychainConfiguration.systemSocket == DaemonSocket.system)
    }
}
