internal import COpenSSL
import SecureMemory

/// The Secret Service's `dh-ietf1024-sha256-aes128-cbc-pkcs7` session: Diffie-Hellman in RFC 2409's
/// second Oakley group, HKDF-SHA256 (no salt, empty info) to a 128-bit key, AES-128-CBC with PKCS#7.
/// gcr's secret exchange (`sx-aes-1`, how its system prompter sends the password it read) is the same
/// construction in RFC 3526's 1536-bit MODP group (`Group.modp1536`).
///
/// Every libcrypto call of the D-Bus code is in this file.
public enum SessionCrypto {
    /// A MODP group with generator 2.
    public enum Group: Sendable {
        /// RFC 2409 §6.2: the Secret Service's session.
        case oakley1024
        /// RFC 3526 §2: gcr's secret exchange.
        case modp1536

        var length: Int { self == .oakley1024 ? 128 : 192 }
        var name: String { self == .oakley1024 ? "RFC 2409's second Oakley group" : "RFC 3526's 1536-bit MODP group" }
        /// The prime, as libcrypto holds it.
        func prime() -> OpaquePointer? {
            switch self {
            case .oakley1024:
                var prime: OpaquePointer?
                return BN_hex2bn(&prime, primeHex) > 0 ? prime : nil
            case .modp1536: return BN_get_rfc3526_prime_1536(nil)
            }
        }
    }

    /// RFC 2409 §6.2, the 1024-bit MODP group; the generator is 2.
    package static let primeHex = "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
        + "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
        + "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE65381FFFFFFFFFFFFFFFF"
    /// The prime's length in bytes: public keys and the shared secret are left-padded to it.
    public static let primeLength = 128

    /// Our public key and the session's AES key, from the client's public key (big-endian, any length up to 128).
    ///
    /// - Throws: `invalidArgs` for a public key outside 2…p−2 (0, 1 and p−1 give a known shared secret).
    public static func agree(clientPublic: SecureBytes, group: Group = .oakley1024) throws(DBusError) -> (ourPublic: [UInt8], key: SecureBytes) {
        let ours = try keyPair(group)
        return (ours.publicKey, try sessionKey(ours, peerPublic: clientPublic, group: group))
    }

    /// One side's half of a session: the private exponent in locked memory, and the public key sent
    /// to the other side (a client's in `OpenSession`, when we open a session with another provider).
    public struct KeyPair: Sendable {
        let secret: SecureBytes
        public let publicKey: [UInt8]
    }

    /// A new key pair in `group`: the private exponent uniform in 2…p−2.
    public static func keyPair(_ group: Group = .oakley1024) throws(DBusError) -> KeyPair {
        let primeLength = group.length
        guard let context = BN_CTX_new() else { throw .failed("libcrypto could not allocate a BN_CTX") }
        defer { BN_CTX_free(context) }
        guard let prime = group.prime() else { throw .failed("libcrypto could not read the group's prime") }
        defer { BN_free(prime) }
        guard let generator = BN_new(), BN_set_word(generator, 2) == 1 else { throw .failed("libcrypto could not make the generator") }
        defer { BN_free(generator) }
        guard let secret = BN_secure_new() else { throw .failed("libcrypto could not allocate the private key") }
        defer { BN_clear_free(secret) }
        guard let range = BN_dup(prime), BN_sub_word(range, 3) == 1, BN_priv_rand_range(secret, range) == 1,
              BN_add_word(secret, 2) == 1 else {
            throw .failed("libcrypto could not draw a private key")
        }
        defer { BN_free(range) }
        guard let ours = BN_new(), BN_mod_exp(ours, generator, secret, prime, context) == 1 else {
            throw .failed("libcrypto could not compute the public key")
        }
        defer { BN_free(ours) }
        var publicKey = [UInt8](repeating: 0, count: primeLength)
        let kept = SecureBytes(count: primeLength)
        guard BN_bn2binpad(ours, &publicKey, Int32(primeLength)) == Int32(primeLength),
              kept.withUnsafeMutableBytes({ BN_bn2binpad(secret, $0.bindMemory(to: UInt8.self).baseAddress, Int32(primeLength)) }) == Int32(primeLength) else {
            throw .failed("libcrypto failed")
        }
        return KeyPair(secret: kept, publicKey: publicKey)
    }

