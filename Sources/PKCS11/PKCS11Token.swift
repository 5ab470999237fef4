internal import CP11Kit
import SecureMemory

/// A token in one slot of a module, found by URI, used through one read-write session.
///
/// The session is opened on first use and kept, logged in as the user once `login(pin:)` succeeds.
/// When the module reports it lost (`CKR_SESSION_HANDLE_INVALID`, `CKR_SESSION_CLOSED`,
/// `CKR_DEVICE_REMOVED`, `CKR_TOKEN_NOT_PRESENT`), the token is found again, a new session opened and
/// logged in with the last accepted PIN, and the call tried once more; key handles made before that
/// are looked up again by label and ID. A login lost while the session stayed is redone the same way,
/// and a handle the module no longer knows is looked up again.
///
/// - Important: not thread-safe: a PKCS#11 session runs one operation at a time. Confine an instance
///   to one actor or thread.
public final class PKCS11Token {
    public let module: PKCS11Module
    public let uri: PKCS11URI
    /// The slot the token was last found in.
    public private(set) var slotID: UInt
    /// The open session, if any.
    private(set) var session: CK_SESSION_HANDLE?
    /// The last PIN the token accepted, for logging in again after a reopen.
    private var pin: SecureBytes?
    /// Changes with every session and login; a `KeyHandle` from another epoch is looked up again.
    private(set) var epoch = UInt64.random(in: .min ... .max)
    /// Keys looked up again in this epoch.
    var lookedUpAgain: [WrappingKey.Identity: WrappingKey] = [:]
    /// Whether the token's `CKM_RSA_PKCS_OAEP` takes SHA-256; nil until an encryption tried it.
    var oaepTakesSHA256: Bool?
    #if DEBUG
    /// A step of `createWrappingKey` made to fail, for tests (debug builds only).
    var faultPoint: FaultPoint?
    #endif

    /// Finds the token `uri` names in `module`; throws `CKR_TOKEN_NOT_PRESENT` when none matches.
    public init(module: PKCS11Module, uri: PKCS11URI) throws(PKCS11Error) {
        self.module = module
        self.uri = uri
        self.slotID = try Self.findSlot(module: module, uri: uri)
    }

    /// Loads the URI's module (and only it), then finds the token.
    public convenience init(uri: PKCS11URI) throws(PKCS11Error) {
        try self.init(module: PKCS11Module(uri: uri), uri: uri)
    }

    deinit {
        if let session { try? module.closeSession(session) }
    }

    /// The token's label, maker and PIN state, read fresh (the PIN flags change with every attempt).
    public func info() throws(PKCS11Error) -> TokenInfo {
        do {
            return TokenInfo(slotID: slotID, try module.tokenInfo(slotID))
        } catch where error.returnValue.losesSession || error.rv == CKR_SLOT_ID_INVALID {
            slotID = try Self.findSlot(module: module, uri: uri)
            return TokenInfo(slotID: slotID, try module.tokenInfo(slotID))
        }
    }

    /// Logs the session in as the user (`CKU_USER`), opening it if needed.
    ///
    /// The login state belongs to the module and is shared by every session of the process, so
    /// when a user is already logged in with another PIN this logs out and in again: the PIN given
    /// is always the one checked. On failure the previously accepted PIN is kept for re-logins.
    public func login(pin: SecureBytes) throws(PKCS11Error) {
        try withSession { session throws(PKCS11Error) in try logIn(session, pin) }
        self.pin = pin.withUnsafeBytes { SecureBytes(copying: $0) }
    }

    // MARK: Sessions

    /// Runs `body` on the session; a lost session is reopened (and a lost login redone) once.
    func withSession<R>(_ body: (CK_SESSION_HANDLE) throws(PKCS11Error) -> R) throws(PKCS11Error) -> R {
        let current = try openedSession()
        do {
            return try body(current)
        } catch {
            if error.returnValue.losesSession {
                try reopen()
            } else if let pin, loginLost(current) {
                // Someone logged the module out (another instance checking a PIN, say). The token then
                // hides private objects: this shows as CKR_USER_NOT_LOGGED_IN or an invalid handle.
                forgetHandles()
                try logIn(current, pin)
            } else if error.returnValue == .objectHandleInvalid || error.returnValue == .keyHandleInvalid {
                forgetHandles()  // Renumbered by a logout and login elsewhere in the process.
            } else {
                throw error
            }
            return try body(try openedSession())
        }
    }

    private func openedSession() throws(PKCS11Error) -> CK_SESSION_HANDLE {
        if let session { return session }
        let opened = try module.openSession(slotID)
        session = opened
        return opened
    }

    private func loginLost(_ session: CK_SESSION_HANDLE) -> Bool {
        guard let state = try? module.sessionState(session) else { return false }
        return state != CKS_RW_USER_FUNCTIONS && state != CKS_RO_USER_FUNCTIONS
    }

    private func reopen() throws(PKCS11Error) {
        if let session { try? module.closeSession(session) }
        session = nil
        forgetHandles()
        slotID = try Self.findSlot(module: module, uri: uri)  // A token put back may sit in another slot.
        let reopened = try openedSession()
        if let pin { try logIn(reopened, pin) }
    }

    /// Object handles may change with a new session or login (SoftHSM2 renumbers private objects).
    private func forgetHandles() {
        epoch = .random(in: .min ... .max)
        lookedUpAgain = [:]
    }

