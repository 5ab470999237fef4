import KeychainCore
import FoundationEssentials
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
/// - 1: the secret half sealed by the token alone (`always`, `alwaysThisDeviceOnly`).
/// - 2: the secret half is the XOR of a part the token seals (`tokenSealed`) and a part the TPM seals
///   (`sealedPublic`, `sealedPrivate`, `policy`) under the `SealPolicy` of a TPM key of the same
///   level: the lock-state levels need the TPM's lock state as well as the token. The TPM part's
///   policy has no access control: a token's `passcode` is its user PIN, checked by the token.
struct TokenBackend: KeyBackend {
    static let tokenOnly: Int64 = 1
    static let withTPM: Int64 = 2
    var uri: String?

    func session(_ engine: isolated any BackendContext) throws(KeychainError) -> TokenSession {
        guard let uri else {
            throw KeychainError(.hardwareUnavailable, "This item's key is on a PKCS#11 token, and no token is configured "
                                + "(KEYCHAIN_PKCS11_URI or --pkcs11-uri)")
        }
        return try engine.tokenSession(uri)
    }

    /// What a token item's sealed parts name as their service: the token namespace of the first
    /// format ("<service>@strongbox"), kept so stores migrated from it open unchanged.
    static func namespace(_ service: String) -> String { service + TokenSession.tagSuffix }

    /// Whether a level needs the TPM's lock state: all but `always` and `alwaysThisDeviceOnly`.
    /// - Important: `alwaysThisDeviceOnly` on a token is bound to the token (its key never leaves it),
    ///   not to this device's TPM.
    static func needsTPM(_ accessible: Accessible) -> Bool { accessible != .always && accessible != .alwaysThisDeviceOnly }

    /// The secret of a key split between the token and the TPM: both parts are uniform and
    /// independent, so either alone says nothing of it.
    static func combine(tpmPart: SecureBytes, tokenPart: SecureBytes) -> SecureBytes {
        let secret = SecureBytes(random: Sodium.x25519KeyLength)
        secret.withUnsafeMutableBytes { out in
            tpmPart.withUnsafeBytes { a in
                tokenPart.withUnsafeBytes { b in
                    for i in 0..<out.count { out[i] = (i < a.count ? a[i] : 0) ^ (i < b.count ? b[i] : 0) }
                }
            }
        }
        return secret
    }