    /// The session's AES key from our key pair and the other side's public key: the shared secret
    /// left-padded to the prime's length, through HKDF.
    /// - Throws: `invalidArgs` for a public key outside 2…p−2 (0, 1 and p−1 give a known shared secret).
    public static func sessionKey(_ ours: KeyPair, peerPublic: SecureBytes, group: Group = .oakley1024) throws(DBusError) -> SecureBytes {
        let primeLength = group.length
        guard peerPublic.count > 0, peerPublic.count <= primeLength else {
            throw .invalidArgs("The session's public key has \(peerPublic.count) bytes; expected 1 to \(primeLength)")
        }
        guard let context = BN_CTX_new() else { throw .failed("libcrypto could not allocate a BN_CTX") }
        defer { BN_CTX_free(context) }
        guard let prime = group.prime() else { throw .failed("libcrypto could not read the group's prime") }
        defer { BN_free(prime) }
        guard let peer = peerPublic.withUnsafeBytes({ BN_bin2bn($0.bindMemory(to: UInt8.self).baseAddress, Int32($0.count), nil) }) else {
            throw .failed("libcrypto could not read the public key")
        }
        defer { BN_free(peer) }
        // 2 <= peer <= p - 2.
        guard let limit = BN_dup(prime), BN_sub_word(limit, 1) == 1 else { throw .failed("libcrypto failed") }
        defer { BN_free(limit) }
        guard BN_is_zero(peer) == 0, BN_is_one(peer) == 0, BN_cmp(peer, limit) < 0 else {
            throw .invalidArgs("The session's public key is not in 2…p−2 of \(group.name)")
        }
        guard let secret = BN_secure_new() else { throw .failed("libcrypto could not allocate the private key") }
        defer { BN_clear_free(secret) }
        guard ours.secret.withUnsafeBytes({ BN_bin2bn($0.bindMemory(to: UInt8.self).baseAddress, Int32($0.count), secret) }) != nil,
              let shared = BN_secure_new() else { throw .failed("libcrypto could not read the private key") }
        defer { BN_clear_free(shared) }
        guard BN_mod_exp(shared, peer, secret, prime, context) == 1 else { throw .failed("libcrypto could not compute the shared secret") }
        let padded = SecureBytes(count: primeLength)
        let written = padded.withUnsafeMutableBytes { BN_bn2binpad(shared, $0.bindMemory(to: UInt8.self).baseAddress, Int32(primeLength)) }
        guard written == Int32(primeLength) else { throw .failed("libcrypto failed") }
        return try hkdf(padded)
    }

    /// HKDF-SHA256 (RFC 5869) with no salt and empty info, 16 bytes out.
    package static func hkdf(_ input: SecureBytes) throws(DBusError) -> SecureBytes {
        guard let kdf = EVP_KDF_fetch(nil, "HKDF", nil) else { throw .failed("libcrypto has no HKDF") }
        defer { EVP_KDF_free(kdf) }
        guard let context = EVP_KDF_CTX_new(kdf) else { throw .failed("libcrypto could not allocate an HKDF context") }
        defer { EVP_KDF_CTX_free(context) }
        let key = SecureBytes(count: 16)
        // OSSL_PARAM keeps the pointers it is given: every string must outlive the derive call.
        let status: Int32 = "digest".withCString { digestName in
            "key".withCString { keyName in
                "SHA256".withCString { digest in
                    input.withUnsafeBytes { ikm in
                        key.withUnsafeMutableBytes { out in
                            var params = [
                                OSSL_PARAM_construct_utf8_string(digestName, UnsafeMutablePointer(mutating: digest), 0),
                                OSSL_PARAM_construct_octet_string(keyName, UnsafeMutableRawPointer(mutating: ikm.baseAddress), ikm.count),
                                OSSL_PARAM_construct_end(),
                            ]
                            return EVP_KDF_derive(context, out.bindMemory(to: UInt8.self).baseAddress, 16, &params)
                        }
                    }
                }
            }
        }
        guard status == 1 else { throw .failed("libcrypto's HKDF failed") }
        return key
    }

