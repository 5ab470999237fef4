import KeychainBasics

/// What keychaind's messages mean (docs/daemon.md): request kinds, reply kinds, field tags, the
/// values an option field may take, the error codec. The library's client, keychaind and
/// keychainctl's front all read this one copy, so no side can disagree on a number or a word.

/// A request's kind: one keychain call.
public enum WireOp: UInt8, CaseIterable, Sendable {
    // A storage's calls: the options (service resolved by the client) travel with each.
    case setItem = 1, getItem, hasItem, removeItem, clear, allKeys, itemInfo, storageCanUse, endWindows,
         /// The AK's statement of the storage's wrapping key (`nonce`; the document in `resultBytes`).
         attestKey,
         /// The services of the storage's scope that hold items (its own service is not used):
         /// `credential ls` with no unit, every unit's.
         allServices,
         /// Reads of several items of the storage in one exchange (`keys`, a `WireList` of keys;
         /// the reply's `resultItems` holds the first keys' outcomes, at least one: ask again for the rest).
         getItems
    // The device's.
    case enrollFinger = 20, removeFinger, deleteReader, enrolledFingers, biometryTypes, deviceCanUse,
         initialize, status, resetTokenPINTries, tokenStatus, unlock, lock, setPasscode, changePasscode,
         removePasscode, resetPasscodeTries, takeTPMCommandCount, dropCaches
    // Provisioning: the device's identity document, and a bundle sealed to it (lands in the caller's scope).
    case identity = 40, importBundle

    /// A storage's call (it carries the storage's options), else a device's.
    public var isStorageCall: Bool { rawValue < WireOp.enrollFinger.rawValue }

    /// Device-wide changes, locking the device for every user, the fingers' names and the TPM command
    /// count (every user's calls in it), provisioning (the identity provisions the TPM; a bundle may
    /// be a systemd credential): root or the `admin` access group only (docs/security.md).
    public var needsAdmin: Bool {
        switch self {
        case .enrollFinger, .removeFinger, .deleteReader, .initialize, .resetTokenPINTries, .setPasscode,
             .changePasscode, .removePasscode, .resetPasscodeTries, .dropCaches, .lock, .enrolledFingers,
             .takeTPMCommandCount, .identity, .importBundle: true
        default: false
        }
    }
}

/// Message kinds other than requests.
public enum WireKind {
    public static let ok: UInt8 = 0x80
    public static let error: UInt8 = 0x81
    /// The daemon asks the client's authenticator (the client answers with `answer`).
    public static let prompt: UInt8 = 0x82
    public static let answer: UInt8 = 0x83
}

/// Field tags; a request carries only those its call needs.
public enum WireTag {
    /// The storage's options (`WireStorageOptions`, service resolved).
    public static let options: UInt8 = 1, key: UInt8 = 2, value: UInt8 = 3
    public static let accessible: UInt8 = 4, accessControl: UInt8 = 5, authValidity: UInt8 = 6, label: UInt8 = 7,
                      synchronizable: UInt8 = 8
    /// A read's own prompt texts (`WirePrompt`).
    public static let prompt: UInt8 = 9
    /// The client's authenticator's `attemptsPerRead`; absent when the client has no authenticator.
    public static let attempts: UInt8 = 10
    public static let finger: UInt8 = 11, passcode: UInt8 = 12, newPasscode: UInt8 = 13
    /// A provisioning bundle's JSON document (`importBundle`).
    public static let bundle: UInt8 = 14
    /// The caller's nonce of a key attestation (`attestKey`), 1 to 32 bytes.
    public static let nonce: UInt8 = 15
    /// A batch read's keys (`getItems`): a `WireList` of UTF-8 keys, 1 to `WireList.maxKeys`.
    public static let keys: UInt8 = 16
    public static let resultBytes: UInt8 = 20, resultBool: UInt8 = 21, resultJSON: UInt8 = 22, resultNumber: UInt8 = 23
    /// A batch read's outcomes, in the order of its keys: a `WireList` of messages, each the reply
    /// `getItem` would give (ok with or without `resultBytes`, or an error).
    public static let resultItems: UInt8 = 24
    public static let errorCode: UInt8 = 30, errorMessage: UInt8 = 31, causeKind: UInt8 = 32, causeNumber: UInt8 = 33,
                      causeText: UInt8 = 34
    /// keychaind's prompt: its texts (`WirePrompt`), the methods (JSON), the item, the attempt, the last failure.
    public static let promptTexts: UInt8 = 40, methods: UInt8 = 41, service: UInt8 = 42, promptKey: UInt8 = 43, attempt: UInt8 = 44,
                      previousFailure: UInt8 = 45
    public static let answerKind: UInt8 = 50, answerFinger: UInt8 = 51, answerPasscode: UInt8 = 52, answerReason: UInt8 = 53
}

