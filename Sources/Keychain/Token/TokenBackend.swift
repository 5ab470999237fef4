import Foundation
import KeychainStore
import PKCS11
import SecureMemory
import TPM2

// MARK: keyStorage 'strongbox': the PKCS#11 token

/// A PKCS#11 token holds the wrapping key: its secret half is sealed by the service's key on the
/// token (`TokenSession`, in the scheme the token's mechanisms allow) and kept in the record's
/// `tokenSealed`. A `passcode` item's read asks for the token's user PIN, which the token checks
/// (C_Login) before it opens the secret half; a `none` item's read uses the URI's PIN.
///
/// Token envelope formats (`WrappingKeyRecord.tokenFormat`):
/// - 1: the secret half sealed by the token alone.
struct TokenBackend: KeyBackend {
    static let tokenOnly: Int64 = 1
    var uri: String?

    func session(_ engine: isolated Engine) throws(KeychainError) -> TokenSession {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "This item's key is on a PKCS#11 token, and no token is configured "
                                + "(KEYCHAIN_PKCS11_URI or --pkcs11-uri)")
        }
        return try engine.tokenSession(uri)
    }

    /// What a token item's sealed parts name as their service: the token namespace of the first
    /// format ("<service>@strongbox"), kept so stores migrated from it open unchanged.
    static func namespace(_ service: String) -> String { service + TokenSession.tagSuffix }

    func wrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                     engine: isolated Engine) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        if let stored { return (stored, nil) }
        let session = try session(engine)
        let pair = Sodium.generateX25519()
        let sealed = try session.seal(pair.secretKey, service: Self.namespace(service), key: "", protection: tag)
        return (WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey, sealedPublic: [],
                                  sealedPrivate: [], created: Engine.now(), backend: .token, tokenFormat: Self.tokenOnly,
                                  token: session.label, tokenSealed: sealed), nil)
    }

    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated Engine) async throws(KeychainError) -> SecureBytes {
        guard wrapping.tokenFormat == Self.tokenOnly else {
            throw KeychainError(.dataCorrupted, "The key of item '\(record.key)' has a token format (\(wrapping.tokenFormat)) "
                                + "this version does not read")
        }
        if TokenSession.usesPasscode(record.protection) {
            return try await engine.tokenPasscodeSecret(for: wrapping, record: record, store: store, context: context)
        }
        // Kept by the session until lock() or dropCaches(), like the TPM path's agreed secrets.
        return try engine.checked(try session(engine).openItemKey(wrapping.tokenSealed, service: Self.namespace(wrapping.service),
                                                                   key: "", protection: wrapping.protection), wrapping)
    }

    /// The service's objects on the token (one per service, whatever the protection).
    func destroyKeys(service: String, engine: isolated Engine) throws(KeychainError) {
        try session(engine).destroyKeys(service: Self.namespace(service))
    }

    func securityLevel(engine: isolated Engine) -> ItemInfo.SecurityLevel { .pkcs11Token }
}

extension Engine {
    /// The token session of this process (one, logged in, reused).
    func tokenSession(_ uri: String) throws(KeychainError) -> TokenSession {
        if let token, token.uriText == uri { return token }
        let backend = try TokenSession(uri: uri)
        token = backend
        return backend
    }

    /// A token item of the first format (`none`): its own data key, sealed by the service's token
    /// key, in `writerPublic`, with no salt. Still read; a write replaces it with the envelope.
    func getFromToken(_ record: ItemRecord, uri: String?) throws(KeychainError) -> SecureBytes {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "Item '\(record.key)' is on a PKCS#11 token, and no token is configured "
                                + "(KEYCHAIN_PKCS11_URI or --pkcs11-uri)")
        }
        let dataKey = try tokenSession(uri).openItemKey(record.writerPublic, service: TokenBackend.namespace(record.service),
                                                        key: record.key, protection: record.protection)
        do {
            return try Sodium.open(record.ciphertext, key: dataKey, nonce: record.nonce,
                                   associatedData: ItemEnvelope.associatedData(record))
        } catch {
            throw KeychainError(.dataCorrupted, "Item '\(record.key)' of service '\(record.service)' failed authentication")
        }
    }

    func tokenStatus(uri: String) throws(KeychainError) -> TokenStatus {
        let backend = try tokenSession(uri)
        do {
            let info = try backend.token.info()
            return TokenStatus(label: info.label, manufacturer: info.manufacturer, model: info.model, serial: info.serial,
                               userPinLocked: info.flags.contains(.userPinLocked),
                               userPinFinalTry: info.flags.contains(.userPinFinalTry),
                               userPinCountLow: info.flags.contains(.userPinCountLow))
        } catch {
            throw TokenSession.map(error, doing: "report its state")
        }
    }
}

