import Foundation
import KeychainStore
import PKCS11
import SecureMemory
import TPM2

// MARK: keyStorage 'strongbox': the PKCS#11 token

/// A PKCS#11 token holds the wrapping key: its secret half is sealed by the service's key on the
/// token (`TokenSession`, in the scheme the token's mechanisms allow). A `passcode` item's read asks
/// for the token's user PIN, which the token checks (C_Login) before it opens the secret half.
struct TokenBackend: KeyBackend {
    /// What a token-held wrapping key stores in place of a TPM policy.
    static let policyMarker = Array("pkcs11-user-pin".utf8)
    var uri: String?

    func session(_ engine: isolated Engine) throws(KeychainError) -> TokenSession {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "This item is on a PKCS#11 token, and no token is configured (KEYCHAIN_PKCS11_URI)")
        }
        return try engine.tokenSession(uri)
    }

    func wrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                     engine: isolated Engine) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        if let stored { return (stored, nil) }
        let pair = Sodium.generateX25519()
        let sealed = try session(engine).seal(pair.secretKey, service: service, key: "", protection: tag)
        return (WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey, sealedPublic: [],
                                  sealedPrivate: sealed, policy: Self.policyMarker, created: Engine.now()), nil)
    }

    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated Engine) async throws(KeychainError) -> SecureBytes {
        try await engine.tokenPasscodeSecret(for: wrapping, record: record, store: store, context: context)
    }

    func destroyKeys(service: String, engine: isolated Engine) throws(KeychainError) {
        try session(engine).destroyKeys(service: service)
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

    func setOnToken(_ value: SecureBytes, service: String, key: String, protection: ItemProtection, label: String?,
                    uri: String) throws(KeychainError) {
        try checkKey(key)
        guard value.count <= Self.maxValueLength else {
            throw KeychainError.invalidArgument("Invalid value: at most \(Self.maxValueLength) bytes, got \(value.count)")
        }
        let backend = try tokenSession(uri)
        let store = try store()
        let tag = protection.storageTag + TokenSession.tagSuffix
        let dataKey = SecureBytes(random: Sodium.xchachaKeyLength)
        let sealed = try backend.seal(dataKey, service: service, key: key, protection: tag)
        do {
            try store.write { tx in
                let existing = try tx.item(service: service, key: key)
                let now = Self.now()
                var record = ItemRecord(service: service, key: key, protection: tag, label: label ?? existing?.label,
                                        created: existing?.created ?? now, modified: now,
                                        writerPublic: sealed, salt: [], nonce: Sodium.randomBytes(Sodium.xchachaNonceLength),
                                        ciphertext: [])
                record.ciphertext = value.withUnsafeBytes {
                    Sodium.seal($0, key: dataKey, nonce: record.nonce, associatedData: ItemEnvelope.associatedData(record))
                }
                try tx.putItem(record)
            }
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    func getFromToken(_ record: ItemRecord, uri: String?) throws(KeychainError) -> SecureBytes {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "Item '\(record.key)' is on a PKCS#11 token, and no token is configured (KEYCHAIN_PKCS11_URI)")
        }
        let dataKey = try tokenSession(uri).openItemKey(record.writerPublic, service: record.service, key: record.key,
                                                        protection: record.protection)
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
            let secret = try backend.open(wrapping.sealedPrivate, service: wrapping.service, key: "", protection: wrapping.protection)
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
