internal import CSodium

/// Why a libsodium operation refused its input.
public struct SodiumError: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    enum Code: UInt8, Sendable { case authenticationFailed, invalidLength, weakPublicKey, outOfMemory }
    let code: Code

    /// The ciphertext, nonce, associated data or key is not the one it was sealed with.
    public static let authenticationFailed = SodiumError(code: .authenticationFailed)
    /// A key, nonce or ciphertext has the wrong number of bytes.
    public static let invalidLength = SodiumError(code: .invalidLength)
    /// The peer's X25519 public key is a low-order point (the shared secret would be zero).
    public static let weakPublicKey = SodiumError(code: .weakPublicKey)
    /// Argon2id could not allocate its memory limit.
    public static let outOfMemory = SodiumError(code: .outOfMemory)

    public var description: String {
        switch code {
        case .authenticationFailed: "authentication failed: the sealed data was altered or the key is wrong"
        case .invalidLength: "a key, nonce or ciphertext has the wrong length"
        case .weakPublicKey: "the peer public key is weak (low order)"
        case .outOfMemory: "Argon2id could not allocate its memory limit"
        }
    }
}

/// The libsodium primitives the keychain uses.
public enum Sodium {
    public static let xchachaNonceLength = 24
    public static let xchachaKeyLength = 32
    public static let xchachaTagLength = 16
    public static let x25519KeyLength = 32

    // MARK: Random

    public static func randomBytes(_ n: Int) -> [UInt8] {
        precondition(n >= 0, "randomBytes count must not be negative")
        SodiumRuntime.ensure()
        return [UInt8](unsafeUninitializedCapacity: n) { buffer, initialized in
            if let address = buffer.baseAddress, n > 0 { randombytes_buf(address, n) }
            initialized = n
        }
    }

    // MARK: X25519

    public struct X25519KeyPair: Sendable {
        public let publicKey: [UInt8]
        public let secretKey: SecureBytes

        public init(publicKey: [UInt8], secretKey: SecureBytes) {
            self.publicKey = publicKey
            self.secretKey = secretKey
        }
    }

    public static func generateX25519() -> X25519KeyPair {
        // The secret is born in locked memory rather than copied there later.
        let secret = SecureBytes(random: x25519KeyLength)
        return X25519KeyPair(publicKey: x25519Public(of: secret), secretKey: secret)
    }

    /// The public key for a 32-byte X25519 secret.
    public static func x25519Public(of secret: SecureBytes) -> [UInt8] {
        precondition(secret.count == x25519KeyLength, "an X25519 secret key is 32 bytes")
        SodiumRuntime.ensure()
        return [UInt8](unsafeUninitializedCapacity: x25519KeyLength) { buffer, initialized in
            _ = crypto_scalarmult_base(buffer.baseAddress!, secret.pointer.assumingMemoryBound(to: UInt8.self))
            initialized = x25519KeyLength
        }
    }

    /// The raw X25519 shared point: derive keys from it (with both public keys), never use it as one.
    public static func x25519(_ secret: SecureBytes, _ peerPublic: [UInt8]) throws(SodiumError) -> SecureBytes {
        guard secret.count == x25519KeyLength, peerPublic.count == x25519KeyLength else {
            throw .invalidLength
        }
        SodiumRuntime.ensure()
        let shared = SecureBytes(uninitializedCount: x25519KeyLength)
        let result = peerPublic.withUnsafeBufferPointer { peer in
            crypto_scalarmult(
                shared.pointer.assumingMemoryBound(to: UInt8.self),
                secret.pointer.assumingMemoryBound(to: UInt8.self),
                peer.baseAddress!)
        }
        // libsodium returns -1 when the result is all zeros (a low-order peer key).
        guard result == 0 else { throw .weakPublicKey }
        return shared
    }

    // MARK: BLAKE2b

    /// Keyed BLAKE2b (libsodium's crypto_generichash). Key 16...64 bytes, output 16...64 bytes.
    public static func blake2b(key: SecureBytes, message: [UInt8], outputLength: Int = 32) -> SecureBytes {
        precondition((16...64).contains(outputLength), "BLAKE2b output must be 16...64 bytes")
        precondition((16...64).contains(key.count), "BLAKE2b key must be 16...64 bytes")
        SodiumRuntime.ensure()
        let out = SecureBytes(uninitializedCount: outputLength)
        message.withUnsafeBufferPointer { input in
            _ = crypto_generichash(
                out.pointer.assumingMemoryBound(to: UInt8.self), outputLength,
                input.baseAddress ?? UnsafePointer(emptyInput), UInt64(input.count),
                key.pointer.assumingMemoryBound(to: UInt8.self), key.count)
        }
        return out
    }