    func wrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                     engine: isolated any BackendContext) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        if Self.needsTPM(protection.accessible) {
            // A token-only key of a lock-state level (made before levels were enforced) is replaced;
            // its items keep it (retired) and read as they were written.
            if let stored, stored.tokenFormat == Self.tokenOnly {
                return (try splitKey(service: service, tag: tag, protection: protection, stored: nil, engine: engine).key, stored.publicKey)
            }
            return try splitKey(service: service, tag: tag, protection: protection, stored: stored, engine: engine)
        }
        if let stored { return (stored, nil) }
        let session = try session(engine)
        let pair = Sodium.generateX25519()
        let sealed = try session.seal(pair.secretKey, service: Self.namespace(service), key: "", protection: tag)
        return (WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey, sealedPublic: [],
                                  sealedPrivate: [], created: Engine.now(), backend: .token, tokenFormat: Self.tokenOnly,
                                  token: session.label, tokenSealed: sealed), nil)
    }

    /// A lock-state level: the TPM part is sealed as a TPM key of that level would be (a dead key,
    /// after a passcode removal, is replaced the same way), then the token seals its part.
    private func splitKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                          engine: isolated any BackendContext) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        let session = try session(engine)
        let tokenPart = SecureBytes(random: Sodium.x25519KeyLength)
        let tpmPart = SecureBytes(random: Sodium.x25519KeyLength)
        let publicKey = Sodium.x25519Public(of: Self.combine(tpmPart: tpmPart, tokenPart: tokenPart))
        let tpmProtection = try ItemProtection(accessible: protection.accessible)
        var (key, replaces) = try engine.tpmWrappingKey(service: service, tag: tag, protection: tpmProtection, stored: stored, readerDirectory: nil,
                                                        sealing: Sodium.X25519KeyPair(publicKey: publicKey, secretKey: tpmPart))
        guard key.publicKey == publicKey else { return (key, replaces) }  // the stored key serves
        key.backend = .token
        key.tokenFormat = Self.withTPM
        key.token = session.label
        key.tokenSealed = try session.seal(tokenPart, service: Self.namespace(service), key: "", protection: tag)
        return (key, replaces)
    }

    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated any BackendContext) async throws(KeychainError) -> SecureBytes {
        if wrapping.tokenFormat == Self.withTPM {
            return try await openSplit(wrapping, for: record, store: store, context: context, engine: engine)
        }
        guard wrapping.tokenFormat == Self.tokenOnly else {
            throw KeychainError(.dataCorrupted, "The key of item '\(record.key)' has a token format (\(wrapping.tokenFormat)) "
                                + "this version does not read")
        }
        if TokenSession.usesPasscode(record.protection) {
            return try await engine.tokenPasscodeSecret(for: wrapping, record: record, store: store, context: context)
        }
        // Kept by the session until lock() or dropCaches(), like the TPM path's agreed secrets.
        return try engine.checked(try session(engine).openItemKey(wrapping.tokenSealed, service: Self.namespace(wrapping.service),
                                                                   key: "", protection: Engine.liveTag(wrapping.protection)), wrapping)
    }

    /// The token's part (the PIN asked first for `passcode`), then the TPM's, opened and kept as a
    /// TPM key of the level is: the TPM checks the lock state, with the same commands.
    private func openSplit(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                           engine: isolated any BackendContext) async throws(KeychainError) -> SecureBytes {
        guard TokenSession.usesPasscode(record.protection) else {
            // Kept by the session until lock() or dropCaches().
            let tokenPart = try session(engine).openItemKey(wrapping.tokenSealed, service: Self.namespace(wrapping.service),
                                                             key: "", protection: Engine.liveTag(wrapping.protection))
            return try combinedSecret(wrapping, tokenPart: tokenPart, record: record, store: store, context: context, engine: engine)
        }
        let id = Engine.WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = context.window(tag: record.protection)
        if let cached = engine.unsealed[id], let opened = cached.opened, opened + .seconds(window) > ContinuousClock.now,
           try cached.generation.map({ (g: UInt64) throws(KeychainError) in g == (try engine.lockGeneration(store)) }) ?? true {
            return cached.secret
        }
        // Never ask for the PIN for an item the lock state cannot open.
        if let availability = SealPolicy.decode(wrapping.policy)?.availability { try engine.refuseWhileLocked(availability) }
        let tokenPart = try await engine.tokenPasscodePart(for: wrapping, record: record, store: store, context: context)
        engine.unsealed[id] = nil
        let secret = try combinedSecret(wrapping, tokenPart: tokenPart, record: record, store: store, context: context, engine: engine)
        let generation = engine.unsealed[id]?.generation
        engine.unsealed[id] = window > 0 ? (secret, generation, .now) : nil
        return secret
    }

    /// A split key's secret: the TPM's part, unsealed as a TPM key of the level is (the TPM checks the
    /// lock state; the part's policy names no user, so nobody is asked), with the token's, checked and
    /// kept as that TPM key's secret would be.
    private func combinedSecret(_ wrapping: WrappingKeyRecord, tokenPart: SecureBytes, record: ItemRecord, store: Store,
                                context: Engine.ReadContext, engine: isolated any BackendContext) throws(KeychainError) -> SecureBytes {
        let id = Engine.WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        if let cached = try engine.cachedSecret(id, window: context.window(tag: record.protection), store: store) { return cached }
        // A policy edited to name a user fails the unseal's check of the stored policy against the sealed object.
        let policy = try engine.sealPolicy(of: wrapping)
        let generation: UInt64? = policy.availability == .whenUnlocked ? try engine.lockGeneration(store) : nil
        let tpmPart = try engine.unsealedUnattended(wrapping, policy: policy, store: store)
        let secret = try engine.checked(Self.combine(tpmPart: tpmPart, tokenPart: tokenPart), wrapping)
        engine.unsealed[id] = (secret, generation, nil)
        return secret
    }

    /// The service's objects on the token (one per service, whatever the protection).
    func destroyKeys(service: String, engine: isolated any BackendContext) throws(KeychainError) {
        try session(engine).destroyKeys(service: Self.namespace(service))
    }

    func securityLevel(engine: isolated any BackendContext) -> ItemInfo.SecurityLevel { .pkcs11Token }
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
            throw KeychainError(.dataCorrupted, "Item '\(record.key)' of service '\(ItemScope.shown(record.service))' failed authentication")
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

// MARK: 'strongbox' with the passcode: the token's user PIN, asked at read

extension Engine {
    static let tokenPINLimit = 5

    func tokenPasscodeSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                             context: ReadContext) async throws(KeychainError) -> SecureBytes {
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = context.window(tag: record.protection)
        if let cached = unsealed[id], cached.opened.map({ $0 + .seconds(window) > ContinuousClock.now }) ?? false { return cached.secret }
        let secret = try checked(try await tokenPasscodePart(for: wrapping, record: record, store: store, context: context), wrapping)
        if window > 0 { unsealed[id] = (secret, nil, .now) }
        return secret
    }

    /// Asks for the token's user PIN, which the token checks (C_Login), then has the token open its
    /// sealed part of the key.
    func tokenPasscodePart(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                           context: ReadContext) async throws(KeychainError) -> SecureBytes {
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
            return .opened(try backend.open(wrapping.tokenSealed, service: TokenBackend.namespace(wrapping.service), key: "",
                                            protection: Engine.liveTag(wrapping.protection)))
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