/// A PKCS#11 token as `status` shows it.
public struct TokenStatus: Sendable, Hashable, Codable {
    public var label, manufacturer, model, serial: String
    public var userPinLocked, userPinFinalTry, userPinCountLow: Bool
}

// MARK: 'strongbox' with the passcode: the token's user PIN, asked at read

extension Engine {
    static let tokenPINLimit = 5

    func tokenPasscodeSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                             context: ReadContext) async throws(KeychainError) -> SecureBytes {
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = Self.window(tag: record.protection, asked: context.authValidity)
        if let cached = unsealed[id], cached.opened.map({ $0 + .seconds(window) > ContinuousClock.now }) ?? false { return cached.secret }
        guard let uri = context.pkcs11URI else {
            throw KeychainError(.hardwareUnavailable, "Item '\(record.key)' is on a PKCS#11 token, and no token is configured (KEYCHAIN_PKCS11_URI)")
        }
        guard let authenticator = context.authenticator else {
            throw KeychainError(.interactionNotAllowed, "Reading '\(record.key)' needs the token's PIN, and no authenticator can ask")
        }
        let backend = try tokenSession(uri)
        var limiter = tokenLimiter(store)
        return try await authenticator.ask(prompt: context.prompt, methods: [.passcode], service: record.service, key: record.key,
                                           unnamedFailure: "wrong PIN", beforeAsking: { () throws(KeychainError) in
            limiter = tokenLimiter(store)
            guard !limiter.isLocked else {
                throw KeychainError(.lockoutPermanent, "Too many wrong token PINs (\(limiter.limit)): this library refuses the "
                                    + "token's PIN until the count is reset (keychainctl token reset-tries)")
            }
        }) { answer throws(KeychainError) in
            guard case .passcode(let pin) = answer else { return .failed("enter the token's PIN") }
            do throws(KeychainError) {
                try backend.checkPIN(pin)
                limiter.recordSuccess()
                try saveTokenLimiter(limiter, store)
            } catch where error.code == .authenticationFailed {
                limiter.recordFailure()
                try saveTokenLimiter(limiter, store)
                return .failed("wrong PIN, \(limiter.remaining) left")
            }
            let secret = try backend.open(wrapping.tokenSealed, service: TokenBackend.namespace(wrapping.service), key: "",
                                          protection: wrapping.protection)
            guard secret.count == Sodium.x25519KeyLength, Sodium.x25519Public(of: secret) == wrapping.publicKey else {
                throw KeychainError(.dataCorrupted, "The stored public key of service '\(wrapping.service)' does not match its sealed key")
            }
            if window > 0 { unsealed[id] = (secret, nil, .now) }
            return .opened(secret)
        }
    }

    func tokenLimiter(_ store: Store) -> PINAttemptLimiter {
        (try? store.meta(StoreMeta.tokenPINAttempts)).flatMap { $0 }.flatMap { try? JSONDecoder().decode(PINAttemptLimiter.self, from: Data($0)) }
            ?? PINAttemptLimiter(limit: Self.tokenPINLimit)
    }

    /// A count that cannot be saved would let PINs be tried without limit: that is an error.
    func saveTokenLimiter(_ limiter: PINAttemptLimiter, _ store: Store) throws(KeychainError) {
        let data = (try? JSONEncoder().encode(limiter)) ?? Data()
        try writeStore(store) { tx in try tx.setMeta(StoreMeta.tokenPINAttempts, Array(data)) }
    }

    func resetTokenPINTries() throws(KeychainError) {
        let store = try store()
        try writeStore(store) { tx in _ = try tx.deleteMeta(StoreMeta.tokenPINAttempts) }
    }
}
