/// Each keychaind operation's request and reply, defined once (docs/daemon.md): the library's
/// client, the small client and keychainctl's front encode their requests and read the replies with
/// these, and keychaind's handler reads the requests and makes the replies with them, so no side
/// can put a field where the other does not look.

/// The fields of a request or of an ok reply (the kind is the operation's, or `WireKind.ok`).
/// Secrets (a value, a passcode) are bytes, never a `String`; whoever holds the fields wipes them.
public protocol WireFields: Sendable {
    func encode(into message: inout WireMessage)
    init(from message: WireMessage) throws(WireError)
}

/// One operation: its number, the fields its request carries and those of its ok reply.
public struct WireCall<Request: WireFields, Reply: WireFields>: Sendable {
    public let op: WireOp

    public func request(_ fields: Request) -> WireMessage {
        var message = WireMessage(kind: op.rawValue)
        fields.encode(into: &message)
        return message
    }
    public func request(from message: WireMessage) throws(WireError) -> Request { try Request(from: message) }

    public func reply(_ fields: Reply) -> WireMessage {
        var message = WireMessage(kind: WireKind.ok)
        fields.encode(into: &message)
        return message
    }
    public func reply(from message: WireMessage) throws(WireError) -> Reply { try Reply(from: message) }
}

// MARK: Requests

/// No fields: a device call without arguments, or an ok reply without a result.
public struct WireNone: WireFields {
    /// The ok reply without a result.
    public static var reply: WireMessage { WireMessage(kind: WireKind.ok) }

    public init() {}
    public func encode(into message: inout WireMessage) {}
    public init(from message: WireMessage) {}
}

/// What every storage call carries: the storage's options (`WireStorageOptions`, encoded once when
/// the storage is made) and the item's key, when the call names one.
public struct WireStorage: WireFields {
    public var options: [UInt8]?
    public var key: String?

    public init(options: [UInt8]?, key: String? = nil) { (self.options, self.key) = (options, key) }
    public func encode(into message: inout WireMessage) {
        message.add(WireTag.options, options)
        message.add(WireTag.key, key)
    }
    public init(from message: WireMessage) throws(WireError) {
        options = message.bytes(WireTag.options)
        key = try message.string(WireTag.key)
    }
}

/// `setItem`: the value (a secret) and the write's own options.
public struct WireSetItem: WireFields {
    public var storage: WireStorage
    public var value: [UInt8]
    public var options: WireSetOptions?

    public init(storage: WireStorage, value: [UInt8], options: WireSetOptions?) {
        (self.storage, self.value, self.options) = (storage, value, options)
    }
    public func encode(into message: inout WireMessage) {
        storage.encode(into: &message)
        message.add(WireTag.value, value)
        options?.add(to: &message)
    }
    /// An absent value is the empty one.
    public init(from message: WireMessage) throws(WireError) {
        storage = try WireStorage(from: message)
        value = message.bytes(WireTag.value) ?? []
        options = try WireSetOptions(wire: message)
    }
}

/// `getItem`: the read's own prompt texts, and the client's authenticator's `attemptsPerRead`
/// (absent: the client has no authenticator and keychaind never prompts it).
public struct WireGetItem: WireFields {
    public var storage: WireStorage
    public var prompt: WirePrompt?
    public var attempts: UInt64?

    public init(storage: WireStorage, prompt: WirePrompt? = nil, attempts: UInt64? = nil) {
        (self.storage, self.prompt, self.attempts) = (storage, prompt, attempts)
    }
    public func encode(into message: inout WireMessage) {
        storage.encode(into: &message)
        message.add(WireTag.prompt, prompt?.encoded())
        message.add(WireTag.attempts, attempts)
    }
    public init(from message: WireMessage) throws(WireError) {
        storage = try WireStorage(from: message)
        prompt = try message.bytes(WireTag.prompt).map { bytes throws(WireError) in try WirePrompt(decoding: bytes) }
        attempts = try message.uint(WireTag.attempts)
    }
}

/// `getItems`: the keys, 1 to `WireList.maxKeys` (the count is the handler's to check).
public struct WireGetItems: WireFields {
    public var storage: WireStorage
    public var attempts: UInt64?
    public var keys: [String]

    public init(storage: WireStorage, attempts: UInt64?, keys: [String]) {
        (self.storage, self.attempts, self.keys) = (storage, attempts, keys)
    }
    public func encode(into message: inout WireMessage) {
        storage.encode(into: &message)
        message.add(WireTag.attempts, attempts)
        message.add(WireTag.keys, WireList.encode(keys.map { Array($0.utf8) }))
    }
    public init(from message: WireMessage) throws(WireError) {
        storage = try WireStorage(from: message)
        attempts = try message.uint(WireTag.attempts)
        keys = try WireList.decode(message.bytes(WireTag.keys) ?? []).map { bytes throws(WireError) in
            guard let key = String(validating: bytes, as: UTF8.self) else { throw WireError(.malformed, "a key is not UTF-8") }
            return key
        }
    }
}

