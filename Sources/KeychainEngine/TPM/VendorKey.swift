import KeychainCore
internal import COpenSSL
import SecureMemory
import TPM2

/// The appliance vendor's boot-policy key: ECDSA over NIST P-256 (a curve every TPM verifies), in
/// PEM. The private half signs offline (`keychainctl boot-state sign`, no TPM); the device holds the
/// public half only, and the TPM checks signatures with it.
enum VendorKey {
    /// (x, y) of a PEM public key (SubjectPublicKeyInfo), or of the public half of a PEM private key.
    static func publicPoint(pem: [UInt8]) throws(KeychainError) -> (x: [UInt8], y: [UInt8]) {
        let key = try load(pem, private: false)
        defer { EVP_PKEY_free(key) }
        return try point(key)
    }

    /// Signs a SHA-256 digest; returns (r, s), 32 bytes each.
    static func sign(digest: [UInt8], privatePEM: SecureBytes) throws(KeychainError) -> (r: [UInt8], s: [UInt8]) {
        let pem = privatePEM.withUnsafeBytes { Array($0) }
        let key = try load(pem, private: true)
        defer { EVP_PKEY_free(key) }
        _ = try point(key)  // P-256 only
        guard let ctx = EVP_PKEY_CTX_new(key, nil) else { throw failure("cannot make a signing context") }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_sign_init(ctx) == 1 else { throw failure("cannot sign with this key") }
        var length = 0
        guard EVP_PKEY_sign(ctx, nil, &length, digest, digest.count) == 1 else { throw failure("cannot sign with this key") }
        var der = [UInt8](repeating: 0, count: length)
        guard EVP_PKEY_sign(ctx, &der, &length, digest, digest.count) == 1 else { throw failure("the signature failed") }
        var cursor: UnsafePointer<UInt8>? = der.withUnsafeBufferPointer { UnsafePointer($0.baseAddress) }
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, length)
        }
        guard let sig = parsed else { throw failure("the signature cannot be decoded") }
        defer { ECDSA_SIG_free(sig) }
        var r = [UInt8](repeating: 0, count: 32), s = [UInt8](repeating: 0, count: 32)
        guard BN_bn2binpad(ECDSA_SIG_get0_r(sig), &r, 32) == 32, BN_bn2binpad(ECDSA_SIG_get0_s(sig), &s, 32) == 32 else {
            throw failure("the signature cannot be encoded")
        }
        return (r, s)
    }

    private static func load(_ pem: [UInt8], private isPrivate: Bool) throws(KeychainError) -> OpaquePointer {
        let key: OpaquePointer? = pem.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return nil }
            defer { BIO_free(bio) }
            return isPrivate ? PEM_read_bio_PrivateKey(bio, nil, nil, nil) : PEM_read_bio_PUBKEY(bio, nil, nil, nil)
        }
        guard let key else {
            throw KeychainError.invalidArgument(isPrivate
                ? "The boot-policy signing key is not a PEM private key (openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256)"
                : "The boot-policy key is not a PEM public key (openssl pkey -in VENDOR.pem -pubout)")
        }
        return key
    }

    private static func point(_ key: OpaquePointer) throws(KeychainError) -> (x: [UInt8], y: [UInt8]) {
        var group = [CChar](repeating: 0, count: 64)
        var groupLength = 0
        guard EVP_PKEY_get_utf8_string_param(key, "group", &group, group.count, &groupLength) == 1,
              String(decoding: group.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) == "prime256v1" else {
            throw KeychainError.invalidArgument("The boot-policy key must be an EC key on NIST P-256 (prime256v1)")
        }
        var bx: OpaquePointer?, by: OpaquePointer?
        defer { BN_free(bx); BN_free(by) }
        guard EVP_PKEY_get_bn_param(key, "qx", &bx) == 1, EVP_PKEY_get_bn_param(key, "qy", &by) == 1 else {
            throw failure("cannot read the key's public point")
        }
        var x = [UInt8](repeating: 0, count: 32), y = [UInt8](repeating: 0, count: 32)
        guard BN_bn2binpad(bx, &x, 32) == 32, BN_bn2binpad(by, &y, 32) == 32 else { throw failure("cannot read the key's public point") }
        return (x, y)
    }

    private static func failure(_ what: String) -> KeychainError {
        KeychainError(.internal, "OpenSSL: \(what) (\(ERR_get_error()))")
    }
}