    public static let ivLength = 16

    /// AES-128-CBC with PKCS#7 under `key`, with a new random IV.
    public static func encrypt(_ plaintext: SecureBytes, key: SecureBytes) throws(DBusError) -> (iv: [UInt8], ciphertext: [UInt8]) {
        let iv = Sodium.randomBytes(ivLength)
        var out = [UInt8](repeating: 0, count: plaintext.count + 16)
        var total: Int32 = 0
        let ok: Bool = key.withUnsafeBytes { keyBytes in
            plaintext.withUnsafeBytes { input in
                guard let context = EVP_CIPHER_CTX_new() else { return false }
                defer { EVP_CIPHER_CTX_free(context) }
                guard EVP_EncryptInit_ex(context, EVP_aes_128_cbc(), nil, keyBytes.bindMemory(to: UInt8.self).baseAddress, iv) == 1
                else { return false }
                var length: Int32 = 0
                guard EVP_EncryptUpdate(context, &out, &length, input.bindMemory(to: UInt8.self).baseAddress, Int32(input.count)) == 1
                else { return false }
                total = length
                guard out.withUnsafeMutableBufferPointer({ EVP_EncryptFinal_ex(context, $0.baseAddress! + Int(total), &length) }) == 1
                else { return false }
                total += length
                return true
            }
        }
        guard ok else { throw .failed("AES-128-CBC encryption failed") }
        return (iv, Array(out[0..<Int(total)]))
    }

    /// The plaintext of AES-128-CBC with PKCS#7 under `key`.
    ///
    /// - Throws: `invalidArgs` for an IV that is not 16 bytes, a ciphertext that is not whole blocks, or bad padding.
    public static func decrypt(_ ciphertext: SecureBytes, iv: SecureBytes, key: SecureBytes) throws(DBusError) -> SecureBytes {
        guard iv.count == ivLength else { throw .invalidArgs("The secret's parameters hold \(iv.count) bytes; expected a 16-byte AES IV") }
        guard ciphertext.count > 0, ciphertext.count % 16 == 0 else {
            throw .invalidArgs("The secret's value is \(ciphertext.count) bytes: AES-128-CBC with PKCS#7 gives a non-empty multiple of 16")
        }
        let buffer = SecureBytes(count: ciphertext.count + 16)
        var total: Int32 = 0
        let ok: Bool = key.withUnsafeBytes { keyBytes in
            iv.withUnsafeBytes { ivBytes in
                ciphertext.withUnsafeBytes { input in
                    buffer.withUnsafeMutableBytes { output in
                        guard let context = EVP_CIPHER_CTX_new() else { return false }
                        defer { EVP_CIPHER_CTX_free(context) }
                        let out = output.bindMemory(to: UInt8.self).baseAddress!
                        guard EVP_DecryptInit_ex(context, EVP_aes_128_cbc(), nil, keyBytes.bindMemory(to: UInt8.self).baseAddress,
                                                 ivBytes.bindMemory(to: UInt8.self).baseAddress) == 1 else { return false }
                        var length: Int32 = 0
                        guard EVP_DecryptUpdate(context, out, &length, input.bindMemory(to: UInt8.self).baseAddress, Int32(input.count)) == 1
                        else { return false }
                        total = length
                        guard EVP_DecryptFinal_ex(context, out + Int(total), &length) == 1 else { return false }
                        total += length
                        return true
                    }
                }
            }
        }
        guard ok else { throw .invalidArgs("The secret does not decrypt under this session's key (wrong key, IV or PKCS#7 padding)") }
        return buffer.withUnsafeBytes { SecureBytes(copying: $0[0..<Int(total)]) }
    }
}
