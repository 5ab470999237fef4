internal import CP11Kit
import KeychainBasics

/// A PKCS#11 return value (`CK_RV`) with its name from the spec, decoded in this one place.
public struct PKCS11ReturnValue: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }

    /// "CKR_PIN_INCORRECT"; a code outside the table keeps its number ("CKR_0x00000123").
    public var name: String {
        if let name = Self.names[rawValue] { return name }
        if rawValue >= Self.vendorDefined { return "CKR_VENDOR_DEFINED+" + hex(rawValue - Self.vendorDefined) }
        return "CKR_" + hex(rawValue)
    }

    public var description: String { "\(name) (\(hex(rawValue)))" }

    public static let ok = Self(rawValue: CKR_OK)
    public static let generalError = Self(rawValue: CKR_GENERAL_ERROR)
    public static let functionFailed = Self(rawValue: CKR_FUNCTION_FAILED)
    public static let argumentsBad = Self(rawValue: CKR_ARGUMENTS_BAD)
    public static let attributeSensitive = Self(rawValue: CKR_ATTRIBUTE_SENSITIVE)
    public static let attributeTypeInvalid = Self(rawValue: CKR_ATTRIBUTE_TYPE_INVALID)
    public static let dataInvalid = Self(rawValue: CKR_DATA_INVALID)
    public static let dataLenRange = Self(rawValue: CKR_DATA_LEN_RANGE)
    public static let deviceError = Self(rawValue: CKR_DEVICE_ERROR)
    public static let deviceMemory = Self(rawValue: CKR_DEVICE_MEMORY)
    public static let deviceRemoved = Self(rawValue: CKR_DEVICE_REMOVED)
    public static let encryptedDataInvalid = Self(rawValue: CKR_ENCRYPTED_DATA_INVALID)
    public static let encryptedDataLenRange = Self(rawValue: CKR_ENCRYPTED_DATA_LEN_RANGE)
    /// PKCS#11 3.0 (0x42); the p11-kit 0.24 header we build against is 2.40 and lacks it.
    public static let aeadDecryptFailed = Self(rawValue: 0x42)
    public static let keyHandleInvalid = Self(rawValue: CKR_KEY_HANDLE_INVALID)
    public static let mechanismInvalid = Self(rawValue: CKR_MECHANISM_INVALID)
    public static let templateInconsistent = Self(rawValue: CKR_TEMPLATE_INCONSISTENT)
    public static let attributeValueInvalid = Self(rawValue: CKR_ATTRIBUTE_VALUE_INVALID)
    public static let mechanismParamInvalid = Self(rawValue: CKR_MECHANISM_PARAM_INVALID)
    public static let objectHandleInvalid = Self(rawValue: CKR_OBJECT_HANDLE_INVALID)
    public static let pinIncorrect = Self(rawValue: CKR_PIN_INCORRECT)
    public static let pinInvalid = Self(rawValue: CKR_PIN_INVALID)
    public static let pinLenRange = Self(rawValue: CKR_PIN_LEN_RANGE)
    public static let pinExpired = Self(rawValue: CKR_PIN_EXPIRED)
    public static let pinLocked = Self(rawValue: CKR_PIN_LOCKED)
    public static let sessionClosed = Self(rawValue: CKR_SESSION_CLOSED)
    public static let sessionHandleInvalid = Self(rawValue: CKR_SESSION_HANDLE_INVALID)
    public static let tokenNotPresent = Self(rawValue: CKR_TOKEN_NOT_PRESENT)
    public static let tokenNotRecognized = Self(rawValue: CKR_TOKEN_NOT_RECOGNIZED)
    public static let userAlreadyLoggedIn = Self(rawValue: CKR_USER_ALREADY_LOGGED_IN)
    public static let userNotLoggedIn = Self(rawValue: CKR_USER_NOT_LOGGED_IN)
    public static let userPinNotInitialized = Self(rawValue: CKR_USER_PIN_NOT_INITIALIZED)
    public static let bufferTooSmall = Self(rawValue: CKR_BUFFER_TOO_SMALL)
    public static let cryptokiNotInitialized = Self(rawValue: CKR_CRYPTOKI_NOT_INITIALIZED)
    public static let libraryLoadFailed = Self(rawValue: CKR_LIBRARY_LOAD_FAILED)

    /// The session (and with it the login) is gone: open a new one and log in again.
    var losesSession: Bool {
        [Self.sessionHandleInvalid, .sessionClosed, .deviceRemoved, .tokenNotPresent].contains(self)
    }

    /// The module refused the ciphertext, its length, the IV or the associated data.
    var rejectsData: Bool {
        [Self.encryptedDataInvalid, .encryptedDataLenRange, .dataInvalid, .dataLenRange, .aeadDecryptFailed]
            .contains(self)
    }

    private static let vendorDefined: UInt = 1 << 31

    private static let names: [UInt: String] = [
        CKR_OK: "CKR_OK",
        CKR_CANCEL: "CKR_CANCEL",
        CKR_HOST_MEMORY: "CKR_HOST_MEMORY",
        CKR_SLOT_ID_INVALID: "CKR_SLOT_ID_INVALID",
        CKR_GENERAL_ERROR: "CKR_GENERAL_ERROR",
        CKR_FUNCTION_FAILED: "CKR_FUNCTION_FAILED",
        CKR_ARGUMENTS_BAD: "CKR_ARGUMENTS_BAD",
        CKR_NO_EVENT: "CKR_NO_EVENT",
        CKR_NEED_TO_CREATE_THREADS: "CKR_NEED_TO_CREATE_THREADS",
        CKR_CANT_LOCK: "CKR_CANT_LOCK",
        CKR_ATTRIBUTE_READ_ONLY: "CKR_ATTRIBUTE_READ_ONLY",
        CKR_ATTRIBUTE_SENSITIVE: "CKR_ATTRIBUTE_SENSITIVE",
        CKR_ATTRIBUTE_TYPE_INVALID: "CKR_ATTRIBUTE_TYPE_INVALID",
        CKR_ATTRIBUTE_VALUE_INVALID: "CKR_ATTRIBUTE_VALUE_INVALID",
        CKR_ACTION_PROHIBITED: "CKR_ACTION_PROHIBITED",
        CKR_DATA_INVALID: "CKR_DATA_INVALID",
        CKR_DATA_LEN_RANGE: "CKR_DATA_LEN_RANGE",
        CKR_DEVICE_ERROR: "CKR_DEVICE_ERROR",
        CKR_DEVICE_MEMORY: "CKR_DEVICE_MEMORY",
        CKR_DEVICE_REMOVED: "CKR_DEVICE_REMOVED",
        CKR_ENCRYPTED_DATA_INVALID: "CKR_ENCRYPTED_DATA_INVALID",
        CKR_ENCRYPTED_DATA_LEN_RANGE: "CKR_ENCRYPTED_DATA_LEN_RANGE",
        0x42: "CKR_AEAD_DECRYPT_FAILED",
        CKR_FUNCTION_CANCELED: "CKR_FUNCTION_CANCELED",
        CKR_FUNCTION_NOT_PARALLEL: "CKR_FUNCTION_NOT_PARALLEL",
        CKR_FUNCTION_NOT_SUPPORTED: "CKR_FUNCTION_NOT_SUPPORTED",
        CKR_KEY_HANDLE_INVALID: "CKR_KEY_HANDLE_INVALID",
        CKR_KEY_SIZE_RANGE: "CKR_KEY_SIZE_RANGE",
        CKR_KEY_TYPE_INCONSISTENT: "CKR_KEY_TYPE_INCONSISTENT",
        CKR_KEY_NOT_NEEDED: "CKR_KEY_NOT_NEEDED",
        CKR_KEY_CHANGED: "CKR_KEY_CHANGED",
        CKR_KEY_NEEDED: "CKR_KEY_NEEDED",
        CKR_KEY_INDIGESTIBLE: "CKR_KEY_INDIGESTIBLE",
        CKR_KEY_FUNCTION_NOT_PERMITTED: "CKR_KEY_FUNCTION_NOT_PERMITTED",
        CKR_KEY_NOT_WRAPPABLE: "CKR_KEY_NOT_WRAPPABLE",
        CKR_KEY_UNEXTRACTABLE: "CKR_KEY_UNEXTRACTABLE",
        CKR_MECHANISM_INVALID: "CKR_MECHANISM_INVALID",
        CKR_MECHANISM_PARAM_INVALID: "CKR_MECHANISM_PARAM_INVALID",
        CKR_OBJECT_HANDLE_INVALID: "CKR_OBJECT_HANDLE_INVALID",
        CKR_OPERATION_ACTIVE: "CKR_OPERATION_ACTIVE",
        CKR_OPERATION_NOT_INITIALIZED: "CKR_OPERATION_NOT_INITIALIZED",
        CKR_PIN_INCORRECT: "CKR_PIN_INCORRECT",
        CKR_PIN_INVALID: "CKR_PIN_INVALID",
        CKR_PIN_LEN_RANGE: "CKR_PIN_LEN_RANGE",
        CKR_PIN_EXPIRED: "CKR_PIN_EXPIRED",
        CKR_PIN_LOCKED: "CKR_PIN_LOCKED",
        CKR_SESSION_CLOSED: "CKR_SESSION_CLOSED",
        CKR_SESSION_COUNT: "CKR_SESSION_COUNT",
        CKR_SESSION_HANDLE_INVALID: "CKR_SESSION_HANDLE_INVALID",
        CKR_SESSION_PARALLEL_NOT_SUPPORTED: "CKR_SESSION_PARALLEL_NOT_SUPPORTED",
        CKR_SESSION_READ_ONLY: "CKR_SESSION_READ_ONLY",
        CKR_SESSION_EXISTS: "CKR_SESSION_EXISTS",
        CKR_SESSION_READ_ONLY_EXISTS: "CKR_SESSION_READ_ONLY_EXISTS",
        CKR_SESSION_READ_WRITE_SO_EXISTS: "CKR_SESSION_READ_WRITE_SO_EXISTS",
        CKR_SIGNATURE_INVALID: "CKR_SIGNATURE_INVALID",
        CKR_SIGNATURE_LEN_RANGE: "CKR_SIGNATURE_LEN_RANGE",
        CKR_TEMPLATE_INCOMPLETE: "CKR_TEMPLATE_INCOMPLETE",
        CKR_TEMPLATE_INCONSISTENT: "CKR_TEMPLATE_INCONSISTENT",
        CKR_TOKEN_NOT_PRESENT: "CKR_TOKEN_NOT_PRESENT",
        CKR_TOKEN_NOT_RECOGNIZED: "CKR_TOKEN_NOT_RECOGNIZED",
        CKR_TOKEN_WRITE_PROTECTED: "CKR_TOKEN_WRITE_PROTECTED",
        CKR_UNWRAPPING_KEY_HANDLE_INVALID: "CKR_UNWRAPPING_KEY_HANDLE_INVALID",
        CKR_UNWRAPPING_KEY_SIZE_RANGE: "CKR_UNWRAPPING_KEY_SIZE_RANGE",
        CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT: "CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT",
        CKR_USER_ALREADY_LOGGED_IN: "CKR_USER_ALREADY_LOGGED_IN",
        CKR_USER_NOT_LOGGED_IN: "CKR_USER_NOT_LOGGED_IN",
        CKR_USER_PIN_NOT_INITIALIZED: "CKR_USER_PIN_NOT_INITIALIZED",
        CKR_USER_TYPE_INVALID: "CKR_USER_TYPE_INVALID",
        CKR_USER_ANOTHER_ALREADY_LOGGED_IN: "CKR_USER_ANOTHER_ALREADY_LOGGED_IN",
        CKR_USER_TOO_MANY_TYPES: "CKR_USER_TOO_MANY_TYPES",
        CKR_WRAPPED_KEY_INVALID: "CKR_WRAPPED_KEY_INVALID",
        CKR_WRAPPED_KEY_LEN_RANGE: "CKR_WRAPPED_KEY_LEN_RANGE",
        CKR_WRAPPING_KEY_HANDLE_INVALID: "CKR_WRAPPING_KEY_HANDLE_INVALID",
        CKR_WRAPPING_KEY_SIZE_RANGE: "CKR_WRAPPING_KEY_SIZE_RANGE",
        CKR_WRAPPING_KEY_TYPE_INCONSISTENT: "CKR_WRAPPING_KEY_TYPE_INCONSISTENT",
        CKR_RANDOM_SEED_NOT_SUPPORTED: "CKR_RANDOM_SEED_NOT_SUPPORTED",
        CKR_RANDOM_NO_RNG: "CKR_RANDOM_NO_RNG",
        CKR_DOMAIN_PARAMS_INVALID: "CKR_DOMAIN_PARAMS_INVALID",
        CKR_BUFFER_TOO_SMALL: "CKR_BUFFER_TOO_SMALL",
        CKR_SAVED_STATE_INVALID: "CKR_SAVED_STATE_INVALID",
        CKR_INFORMATION_SENSITIVE: "CKR_INFORMATION_SENSITIVE",
        CKR_STATE_UNSAVEABLE: "CKR_STATE_UNSAVEABLE",
        CKR_CRYPTOKI_NOT_INITIALIZED: "CKR_CRYPTOKI_NOT_INITIALIZED",
        CKR_CRYPTOKI_ALREADY_INITIALIZED: "CKR_CRYPTOKI_ALREADY_INITIALIZED",
        CKR_MUTEX_BAD: "CKR_MUTEX_BAD",
        CKR_MUTEX_NOT_LOCKED: "CKR_MUTEX_NOT_LOCKED",
        CKR_NEW_PIN_MODE: "CKR_NEW_PIN_MODE",
        CKR_NEXT_OTP: "CKR_NEXT_OTP",
        CKR_EXCEEDED_MAX_ITERATIONS: "CKR_EXCEEDED_MAX_ITERATIONS",
        CKR_FIPS_SELF_TEST_FAILED: "CKR_FIPS_SELF_TEST_FAILED",
        CKR_LIBRARY_LOAD_FAILED: "CKR_LIBRARY_LOAD_FAILED",
        CKR_PIN_TOO_WEAK: "CKR_PIN_TOO_WEAK",
        CKR_PUBLIC_KEY_INVALID: "CKR_PUBLIC_KEY_INVALID",
        CKR_FUNCTION_REJECTED: "CKR_FUNCTION_REJECTED",
    ]
}