/// A list in one field (a message's tags never repeat): each element a 4-byte big-endian length,
/// then its bytes.
public enum WireList {
    /// The most keys of one `getItems`.
    public static let maxKeys = 1024
    /// A `getItems` reply stops adding outcomes past this many bytes (it always holds one): the
    /// client asks again for the rest, so a batch never makes a frame past `Wire.maxMessage`.
    public static let replyBudget = 4 << 20

    public static func encode(_ elements: [[UInt8]]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(elements.reduce(0) { $0 + 4 + $1.count })
        for element in elements {
            let count = UInt32(element.count)
            out += [UInt8(count >> 24), UInt8(truncatingIfNeeded: count >> 16), UInt8(truncatingIfNeeded: count >> 8),
                    UInt8(truncatingIfNeeded: count)]
            out += element
        }
        return out
    }

    /// The elements; `malformed` for a length past the end.
    public static func decode(_ bytes: [UInt8]) throws(WireError) -> [[UInt8]] {
        var elements: [[UInt8]] = []
        var at = 0
        while at < bytes.count {
            guard bytes.count - at >= 4 else { throw WireError(.malformed, "list element header cut at byte \(at)") }
            let length = Int(bytes[at]) << 24 | Int(bytes[at + 1]) << 16 | Int(bytes[at + 2]) << 8 | Int(bytes[at + 3])
            at += 4
            guard length <= bytes.count - at else { throw WireError(.malformed, "list element runs past its field") }
            elements.append(Array(bytes[at..<(at + length)]))
            at += length
        }
        return elements
    }
}

/// The words an option field may hold: the raw values of the library's `Accessible` and
/// `AccessControl`, in their order (a test pins the two together).
public enum WireValues {
    public static let accessible = ["whenUnlocked", "afterFirstUnlock", "always", "whenPasscodeSetThisDeviceOnly",
                                    "whenUnlockedThisDeviceOnly", "afterFirstUnlockThisDeviceOnly", "alwaysThisDeviceOnly"]
    public static let accessControl = ["none", "biometryAny", "biometryCurrentSet", "biometryAnyOrPasscode",
                                       "biometryCurrentSetOrPasscode", "passcode"]
}

/// A write's own options as fields (`accessible` … `synchronizable`), each absent when the call
/// leaves it to the storage. The words are checked against `WireValues` by whoever reads them.
public struct WireSetOptions: Sendable, Equatable {
    public var accessible: String?
    public var accessControl: String?
    public var authValidity: Int?
    public var label: String?
    public var synchronizable: Bool?

    public init(accessible: String? = nil, accessControl: String? = nil, authValidity: Int? = nil, label: String? = nil,
                synchronizable: Bool? = nil) {
        (self.accessible, self.accessControl, self.authValidity) = (accessible, accessControl, authValidity)
        (self.label, self.synchronizable) = (label, synchronizable)
    }

    public func add(to message: inout WireMessage) {
        message.add(WireTag.accessible, accessible)
        message.add(WireTag.accessControl, accessControl)
        message.add(WireTag.authValidity, authValidity.map { UInt64(bitPattern: Int64($0)) })
        message.add(WireTag.label, label)
        message.add(WireTag.synchronizable, synchronizable)
    }

    /// nil when the message carries none of the fields.
    public init?(wire message: WireMessage) throws(WireError) {
        accessible = try message.string(WireTag.accessible)
        accessControl = try message.string(WireTag.accessControl)
        authValidity = try message.uint(WireTag.authValidity).map { Int(Int64(bitPattern: $0)) }
        label = try message.string(WireTag.label)
        synchronizable = try message.bool(WireTag.synchronizable)
        guard accessible != nil || accessControl != nil || authValidity != nil || label != nil || synchronizable != nil else {
            return nil
        }
    }
}

