internal import COpenSSL

/// An EK certificate checked against the TPM maker's CA (a fleet server's `--ek-ca`): the chain
/// verifies to a certificate of the CA file, and the certified key is the EK the identity carries.
public enum EndorsementCertificate {
    /// - Parameters:
    ///   - der: the EK certificate, DER, as read from NV 0x01C00002.
    ///   - caPEM: the CA file: one or more PEM certificates (root and intermediates), all trusted.
    ///   - rsaModulus: the EK's modulus from its public area (256 bytes).
    /// - Throws: why it does not verify, in OpenSSL's words, or that it certifies another key.
    public static func verify(der: [UInt8], caPEM: [UInt8], rsaModulus: [UInt8]) throws(DuplicationError) {
        var cursor: UnsafePointer<UInt8>? = nil
        let certificate: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_X509(nil, &cursor, buffer.count)
        }
        guard let certificate else { throw DuplicationError("the EK certificate is not DER X.509") }
        defer { X509_free(certificate) }
        guard let store = X509_STORE_new() else { throw DuplicationError("libcrypto: no certificate store") }
        defer { X509_STORE_free(store) }
        var anchors = 0
        caPEM.withUnsafeBytes { raw in
            guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { return }
            defer { BIO_free(bio) }
            while let ca = PEM_read_bio_X509(bio, nil, nil, nil) {
                if X509_STORE_add_cert(store, ca) == 1 { anchors += 1 }
                X509_free(ca)
            }
        }
        guard anchors > 0 else { throw DuplicationError("the CA file holds no PEM certificate") }
        guard let ctx = X509_STORE_CTX_new() else { throw DuplicationError("libcrypto: no verification context") }
        defer { X509_STORE_CTX_free(ctx) }
        guard X509_STORE_CTX_init(ctx, store, certificate, nil) == 1 else { throw DuplicationError("libcrypto: cannot verify") }
        guard X509_verify_cert(ctx) == 1 else {
            let reason = String(cString: X509_verify_cert_error_string(Int(X509_STORE_CTX_get_error(ctx))))
            throw DuplicationError("the EK certificate does not verify against the CA: \(reason)")
        }
        guard let key = X509_get0_pubkey(certificate) else { throw DuplicationError("the EK certificate has no public key") }
        var n: OpaquePointer? = nil
        guard EVP_PKEY_get_bn_param(key, "n", &n) == 1, let n else { throw DuplicationError("the EK certificate's key is not RSA") }
        defer { BN_free(n) }
        var modulus = [UInt8](repeating: 0, count: 256)
        guard (BN_num_bits(n) + 7) / 8 == 256, BN_bn2binpad(n, &modulus, 256) == 256, modulus == rsaModulus else {
            throw DuplicationError("the EK certificate certifies another key than the identity's EK")
        }
    }
}
