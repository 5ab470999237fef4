import KeychainCore
import KeychainStore
import PKCS11
import SecureMemory
import TPM2

/// `keyStorage: 'strongbox'`: a PKCS#11 token (through p11-kit) holds each service's wrapping key.
///
/// Per service, one wrapping key made on the token in the first scheme the token's mechanisms allow
/// (`WrappingScheme`: AES-GCM, else RSA-OAEP, else ECDH P-256), its secret half sensitive and never
/// extractable. Each item gets a random data key that the token's key seals (`seal`, `open`), the
/// service, the key and the protection as associated data; the sealed key starts with a byte naming
/// its scheme. The value is then encrypted with libsodium as on the TPM path, with the sealed data key
/// among the authenticated fields. One logged-in session per process (the engine's), reused; the PIN
/// comes from the URI (`pin-source` or `pin-value`).
final class TokenSession {
    static let tagSuffix = "@strongbox"
    let uri: PKCS11URI
    let uriText: String
    let token: PKCS11Token
    /// Wrapping keys per service: a search (C_FindObjects) costs more than the decryption on some
    /// tokens; the token layer finds a key again by label and ID when a handle goes stale.
    private var handles: [String: WrappingKey] = [:]
    /// Data keys of `none` items this process has read, like the TPM path's agreed secrets: kept until
    /// `lock()`, `dropCaches()` or `clear`, so a warm read costs no token operation (an RSA decryption
    /// on the token takes about a millisecond).
    private var opened: [OpenedID: SecureBytes] = [:]

    private struct OpenedID: Hashable {
        let service, key, protection: String
        let sealed: [UInt8]
    }

    init(uri text: String) throws(KeychainError) {
        uriText = text
        do {
            uri = try PKCS11URI(text)
        } catch {
            throw KeychainError.invalidArgument("Invalid PKCS#11 URI: \(error.message)")
        }
        let pin: SecureBytes?
        do {
            // Without a PIN in the URI only passcode items (PIN asked at read) can be read.
            pin = try uri.pin()
        } catch {
            throw KeychainError.invalidArgument("The PKCS#11 URI's PIN can't be read: \(error.message)")
        }
        do {
            token = try PKCS11Token(uri: uri)
        } catch {
            throw Self.map(error, doing: "open " + Self.describe(uri))
        }
        do {
            if let pin { try token.login(pin: pin) }
        } catch {
            throw Self.map(error, doing: "log in to " + Self.describe(uri))
        }
    }

    /// The token's label (C_GetTokenInfo), recorded with the keys made on it; nil when it cannot be read.
    var label: String? { (try? token.info().label)?.trimmingSpaces() }

    /// "token 'kc' of module /usr/lib/softhsm/libsofthsm2.so", for messages.
    static func describe(_ uri: PKCS11URI) -> String {
        let module = uri.modulePath ?? uri.moduleName.map { "'\($0)' (p11-kit)" } ?? "(none)"
        return (uri.token.map { "token '\($0)'" } ?? "the first token") + " of module " + module
    }

    /// The scheme this token would give a new service's key, from its mechanisms; `UNSUPPORTED`
    /// naming what is missing when it offers none. Makes nothing on the token.
    func scheme() throws(KeychainError) -> WrappingScheme {
        do {
            return try token.preferredScheme()
        } catch {
            throw Self.map(error, doing: "keep keys on " + Self.describe(uri))
        }
    }

    /// A token item's tag names its key apart from a TPM key of the same protection: this is the
    /// protection part alone (also the service of a token namespace, `shown`).
    static func withoutTokenSuffix(_ tag: String) -> String {
        tag.hasSuffix(tagSuffix) ? String(tag.dropLast(tagSuffix.count)) : tag
    }

    /// A service as messages name it: without the token namespace's internal suffix or keychaind's scope.
    static func shown(_ service: String) -> String { ItemScope.shown(withoutTokenSuffix(service)) }

    /// Whether a stored protection tag is a token item behind the token's user PIN.
    static func usesPasscode(_ tag: String) -> Bool {
        tag.hasSuffix(tagSuffix) && ItemProtection(storageTag: String(tag.dropLast(tagSuffix.count)))?.accessControl == .passcode
    }

    /// Checks a PIN with the token (C_Login): the token, not this code, says whether it is right.
    func checkPIN(_ pin: SecureBytes) throws(KeychainError) {
        do { try token.login(pin: pin) } catch { throw Self.map(error, doing: "log in") }
    }

    /// The token object of a service: its label and ID say which service it serves.
    static func keyIdentity(service: String) -> (label: String, id: [UInt8]) {
        ("keychain:\(service)", Array(sha256(Array("keychain-linux service \(service)".utf8)).prefix(16)))
    }

    private static func associatedData(service: String, key: String, protection: String) -> [UInt8] {
        var ad = Array("keychain-linux token data key v1".utf8)
        for field in [service, key, protection] {
            ad += UInt32(field.utf8.count).bigEndianBytes + Array(field.utf8)
        }
        return ad
    }