/// `storageCanUse` and `deviceCanUse` (no storage): the access control asked about, a word the
/// handler checks.
public struct WireCanUse: WireFields {
    public var storage: WireStorage
    public var accessControl: String?

    public init(storage: WireStorage = WireStorage(options: nil), accessControl: String) {
        (self.storage, self.accessControl) = (storage, accessControl)
    }
    public func encode(into message: inout WireMessage) {
        storage.encode(into: &message)
        message.add(WireTag.accessControl, accessControl)
    }
    public init(from message: WireMessage) throws(WireError) {
        storage = try WireStorage(from: message)
        accessControl = try message.string(WireTag.accessControl)
    }
}

/// `attestKey`: the caller's nonce.
public struct WireAttestKey: WireFields {
    public var storage: WireStorage
    public var nonce: [UInt8]

    public init(storage: WireStorage, nonce: [UInt8]) { (self.storage, self.nonce) = (storage, nonce) }
    public func encode(into message: inout WireMessage) {
        storage.encode(into: &message)
        message.add(WireTag.nonce, nonce)
    }
    public init(from message: WireMessage) throws(WireError) {
        storage = try WireStorage(from: message)
        nonce = message.bytes(WireTag.nonce) ?? []
    }
}

/// The device calls that name a finger or carry a passcode (secrets: bytes, wiped by the holder).
public struct WireDevice: WireFields {
    public var finger: String?
    public var passcode: [UInt8]?
    public var newPasscode: [UInt8]?

    public init(finger: String? = nil, passcode: [UInt8]? = nil, newPasscode: [UInt8]? = nil) {
        (self.finger, self.passcode, self.newPasscode) = (finger, passcode, newPasscode)
    }
    public func encode(into message: inout WireMessage) {
        message.add(WireTag.finger, finger)
        message.add(WireTag.passcode, passcode)
        message.add(WireTag.newPasscode, newPasscode)
    }
    public init(from message: WireMessage) throws(WireError) {
        finger = try message.string(WireTag.finger)
        passcode = message.bytes(WireTag.passcode)
        newPasscode = message.bytes(WireTag.newPasscode)
    }
    public mutating func wipe() {
        passcode?.wipe()
        newPasscode?.wipe()
    }
}

/// `importBundle`: the bundle's JSON document and the passcode it may need.
public struct WireImport: WireFields {
    public var bundle: [UInt8]?
    public var passcode: [UInt8]?

    public init(bundle: [UInt8], passcode: [UInt8]?) { (self.bundle, self.passcode) = (bundle, passcode) }
    public func encode(into message: inout WireMessage) {
        message.add(WireTag.passcode, passcode)
        message.add(WireTag.bundle, bundle)
    }
    public init(from message: WireMessage) {
        passcode = message.bytes(WireTag.passcode)
        bundle = message.bytes(WireTag.bundle)
    }
}

// MARK: Replies

/// A result of bytes (`resultBytes`): an item's value (a secret), or a document; absent for none.
public struct WireBytes: WireFields {
    public var bytes: [UInt8]?
    public init(_ bytes: [UInt8]?) { self.bytes = bytes }
    public func encode(into message: inout WireMessage) { message.add(WireTag.resultBytes, bytes) }
    public init(from message: WireMessage) { bytes = message.bytes(WireTag.resultBytes) }
    public mutating func wipe() { bytes?.wipe() }
}

/// A boolean result (`resultBool`); nil when the reply has none that reads as one.
public struct WireFlag: WireFields {
    public var value: Bool?
    public init(_ value: Bool) { self.value = value }
    public func encode(into message: inout WireMessage) { message.add(WireTag.resultBool, value) }
    public init(from message: WireMessage) { value = (try? message.bool(WireTag.resultBool)).flatMap { $0 } }
}

/// A structured result as JSON (`resultJSON`: keys, statuses, item info); absent for none. The
/// library encodes and decodes the documents (this module has no Foundation).
public struct WireJSONResult: WireFields {
    public var json: [UInt8]?
    public init(_ json: [UInt8]?) { self.json = json }
    public func encode(into message: inout WireMessage) { message.add(WireTag.resultJSON, json) }
    public init(from message: WireMessage) { json = message.bytes(WireTag.resultJSON) }
}

/// A number (`resultNumber`); nil when the reply has none that reads as one.
public struct WireNumber: WireFields {
    public var value: UInt64?
    public init(from message: WireMessage) { value = (try? message.uint(WireTag.resultNumber)).flatMap { $0 } }
    public init(_ value: UInt64) { self.value = value }
    public func encode(into message: inout WireMessage) { message.add(WireTag.resultNumber, value) }
}