/// The words a storage's `keyStorage` may hold: the raw values of the library's `KeyStorage`.
extension WireValues {
    public static let keyStorage = ["tee", "strongbox"]
}

/// Which fields a nested options message (`WireStorageOptions`, `WirePrompt`) carries: a message of
/// this kind inside one field of a request or prompt, with its own tags.
extension WireKind {
    public static let fields: UInt8 = 0
}

/// Prompt texts as fields (a storage's, a read's, the one keychaind asks with), each absent when it
/// keeps the system's (or the storage's) text.
public struct WirePrompt: Sendable, Equatable {
    public var title: String?
    public var subtitle: String?
    public var description: String?
    public var cancel: String?

    /// Each text's tag, in the order they are written: the four are coded alike.
    private static let texts: [(tag: UInt8, text: WritableKeyPath<WirePrompt, String?> & Sendable)] = [
        (1, \.title), (2, \.subtitle), (3, \.description), (4, \.cancel),
    ]

    public init(title: String? = nil, subtitle: String? = nil, description: String? = nil, cancel: String? = nil) {
        (self.title, self.subtitle, self.description, self.cancel) = (title, subtitle, description, cancel)
    }

    public func encode(into message: inout WireMessage) {
        for (tag, text) in Self.texts { message.add(tag, self[keyPath: text]) }
    }

    public init(from message: WireMessage) throws(WireError) {
        self.init()
        for (tag, text) in Self.texts { self[keyPath: text] = try message.string(tag) }
    }
}

/// A storage's options as fields (`WireTag.options`), the service resolved by the client; a field is
/// absent when the storage keeps the library's default. The words are `WireValues`' and are checked
/// by whoever reads them. keychainctl's front sends the service and access group only; the library
/// sends every field.
public struct WireStorageOptions: Sendable, Equatable {
    public var service: String?
    public var accessible: String?
    public var accessControl: String?
    public var authValidity: Int?
    public var synchronizable: Bool?
    public var accessGroup: String?
    public var prompt: WirePrompt?
    /// Android's `keyStorage`.
    public var keyStorage: String?
    /// true: `service` is the client's default (its application identifier), not one its caller
    /// named; keychaind gives a confined application its own id instead (`CallerIdentity`).
    public var serviceIsDefault: Bool?

    enum Tag {
        static let service: UInt8 = 1, accessible: UInt8 = 2, accessControl: UInt8 = 3, authValidity: UInt8 = 4,
                   synchronizable: UInt8 = 5, accessGroup: UInt8 = 6, prompt: UInt8 = 7, keyStorage: UInt8 = 8, serviceIsDefault: UInt8 = 9
    }

    public init(service: String?, accessible: String? = nil, accessControl: String? = nil, authValidity: Int? = nil,
                synchronizable: Bool? = nil, accessGroup: String? = nil, prompt: WirePrompt? = nil, keyStorage: String? = nil) {
        (self.service, self.accessible, self.accessControl, self.authValidity) = (service, accessible, accessControl, authValidity)
        (self.synchronizable, self.accessGroup, self.prompt, self.keyStorage) = (synchronizable, accessGroup, prompt, keyStorage)
    }

    public func encode(into message: inout WireMessage) {
        message.add(Tag.service, service)
        message.add(Tag.accessible, accessible)
        message.add(Tag.accessControl, accessControl)
        message.add(Tag.authValidity, authValidity.map { UInt64(bitPattern: Int64($0)) })
        message.add(Tag.synchronizable, synchronizable)
        message.add(Tag.accessGroup, accessGroup)
        message.add(Tag.prompt, prompt?.encoded())
        message.add(Tag.keyStorage, keyStorage)
        message.add(Tag.serviceIsDefault, serviceIsDefault)
    }

    public init(from message: WireMessage) throws(WireError) {
        service = try message.string(Tag.service)
        accessible = try message.string(Tag.accessible)
        accessControl = try message.string(Tag.accessControl)
        authValidity = try message.uint(Tag.authValidity).map { Int(Int64(bitPattern: $0)) }
        synchronizable = try message.bool(Tag.synchronizable)
        accessGroup = try message.string(Tag.accessGroup)
        prompt = try message.bytes(Tag.prompt).map { bytes throws(WireError) in try WirePrompt(decoding: bytes) }
        keyStorage = try message.string(Tag.keyStorage)
        serviceIsDefault = try message.bool(Tag.serviceIsDefault)
    }
}