    private func logIn(_ session: CK_SESSION_HANDLE, _ candidate: SecureBytes) throws(PKCS11Error) {
        do {
            do {
                try module.login(session, pin: candidate)
            } catch where error.returnValue == .userAlreadyLoggedIn {
                if let pin, pin == candidate { return }
                forgetHandles()
                try module.logout(session)
                try module.login(session, pin: candidate)
            }
        } catch where error.returnValue == .pinIncorrect || error.returnValue == .pinLocked {
            // Never retry a PIN the token refused: real tokens count every wrong attempt.
            if let pin, pin == candidate { self.pin = nil }
            throw error
        }
    }

    // MARK: Finding the token

    private static func findSlot(module: PKCS11Module, uri: PKCS11URI) throws(PKCS11Error) -> CK_SLOT_ID {
        let operation = "find token \(uri)"
        let library = module.info
        if differs(uri.libraryManufacturer, module.rawInfo.manufacturerID)
            || differs(uri.libraryDescription, module.rawInfo.libraryDescription)
            || uri.libraryVersion.map({ $0 != library.version }) ?? false {
            throw PKCS11Error(rv: CKR_TOKEN_NOT_PRESENT, operation: operation, detail:
                "module \(module.path) is '\(library.libraryDescription)' \(library.version) by '\(library.manufacturer)'")
        }
        var present: [String] = []
        for slot in try module.slotsWithToken() {
            // A token pulled out between the two calls is simply not there.
            guard let raw = try? module.tokenInfo(slot) else { continue }
            let token = TokenInfo(slotID: slot, raw)
            var matches = (uri.slotID.map { $0 == slot } ?? true)
                && !differs(uri.token, raw.label) && !differs(uri.manufacturer, raw.manufacturerID)
                && !differs(uri.model, raw.model) && !differs(uri.serial, raw.serialNumber)
            if matches && (uri.slotDescription != nil || uri.slotManufacturer != nil) {
                guard let slotInfo = try? module.slotInfo(slot) else { continue }
                matches = !differs(uri.slotDescription, slotInfo.slotDescription)
                    && !differs(uri.slotManufacturer, slotInfo.manufacturerID)
            }
            if matches { return slot }
            present.append("'\(token.label)' (serial \(token.serial), slot \(slot))")
        }
        throw PKCS11Error(rv: CKR_TOKEN_NOT_PRESENT, operation: operation, detail:
            (present.isEmpty ? "module \(module.path) has no token" : "tokens present in \(module.path): " + present.joined(separator: ", ")))
    }
}

/// Whether a URI value leaves out a fixed-size, blank-padded PKCS#11 text field, compared as p11-kit
/// compares them: the value padded with blanks to the field's size, then byte for byte. "kc" and
/// "kc " both name a token labelled "kc"; a value longer than the field names none.
func differs<T>(_ wanted: String?, _ field: T) -> Bool {
    guard let wanted else { return false }
    return withUnsafeBytes(of: field) { actual in
        let bytes = Array(wanted.utf8)
        guard bytes.count <= actual.count else { return true }
        return !actual.elementsEqual(bytes + Array(repeating: 0x20, count: actual.count - bytes.count))
    }
}

/// What a token says about itself: `CK_TOKEN_INFO`.
public struct TokenInfo: Sendable, Equatable {
    public let slotID: UInt
    public let label: String
    public let manufacturer: String
    public let model: String
    public let serial: String
    public let flags: Flags

    /// The token's `CKF_…` flags.
    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }

        public static let rng = Flags(rawValue: CKF_RNG)
        public static let writeProtected = Flags(rawValue: CKF_WRITE_PROTECTED)
        public static let loginRequired = Flags(rawValue: CKF_LOGIN_REQUIRED)
        public static let userPinInitialized = Flags(rawValue: CKF_USER_PIN_INITIALIZED)
        /// A PIN pad or reader of its own: the PIN is not passed through the API.
        public static let protectedAuthenticationPath = Flags(rawValue: CKF_PROTECTED_AUTHENTICATION_PATH)
        public static let tokenInitialized = Flags(rawValue: CKF_TOKEN_INITIALIZED)
        /// At least one wrong user PIN since the last successful login.
        public static let userPinCountLow = Flags(rawValue: CKF_USER_PIN_COUNT_LOW)
        /// One more wrong user PIN locks the token.
        public static let userPinFinalTry = Flags(rawValue: CKF_USER_PIN_FINAL_TRY)
        public static let userPinLocked = Flags(rawValue: CKF_USER_PIN_LOCKED)
        public static let userPinToBeChanged = Flags(rawValue: CKF_USER_PIN_TO_BE_CHANGED)
        public static let soPinCountLow = Flags(rawValue: CKF_SO_PIN_COUNT_LOW)
        public static let soPinFinalTry = Flags(rawValue: CKF_SO_PIN_FINAL_TRY)
        public static let soPinLocked = Flags(rawValue: CKF_SO_PIN_LOCKED)
        public static let soPinToBeChanged = Flags(rawValue: CKF_SO_PIN_TO_BE_CHANGED)
    }

    init(slotID: UInt, _ info: CK_TOKEN_INFO) {
        self.slotID = slotID
        label = paddedText(info.label)
        manufacturer = paddedText(info.manufacturerID)
        model = paddedText(info.model)
        serial = paddedText(info.serialNumber)
        flags = Flags(rawValue: info.flags)
    }
}
