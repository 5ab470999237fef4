import Foundation
import KeychainWire

/// The keychain API on keychaind's wire (docs/daemon.md): one request kind per call, the fields
/// they carry, and errors as the library throws them (code, message, cause), so a caller sees the
/// same `KeychainError` in-process and through the daemon.
enum DaemonOp: UInt8, CaseIterable {
    // A storage's calls: the options (service resolved by the client) travel with each.
    case setItem = 1, getItem, hasItem, removeItem, clear, allKeys, itemInfo, storageCanUse
    // The device's.
    case enrollFinger = 20, removeFinger, deleteReader, enrolledFingers, biometryTypes, deviceCanUse,
         initialize, status, resetTokenPINTries, tokenStatus, unlock, lock, setPasscode, changePasscode,
         removePasscode, resetPasscodeTries, takeTPMCommandCount, dropCaches

    /// Device-wide changes, locking the device for every user, the fingers' names and the TPM command
    /// count (every user's calls in it): root or the `admin` access group only (docs/security.md).
    var needsAdmin: Bool {
        switch self {
        case .enrollFinger, .removeFinger, .deleteReader, .initialize, .resetTokenPINTries, .setPasscode,
             .changePasscode, .removePasscode, .resetPasscodeTries, .dropCaches, .lock, .enrolledFingers,
             .takeTPMCommandCount: true
        default: false
        }
    }
}

/// Message kinds other than requests.
enum DaemonReply {
    static let ok: UInt8 = 0x80
    static let error: UInt8 = 0x81
    /// The daemon asks the client's authenticator (the client answers with `answer`).
    static let prompt: UInt8 = 0x82
    static let answer: UInt8 = 0x83
}

/// Field tags; a request carries only those its call needs.
enum Tag {
    static let options: UInt8 = 1, key: UInt8 = 2, value: UInt8 = 3
    static let accessible: UInt8 = 4, accessControl: UInt8 = 5, authValidity: UInt8 = 6, label: UInt8 = 7, synchronizable: UInt8 = 8
    static let prompt: UInt8 = 9
    /// The client's authenticator's `attemptsPerRead`; absent when the client has no authenticator.
    static let attempts: UInt8 = 10
    static let finger: UInt8 = 11, passcode: UInt8 = 12, newPasscode: UInt8 = 13
    static let resultBytes: UInt8 = 20, resultBool: UInt8 = 21, resultJSON: UInt8 = 22, resultNumber: UInt8 = 23
    static let errorCode: UInt8 = 30, errorMessage: UInt8 = 31, causeKind: UInt8 = 32, causeNumber: UInt8 = 33, causeText: UInt8 = 34
    static let promptJSON: UInt8 = 40, methods: UInt8 = 41, service: UInt8 = 42, promptKey: UInt8 = 43, attempt: UInt8 = 44,
               previousFailure: UInt8 = 45
    static let answerKind: UInt8 = 50, answerFinger: UInt8 = 51, answerPasscode: UInt8 = 52
}

extension KeychainError {
    /// A request the daemon cannot read: the client and the daemon disagree on the protocol.
    init(wire error: WireError) {
        self.init(.invalidArgument, "The keychain service could not read the request: \(error.detail)")
    }

    var wireMessage: WireMessage {
        var message = WireMessage(kind: DaemonReply.error)
        message.add(Tag.errorCode, code.rawValue)
        message.add(Tag.errorMessage, self.message)
        switch underlying {
        case nil: break
        case .tpm(let code, let name):
            message.add(Tag.causeKind, UInt64(0)); message.add(Tag.causeNumber, UInt64(code)); message.add(Tag.causeText, name)
        case .sqlite(let code, let text):
            message.add(Tag.causeKind, UInt64(1)); message.add(Tag.causeNumber, UInt64(bitPattern: Int64(code))); message.add(Tag.causeText, text)
        case .errno(let value):
            message.add(Tag.causeKind, UInt64(2)); message.add(Tag.causeNumber, UInt64(bitPattern: Int64(value)))
        case .pkcs11(let code, let name):
            message.add(Tag.causeKind, UInt64(3)); message.add(Tag.causeNumber, UInt64(code)); message.add(Tag.causeText, name)
        case .other(let text):
            message.add(Tag.causeKind, UInt64(4)); message.add(Tag.causeText, text)
        }
        return message
    }

    init(decoding message: WireMessage) throws(WireError) {
        guard let code = try message.string(Tag.errorCode) else { throw WireError(.malformed, "error without a code") }
        let number = try message.uint(Tag.causeNumber) ?? 0
        let text = try message.string(Tag.causeText) ?? ""
        let cause: Cause? = switch try message.uint(Tag.causeKind) {
        case nil: nil
        case 0: .tpm(code: UInt32(truncatingIfNeeded: number), name: text)
        case 1: .sqlite(code: Int32(truncatingIfNeeded: Int64(bitPattern: number)), message: text)
        case 2: .errno(Int32(truncatingIfNeeded: Int64(bitPattern: number)))
        case 3: .pkcs11(code: UInt(number), name: text)
        default: .other(text)
        }
        self.init(Code(rawValue: code), try message.string(Tag.errorMessage) ?? "", underlying: cause)
    }
}

/// JSON for the non-secret structured values (options, prompts, results).
enum WireJSON {
    static func encode<T: Encodable>(_ value: T) -> [UInt8] {
        // Encoding these plain value types cannot fail.
        (try? Array(JSONEncoder().encode(value))) ?? []
    }
    static func decode<T: Decodable>(_ type: T.Type, _ bytes: [UInt8]?) throws(WireError) -> T? {
        guard let bytes else { return nil }
        do { return try JSONDecoder().decode(type, from: Data(bytes)) } catch {
            throw WireError(.malformed, "a \(T.self) field does not decode: \(error)")
        }
    }
}

extension SetItemOptions {
    func add(to message: inout WireMessage) {
        message.add(Tag.accessible, accessible?.rawValue)
        message.add(Tag.accessControl, accessControl?.rawValue)
        message.add(Tag.authValidity, authValidity.map { UInt64(bitPattern: Int64($0)) })
        message.add(Tag.label, label)
        message.add(Tag.synchronizable, synchronizable)
    }

    /// nil when the request carried none of its fields.
    init?(wire message: WireMessage) throws(WireError) {
        let accessible = try message.string(Tag.accessible)
        let control = try message.string(Tag.accessControl)
        let validity = try message.uint(Tag.authValidity).map { Int(Int64(bitPattern: $0)) }
        let label = try message.string(Tag.label)
        let synchronizable = try message.bool(Tag.synchronizable)
        guard accessible != nil || control != nil || validity != nil || label != nil || synchronizable != nil else { return nil }
        func parsed<T: RawRepresentable>(_ raw: String?, _: T.Type) throws(WireError) -> T? where T.RawValue == String {
            guard let raw else { return nil }
            guard let value = T(rawValue: raw) else { throw WireError(.malformed, "unknown \(T.self) '\(raw)'") }
            return value
        }
        self.init(accessible: try parsed(accessible, Accessible.self), accessControl: try parsed(control, AccessControl.self),
                  authValidity: validity, label: label, synchronizable: synchronizable)
    }
}