extension WirePrompt: WireNestedFields { public static let what = "prompt" }
extension WireStorageOptions: WireNestedFields { public static let what = "storage options" }

/// Fields that travel as a nested message of `WireKind.fields` in one field of a request or prompt
/// (its own version byte, checked like a request's).
public protocol WireNestedFields: WireFields {
    /// What the field is, for the error when it does not decode.
    static var what: String { get }
}

extension WireNestedFields {
    /// The nested message a field carries.
    public func encoded() -> [UInt8] {
        var message = WireMessage(kind: WireKind.fields)
        encode(into: &message)
        return message.encoded()
    }

    public init(decoding bytes: [UInt8]) throws(WireError) {
        let message = try WireMessage.decode(bytes)
        guard message.kind == WireKind.fields else { throw WireError(.malformed, "the \(Self.what) field is not a list of fields") }
        try self.init(from: message)
    }
}

/// What failed below the keychain, as an error reply carries it (the library's `KeychainError.Cause`).
public enum WireCause: Sendable, Equatable, CustomStringConvertible {
    case tpm(code: UInt32, name: String)
    case sqlite(code: Int32, message: String)
    case errno(Int32)
    case pkcs11(code: UInt64, name: String)
    case other(String)

    /// How an error's cause is written after "(cause: ": one wording for the library and the front.
    public var description: String {
        switch self {
        case .tpm(let code, let name): "TPM \(name) (\(upperHex(UInt64(code))))"
        case .sqlite(let code, let message): "SQLite \(code): \(message)"
        case .errno(let value): "errno \(value)"
        case .pkcs11(let code, let name): "PKCS#11 \(name) (\(upperHex(code)))"
        case .other(let text): text
        }
    }
}

/// `0x` and at least 8 upper-case hex digits, as TPM and PKCS#11 codes are written.
public func upperHex(_ value: UInt64) -> String {
    "0x" + Hex.encode(value, digits: 8, uppercase: true)
}

/// An error reply: a `KeychainError` code's raw value, its message and its cause.
public struct WireErrorReply: Sendable, Equatable {
    public var code: String
    public var message: String
    public var cause: WireCause?

    public init(code: String, message: String, cause: WireCause? = nil) {
        (self.code, self.message, self.cause) = (code, message, cause)
    }

    public var wireMessage: WireMessage {
        var reply = WireMessage(kind: WireKind.error)
        reply.add(WireTag.errorCode, code)
        reply.add(WireTag.errorMessage, message)
        switch cause {
        case nil: break
        case .tpm(let code, let name):
            reply.add(WireTag.causeKind, UInt64(0)); reply.add(WireTag.causeNumber, UInt64(code)); reply.add(WireTag.causeText, name)
        case .sqlite(let code, let text):
            reply.add(WireTag.causeKind, UInt64(1)); reply.add(WireTag.causeNumber, UInt64(bitPattern: Int64(code)))
            reply.add(WireTag.causeText, text)
        case .errno(let value):
            reply.add(WireTag.causeKind, UInt64(2)); reply.add(WireTag.causeNumber, UInt64(bitPattern: Int64(value)))
        case .pkcs11(let code, let name):
            reply.add(WireTag.causeKind, UInt64(3)); reply.add(WireTag.causeNumber, code); reply.add(WireTag.causeText, name)
        case .other(let text):
            reply.add(WireTag.causeKind, UInt64(4)); reply.add(WireTag.causeText, text)
        }
        return reply
    }

    public init(decoding reply: WireMessage) throws(WireError) {
        guard let code = try reply.string(WireTag.errorCode) else { throw WireError(.malformed, "error without a code") }
        let number = try reply.uint(WireTag.causeNumber) ?? 0
        let text = try reply.string(WireTag.causeText) ?? ""
        cause = switch try reply.uint(WireTag.causeKind) {
        case nil: nil
        case 0: .tpm(code: UInt32(truncatingIfNeeded: number), name: text)
        case 1: .sqlite(code: Int32(truncatingIfNeeded: Int64(bitPattern: number)), message: text)
        case 2: .errno(Int32(truncatingIfNeeded: Int64(bitPattern: number)))
        case 3: .pkcs11(code: number, name: text)
        default: .other(text)
        }
        self.code = code
        message = try reply.string(WireTag.errorMessage) ?? ""
    }
}
