import KeychainWire

/// The one error of the keychain: a stable code, a message a person can act on, and the cause.
///
/// Two errors are equal when their codes are, whatever the message (as in swift-certificates), so
/// `#expect(throws: KeychainError(.userCanceled))` and `error == .init(.lockout)` read naturally.
public struct KeychainError: Error, Sendable, CustomStringConvertible, Equatable {
    /// A stable code. The raw values are the seed's `KeychainErrorCode` strings, plus Linux's own.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: String

        public init(rawValue: String) {
            self.rawValue = rawValue
        }

        public var description: String { rawValue }

        /// Options, an item key or a call's argument that isn't valid; nothing was touched.
        public static let invalidArgument = Code(rawValue: "INVALID_ARGUMENT")
        /// The user dismissed the prompt ("Use password"); the item stays.
        public static let userCanceled = Code(rawValue: "USER_CANCELED")
        /// The user chose the prompt's fallback button; the item stays.
        public static let userFallback = Code(rawValue: "USER_FALLBACK")
        /// The system ended the prompt (the session went away, another prompt took over): ask again.
        public static let systemCanceled = Code(rawValue: "SYSTEM_CANCELED")
        /// The user was not recognised, and the prompt gave up without a lockout.
        public static let authenticationFailed = Code(rawValue: "AUTHENTICATION_FAILED")
        /// Too many failed attempts: biometrics is locked for a while, the passcode still works.
        public static let lockout = Code(rawValue: "LOCKOUT")
        /// Biometrics is locked until the passcode is entered (or, on the TPM, until lockout recovery).
        public static let lockoutPermanent = Code(rawValue: "LOCKOUT_PERMANENT")
        /// A `CurrentSet` item after the enrolled biometrics changed; the item was removed.
        public static let keyInvalidated = Code(rawValue: "KEY_INVALIDATED")
        /// The access control needs a biometric sensor and there is none.
        public static let biometryNotAvailable = Code(rawValue: "BIOMETRY_NOT_AVAILABLE")
        /// The access control needs enrolled biometrics and none are enrolled.
        public static let biometryNotEnrolled = Code(rawValue: "BIOMETRY_NOT_ENROLLED")
        /// The protection needs a device passcode (PIN) and none is set.
        public static let passcodeNotSet = Code(rawValue: "PASSCODE_NOT_SET")
        /// The platform can't give this protection at all.
        public static let unsupported = Code(rawValue: "UNSUPPORTED")
        /// iOS only (no `NSFaceIDUsageDescription`); kept so codes match the mobile library.
        public static let missingUsageDescription = Code(rawValue: "MISSING_USAGE_DESCRIPTION")

        /// Linux: the item can't be read now (device locked, before the first unlock, no prompt possible).
        public static let interactionNotAllowed = Code(rawValue: "INTERACTION_NOT_ALLOWED")
        /// Linux: the TPM's PCRs no longer match those a `ThisDeviceOnly` item was sealed to.
        public static let deviceStateChanged = Code(rawValue: "DEVICE_STATE_CHANGED")
        /// Linux: stored data failed its authentication or can't be decoded.
        public static let dataCorrupted = Code(rawValue: "DATA_CORRUPTED")
        /// Linux: the TPM (or PKCS#11 token) is unreachable or not provisioned as expected.
        public static let hardwareUnavailable = Code(rawValue: "HARDWARE_UNAVAILABLE")
        /// Linux: the SQLite store or the filesystem under it failed.
        public static let storageError = Code(rawValue: "STORAGE_ERROR")
        /// A bug: a state the library should never reach.
        public static let `internal` = Code(rawValue: "INTERNAL")
    }

    /// What failed below the keychain, kept as it was reported, never collapsed into the code.
    public enum Cause: Sendable, CustomStringConvertible {
        /// A TPM 2.0 response code (`TPM2_RC`) and its name, e.g. `TPM2_RC_AUTH_FAIL`.
        case tpm(code: UInt32, name: String)
        /// An SQLite result code and `sqlite3_errmsg`.
        case sqlite(code: Int32, message: String)
        /// A POSIX `errno`.
        case errno(Int32)
        /// A PKCS#11 `CK_RV` and its name, e.g. `CKR_PIN_INCORRECT`.
        case pkcs11(code: UInt, name: String)
        /// Anything else, already described.
        case other(String)

        /// In the words keychainctl's front writes too (KeychainWire's `WireCause`).
        public var description: String { WireCause(self).description }
    }

    public let code: Code
    public let message: String
    public let underlying: Cause?

    public init(_ code: Code, _ message: String = "", underlying: Cause? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    /// "CODE: message (cause: …)".
    public var description: String {
        var text = message.isEmpty ? code.rawValue : "\(code.rawValue): \(message)"
        if let underlying {
            text += " (cause: \(underlying))"
        }
        return text
    }

    /// Equal by code only: the message is for people and may change.
    public static func == (lhs: KeychainError, rhs: KeychainError) -> Bool {
        lhs.code == rhs.code
    }

    /// An `INVALID_ARGUMENT` error: what the caller passed can't be used.
    public static func invalidArgument(_ message: String) -> KeychainError {
        KeychainError(.invalidArgument, message)
    }
}

extension WireCause {
    package init(_ cause: KeychainError.Cause) {
        switch cause {
        case .tpm(let code, let name): self = .tpm(code: code, name: name)
        case .sqlite(let code, let message): self = .sqlite(code: code, message: message)
        case .errno(let value): self = .errno(value)
        case .pkcs11(let code, let name): self = .pkcs11(code: UInt64(code), name: name)
        case .other(let text): self = .other(text)
        }
    }
}

extension KeychainError.Cause {
    package init(_ cause: WireCause) {
        switch cause {
        case .tpm(let code, let name): self = .tpm(code: code, name: name)
        case .sqlite(let code, let message): self = .sqlite(code: code, message: message)
        case .errno(let value): self = .errno(value)
        case .pkcs11(let code, let name): self = .pkcs11(code: UInt(truncatingIfNeeded: code), name: name)
        case .other(let text): self = .other(text)
        }
    }
}