/// A batch read's outcomes (`resultItems`), each the encoded reply `getItem` would give.
public struct WireOutcomes: WireFields {
    public var outcomes: [[UInt8]]
    public init(_ outcomes: [[UInt8]]) { self.outcomes = outcomes }
    public func encode(into message: inout WireMessage) { message.add(WireTag.resultItems, WireList.encode(outcomes)) }
    public init(from message: WireMessage) throws(WireError) { outcomes = try WireList.decode(message.bytes(WireTag.resultItems) ?? []) }
    public mutating func wipe() { for index in outcomes.indices { outcomes[index].wipe() } }
}

// MARK: The operations

extension WireCall where Request == WireSetItem, Reply == WireNone {
    public static var setItem: Self { Self(op: .setItem) }
}
extension WireCall where Request == WireGetItem, Reply == WireBytes {
    public static var getItem: Self { Self(op: .getItem) }
}
extension WireCall where Request == WireGetItems, Reply == WireOutcomes {
    public static var getItems: Self { Self(op: .getItems) }
}
extension WireCall where Request == WireStorage, Reply == WireFlag {
    public static var hasItem: Self { Self(op: .hasItem) }
}
extension WireCall where Request == WireStorage, Reply == WireNone {
    public static var removeItem: Self { Self(op: .removeItem) }
}
extension WireCall where Request == WireStorage, Reply == WireNone {
    public static var clear: Self { Self(op: .clear) }
}
extension WireCall where Request == WireStorage, Reply == WireNone {
    public static var endWindows: Self { Self(op: .endWindows) }
}
extension WireCall where Request == WireStorage, Reply == WireJSONResult {
    public static var allKeys: Self { Self(op: .allKeys) }
}
extension WireCall where Request == WireStorage, Reply == WireJSONResult {
    public static var allServices: Self { Self(op: .allServices) }
}
extension WireCall where Request == WireStorage, Reply == WireJSONResult {
    public static var itemInfo: Self { Self(op: .itemInfo) }
}
extension WireCall where Request == WireCanUse, Reply == WireJSONResult {
    public static var storageCanUse: Self { Self(op: .storageCanUse) }
}
extension WireCall where Request == WireCanUse, Reply == WireJSONResult {
    public static var deviceCanUse: Self { Self(op: .deviceCanUse) }
}
extension WireCall where Request == WireAttestKey, Reply == WireBytes {
    public static var attestKey: Self { Self(op: .attestKey) }
}
extension WireCall where Request == WireDevice, Reply == WireNone {
    public static var enrollFinger: Self { Self(op: .enrollFinger) }
}
extension WireCall where Request == WireDevice, Reply == WireNone {
    public static var unlock: Self { Self(op: .unlock) }
}
extension WireCall where Request == WireDevice, Reply == WireNone {
    public static var setPasscode: Self { Self(op: .setPasscode) }
}
extension WireCall where Request == WireDevice, Reply == WireNone {
    public static var changePasscode: Self { Self(op: .changePasscode) }
}
extension WireCall where Request == WireDevice, Reply == WireNone {
    public static var removePasscode: Self { Self(op: .removePasscode) }
}
extension WireCall where Request == WireDevice, Reply == WireFlag {
    public static var removeFinger: Self { Self(op: .removeFinger) }
}
extension WireCall where Request == WireDevice, Reply == WireFlag {
    public static var deleteReader: Self { Self(op: .deleteReader) }
}
extension WireCall where Request == WireNone, Reply == WireJSONResult {
    public static var enrolledFingers: Self { Self(op: .enrolledFingers) }
}
extension WireCall where Request == WireNone, Reply == WireJSONResult {
    public static var biometryTypes: Self { Self(op: .biometryTypes) }
}
extension WireCall where Request == WireNone, Reply == WireJSONResult {
    public static var initialize: Self { Self(op: .initialize) }
}
extension WireCall where Request == WireNone, Reply == WireJSONResult {
    public static var status: Self { Self(op: .status) }
}
extension WireCall where Request == WireNone, Reply == WireJSONResult {
    public static var tokenStatus: Self { Self(op: .tokenStatus) }
}
extension WireCall where Request == WireNone, Reply == WireNone {
    public static var resetTokenPINTries: Self { Self(op: .resetTokenPINTries) }
}
extension WireCall where Request == WireNone, Reply == WireNone {
    public static var lock: Self { Self(op: .lock) }
}
extension WireCall where Request == WireNone, Reply == WireNone {
    public static var resetPasscodeTries: Self { Self(op: .resetPasscodeTries) }
}
extension WireCall where Request == WireNone, Reply == WireNone {
    public static var dropCaches: Self { Self(op: .dropCaches) }
}
extension WireCall where Request == WireNone, Reply == WireNumber {
    public static var takeTPMCommandCount: Self { Self(op: .takeTPMCommandCount) }
}
extension WireCall where Request == WireNone, Reply == WireBytes {
    public static var identity: Self { Self(op: .identity) }
}
extension WireCall where Request == WireImport, Reply == WireJSONResult {
    public static var importBundle: Self { Self(op: .importBundle) }
}