    func seal(_ dataKey: SecureBytes, service: String, key: String, protection: String) throws(KeychainError) -> [UInt8] {
        try withItemKey(service: service, key: key, protection: protection, create: true, doing: "seal a data key") {
            (handle, associatedData) throws(PKCS11Error) in
            try token.seal(dataKey, with: handle, associatedData: associatedData)
        }
    }

    func open(_ sealed: [UInt8], service: String, key: String, protection: String) throws(KeychainError) -> SecureBytes {
        try withItemKey(service: service, key: key, protection: protection, create: false, doing: "open item '\(key)'") {
            (handle, associatedData) throws(PKCS11Error) in
            try token.open(sealed, with: handle, associatedData: associatedData)
        }
    }

    /// Runs one token operation on an item's data key with its service's wrapping key and the item's
    /// associated data; a token error becomes the keychain's, saying what failed to be done.
    private func withItemKey<R>(
        service: String, key: String, protection: String, create: Bool, doing what: @autoclosure () -> String,
        _ operation: (WrappingKey, [UInt8]) throws(PKCS11Error) -> R
    ) throws(KeychainError) -> R {
        let handle = try wrappingKey(service: service, create: create)
        do {
            return try operation(handle, Self.associatedData(service: service, key: key, protection: protection))
        } catch {
            throw Self.map(error, doing: what())
        }
    }

    /// `open`, its answer kept for the process (see `opened`).
    func openItemKey(_ sealed: [UInt8], service: String, key: String, protection: String) throws(KeychainError) -> SecureBytes {
        let id = OpenedID(service: service, key: key, protection: protection, sealed: sealed)
        if let dataKey = opened[id] { return dataKey }
        let dataKey = try open(sealed, service: service, key: key, protection: protection)
        if opened.count >= 4096 { opened.removeAll() }
        opened[id] = dataKey
        return dataKey
    }

    /// Forgets the data keys `openItemKey` kept.
    func forgetOpened() { opened.removeAll() }

    /// The service's key on the token (made when `create` and absent), its handle kept for the process.
    private func wrappingKey(service: String, create: Bool) throws(KeychainError) -> WrappingKey {
        if let handle = handles[service] { return handle }
        let identity = Self.keyIdentity(service: service)
        let found: WrappingKey?
        do { found = try token.wrappingKey(label: identity.label, id: identity.id, create: create) } catch {
            throw Self.map(error, doing: "\(create ? "find or make" : "find") the wrapping key of service '\(Self.shown(service))'")
        }
        guard let handle = found else {
            throw create
                ? KeychainError(.hardwareUnavailable, "The token did not create the wrapping key of service '\(Self.shown(service))'")
                : KeychainError(.dataCorrupted, "The token has no wrapping key for service '\(Self.shown(service))': it was removed or this is another token")
        }
        handles[service] = handle
        return handle
    }

    func destroyKeys(service: String) throws(KeychainError) {
        handles[service] = nil
        opened = opened.filter { $0.key.service != service }
        do { try token.destroyKeys(label: Self.keyIdentity(service: service).label) } catch {
            throw Self.map(error, doing: "remove the wrapping key of service '\(Self.shown(service))'")
        }
    }

    /// Every CKR to a code, the CKR name kept as the cause.
    static func map(_ error: PKCS11Error, doing what: String) -> KeychainError {
        let cause = KeychainError.Cause.pkcs11(code: error.rv, name: error.name)
        if error.isDataRejected {
            return KeychainError(.dataCorrupted, "The token refused to \(what): the stored data failed authentication", underlying: cause)
        }
        switch error.returnValue {
        case .mechanismInvalid, .templateInconsistent:
            return KeychainError(.unsupported, "The PKCS#11 token cannot \(what): \(error.detail ?? error.name)", underlying: cause)
        case .pinIncorrect, .pinInvalid, .pinLenRange:
            return KeychainError(.authenticationFailed, "Wrong token PIN: could not \(what)", underlying: cause)
        case .userNotLoggedIn:
            return KeychainError(.interactionNotAllowed,
                                 "The token needs its user PIN to \(what): add pin-source=file:… to the PKCS#11 URI", underlying: cause)
        case .pinLocked:
            return KeychainError(.lockoutPermanent, "The token's user PIN is locked: unblock it with the SO PIN", underlying: cause)
        case .pinExpired:
            return KeychainError(.authenticationFailed, "The token's user PIN has expired: change it", underlying: cause)
        case .argumentsBad:
            return KeychainError(.invalidArgument, "The PKCS#11 URI cannot be used to \(what): \(error.detail ?? "")", underlying: cause)
        default:
            return KeychainError(.hardwareUnavailable, "The PKCS#11 token cannot \(what): \(error.detail ?? error.name)", underlying: cause)
        }
    }
}

extension Engine {
    /// Whether the token of `uri` can hold a storage's keys: opened, logged in, its mechanisms read.
    func tokenCanKeepKeys(uri: String) -> AccessControlCheck {
        do {
            _ = try tokenSession(uri).scheme()
            return .init(available: true)
        } catch {
            return .init(available: false, reason: error.code == .unsupported ? .unsupported : .notAvailable)
        }
    }
}