/// A failed PKCS#11 call (or p11-kit step): what was attempted, and the `CK_RV` it returned.
///
/// Failures around the module calls get the nearest code from the spec: a module that p11-kit can't
/// load, or no module by that name, is `CKR_LIBRARY_LOAD_FAILED` (p11-kit's own message in `detail`);
/// a URI naming no module is `CKR_ARGUMENTS_BAD`; no token matching the URI is `CKR_TOKEN_NOT_PRESENT`
/// (the tokens present in `detail`); a key no longer on the token is `CKR_KEY_HANDLE_INVALID`.
public struct PKCS11Error: Error, Sendable, CustomStringConvertible {
    /// The raw `CK_RV`.
    public let rv: UInt
    /// What was attempted: "C_Login", "load module /usr/lib/x.so", "find token pkcs11:token=x".
    public let operation: String
    /// What the module or p11-kit added, or what we found instead (the tokens present).
    public let detail: String?
    /// The module refused ciphertext, tag, IV or associated data: the sealed bytes were altered or
    /// don't belong to this key. Also true for SoftHSM2 before 2.7, which reports a failed GCM tag as
    /// `CKR_GENERAL_ERROR`, once the session and key were checked to be fine.
    public let isDataRejected: Bool

    init(rv: UInt, operation: String, detail: String? = nil, isDataRejected: Bool? = nil) {
        self.rv = rv
        self.operation = operation
        self.detail = detail
        self.isDataRejected = isDataRejected ?? PKCS11ReturnValue(rawValue: rv).rejectsData
    }

    public var returnValue: PKCS11ReturnValue { PKCS11ReturnValue(rawValue: rv) }
    /// The spec's name of `rv`, e.g. "CKR_PIN_INCORRECT".
    public var name: String { returnValue.name }

    public var description: String {
        "\(operation) failed: \(returnValue)" + (detail.map { ": \($0)" } ?? "")
    }
}

/// A PKCS#11 URI that is not well formed, or whose `pin-source` can't be read.
public struct PKCS11URIError: Error, Sendable, CustomStringConvertible {
    /// What is wrong, naming the attribute concerned.
    public let message: String
    /// The system's errno when reading `pin-source` failed.
    public let errno: Int32?

    init(_ message: String, errno: Int32? = nil) {
        self.message = message
        self.errno = errno
    }

    public var description: String { message }
}

/// "0x000000A0": eight hex digits, as PKCS#11 headers write codes.
func hex(_ value: UInt) -> String {
    "0x" + Hex.encode(value, digits: 8, uppercase: true)
}
