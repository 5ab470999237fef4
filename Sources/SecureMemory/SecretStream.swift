internal import CSodium

/// Argon2id (libsodium `crypto_pwhash`, algorithm ARGON2ID13) and `crypto_secretstream_xchacha20poly1305`:
/// what an encrypted backup needs to turn a passphrase into a key and to seal a file in chunks whose
/// order, number and end are authenticated.
extension Sodium {
    public static let argon2idSaltLength = 16
    public static let secretStreamHeaderLength = 24
    /// What each chunk adds to its plaintext: the tag byte and the 16-byte MAC.
    public static let secretStreamOverhead = 17

    /// The limits libsodium accepts for Argon2id.
    public static let argon2idOpsLimits: ClosedRange<UInt64> = 1...UInt64(UInt32.max)
    public static let argon2idMemLimits: ClosedRange<UInt64> = 8192...(UInt64(1) << 42)
    /// libsodium's named cost levels (opslimit, memlimit in bytes).
    public static let argon2idInteractive: (ops: UInt64, mem: UInt64) = (2, 64 << 20)
    public static let argon2idModerate: (ops: UInt64, mem: UInt64) = (3, 256 << 20)
    public static let argon2idSensitive: (ops: UInt64, mem: UInt64) = (4, 1 << 30)

    /// Derives `length` bytes from a passphrase with Argon2id v1.3.
    /// - Throws: `.invalidLength` for a salt that is not 16 bytes or limits outside libsodium's;
    ///   `.outOfMemory` when the memory limit cannot be allocated.
    public static func argon2id(passphrase: SecureBytes, salt: [UInt8], opsLimit: UInt64, memLimit: UInt64,
                                length: Int = 32) throws(SodiumError) -> SecureBytes {
        guard salt.count == argon2idSaltLength, argon2idOpsLimits.contains(opsLimit), argon2idMemLimits.contains(memLimit),
              (16...64).contains(length) else { throw .invalidLength }
        SodiumRuntime.ensure()
        let out = SecureBytes(uninitializedCount: length)
        let status = passphrase.withUnsafeBytes { pass in
            crypto_pwhash(out.pointer.assumingMemoryBound(to: UInt8.self), UInt64(length),
                          pass.baseAddress?.assumingMemoryBound(to: CChar.self) ?? UnsafePointer(emptyText), UInt64(pass.count),
                          salt, opsLimit, Int(memLimit), crypto_pwhash_alg_argon2id13())
        }
        guard status == 0 else { throw .outOfMemory }
        return out
    }

    /// Compares in time that depends only on the length (libsodium `sodium_memcmp`).
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        SodiumRuntime.ensure()
        return a.isEmpty || sodium_memcmp(a, b, a.count) == 0
    }

    nonisolated(unsafe) private static let emptyText: UnsafeMutablePointer<CChar> = {
        let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: 1)
        pointer.initialize(to: 0)
        return pointer
    }()
}

/// The sending half of a secretstream: each `push` seals one chunk; the last is marked final, so a
/// stream cut short, reordered, or with a chunk dropped or repeated fails at the receiver.
public final class SecretStreamPush {
    private let state: UnsafeMutablePointer<crypto_secretstream_xchacha20poly1305_state>
    /// Sent before the first chunk, in clear.
    public let header: [UInt8]

    public init(key: SecureBytes) {
        precondition(key.count == Sodium.xchachaKeyLength, "a secretstream key is 32 bytes")
        SodiumRuntime.ensure()
        state = .allocate(capacity: 1)
        var header = [UInt8](repeating: 0, count: Sodium.secretStreamHeaderLength)
        _ = crypto_secretstream_xchacha20poly1305_init_push(state, &header, key.pointer.assumingMemoryBound(to: UInt8.self))
        self.header = header
    }

    deinit {
        sodium_memzero(state, MemoryLayout<crypto_secretstream_xchacha20poly1305_state>.size)
        state.deallocate()
    }

    /// The chunk's ciphertext: `plaintext.count + Sodium.secretStreamOverhead` bytes.
    public func push(_ plaintext: SecureBytes, associatedData: [UInt8] = [], final: Bool) -> [UInt8] {
        plaintext.withUnsafeBytes { plain in
            [UInt8](unsafeUninitializedCapacity: plain.count + Sodium.secretStreamOverhead) { out, initialized in
                var written: UInt64 = 0
                _ = associatedData.withUnsafeBufferPointer { ad in
                    crypto_secretstream_xchacha20poly1305_push(
                        state, out.baseAddress!, &written,
                        plain.baseAddress?.assumingMemoryBound(to: UInt8.self), UInt64(plain.count),
                        ad.baseAddress, UInt64(ad.count),
                        final ? UInt8(crypto_secretstream_xchacha20poly1305_tag_final())
                              : UInt8(crypto_secretstream_xchacha20poly1305_tag_message()))
                }
                initialized = Int(written)
            }
        }
    }
}

/// The receiving half: chunks must arrive in the order they were pushed.
public final class SecretStreamPull {
    private let state: UnsafeMutablePointer<crypto_secretstream_xchacha20poly1305_state>
    /// Whether the chunk marked final was opened; nothing may follow it.
    public private(set) var finished = false

    /// - Throws: `.invalidLength` for a header that is not 24 bytes or a key that is not 32.
    public init(key: SecureBytes, header: [UInt8]) throws(SodiumError) {
        guard key.count == Sodium.xchachaKeyLength, header.count == Sodium.secretStreamHeaderLength else { throw .invalidLength }
        SodiumRuntime.ensure()
        state = .allocate(capacity: 1)
        _ = crypto_secretstream_xchacha20poly1305_init_pull(state, header, key.pointer.assumingMemoryBound(to: UInt8.self))
    }

    deinit {
        sodium_memzero(state, MemoryLayout<crypto_secretstream_xchacha20poly1305_state>.size)
        state.deallocate()
    }

    /// Opens the next chunk into locked memory.
    /// - Throws: `.authenticationFailed` for a chunk that is not the next one sealed with this key
    ///   (altered, reordered, from another stream) or any chunk after the final one.
    public func pull(_ ciphertext: [UInt8], associatedData: [UInt8] = []) throws(SodiumError) -> SecureBytes {
        guard !finished, ciphertext.count >= Sodium.secretStreamOverhead else { throw .authenticationFailed }
        let plaintext = SecureBytes(uninitializedCount: ciphertext.count - Sodium.secretStreamOverhead)
        var tag: UInt8 = 0
        var written: UInt64 = 0
        let status = associatedData.withUnsafeBufferPointer { ad in
            crypto_secretstream_xchacha20poly1305_pull(
                state, plaintext.pointer.assumingMemoryBound(to: UInt8.self), &written, &tag,
                ciphertext, UInt64(ciphertext.count), ad.baseAddress, UInt64(ad.count))
        }
        guard status == 0 else { throw .authenticationFailed }
        if tag == UInt8(crypto_secretstream_xchacha20poly1305_tag_final()) { finished = true }
        return plaintext
    }
}