    /// HMAC-SHA-256: the simulated fingerprint reader signs TPM policy nonces with it.
    public static func hmacSHA256(key: SecureBytes, message: [UInt8]) -> [UInt8] {
        SodiumRuntime.ensure()
        var state = crypto_auth_hmacsha256_state()
        var out = [UInt8](repeating: 0, count: 32)
        key.withUnsafeBytes { k in
            _ = crypto_auth_hmacsha256_init(&state, k.baseAddress!.assumingMemoryBound(to: UInt8.self), k.count)
        }
        _ = crypto_auth_hmacsha256_update(&state, message, UInt64(message.count))
        _ = crypto_auth_hmacsha256_final(&state, &out)
        sodium_memzero(&state, MemoryLayout<crypto_auth_hmacsha256_state>.size)
        return out
    }

    // MARK: XChaCha20-Poly1305 (IETF)

    /// Seals `plaintext`; the result is ciphertext followed by the 16-byte tag.
    public static func seal(
        _ plaintext: [UInt8], key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        plaintext.withUnsafeBytes { seal(raw: $0, key: key, nonce: nonce, associatedData: associatedData) }
    }

    public static func seal(
        _ plaintext: UnsafeRawBufferPointer, key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        seal(raw: plaintext, key: key, nonce: nonce, associatedData: associatedData)
    }

    public static func seal(
        _ plaintext: SecureBytes, key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        plaintext.withUnsafeBytes { seal(raw: $0, key: key, nonce: nonce, associatedData: associatedData) }
    }

    /// Opens what `seal` made. The plaintext lands in locked memory, never in a Swift array.
    public static func open(
        _ ciphertext: [UInt8], key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) throws(SodiumError) -> SecureBytes {
        // Typed throws do not pass through withUnsafeBytes, so carry the result out.
        let result: Result<SecureBytes, SodiumError> = ciphertext.withUnsafeBytes {
            open(raw: $0, key: key, nonce: nonce, associatedData: associatedData)
        }
        return try result.get()
    }

    public static func open(
        _ ciphertext: UnsafeRawBufferPointer, key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) throws(SodiumError) -> SecureBytes {
        try open(raw: ciphertext, key: key, nonce: nonce, associatedData: associatedData).get()
    }

    // MARK: Internals

    /// A valid address for zero-length inputs, since Swift may hand us nil for them.
    nonisolated(unsafe) private static let emptyInput: UnsafeMutablePointer<UInt8> = {
        let pointer = UnsafeMutablePointer<UInt8>.allocate(capacity: 1)
        pointer.initialize(to: 0)
        return pointer
    }()

    @inline(__always)
    private static func bytes(_ buffer: UnsafeRawBufferPointer) -> UnsafePointer<UInt8> {
        guard let address = buffer.baseAddress else { return UnsafePointer(emptyInput) }
        return address.assumingMemoryBound(to: UInt8.self)
    }

    private static func seal(
        raw plaintext: UnsafeRawBufferPointer, key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) -> [UInt8] {
        precondition(key.count == xchachaKeyLength, "an XChaCha20-Poly1305 key is 32 bytes")
        precondition(nonce.count == xchachaNonceLength, "an XChaCha20-Poly1305 nonce is 24 bytes")
        SodiumRuntime.ensure()
        let outputLength = plaintext.count + xchachaTagLength
        // The only allocation: the output array, written in place.
        return [UInt8](unsafeUninitializedCapacity: outputLength) { out, initialized in
            var written: UInt64 = 0
            nonce.withUnsafeBytes { n in
                associatedData.withUnsafeBytes { ad in
                    _ = crypto_aead_xchacha20poly1305_ietf_encrypt(
                        out.baseAddress!, &written,
                        bytes(plaintext), UInt64(plaintext.count),
                        bytes(ad), UInt64(ad.count),
                        nil, bytes(n),
                        key.pointer.assumingMemoryBound(to: UInt8.self))
                }
            }
            initialized = Int(written)
        }
    }

    private static func open(
        raw ciphertext: UnsafeRawBufferPointer, key: SecureBytes, nonce: [UInt8], associatedData: [UInt8]
    ) -> Result<SecureBytes, SodiumError> {
        guard key.count == xchachaKeyLength, nonce.count == xchachaNonceLength else {
            return .failure(.invalidLength)
        }
        // Too short to hold a tag: nothing genuine can look like this.
        guard ciphertext.count >= xchachaTagLength else { return .failure(.authenticationFailed) }
        SodiumRuntime.ensure()
        let plaintext = SecureBytes(uninitializedCount: ciphertext.count - xchachaTagLength)
        var written: UInt64 = 0
        let status = nonce.withUnsafeBytes { n in
            associatedData.withUnsafeBytes { ad in
                crypto_aead_xchacha20poly1305_ietf_decrypt(
                    plaintext.pointer.assumingMemoryBound(to: UInt8.self), &written,
                    nil,
                    bytes(ciphertext), UInt64(ciphertext.count),
                    bytes(ad), UInt64(ad.count),
                    bytes(n),
                    key.pointer.assumingMemoryBound(to: UInt8.self))
            }
        }
        // On failure the buffer is freed (and wiped) with `plaintext`.
        guard status == 0 else { return .failure(.authenticationFailed) }
        return .success(plaintext)
    }
}
