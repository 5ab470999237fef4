internal import COpenSSL
internal import CTSS2

/// An EK certificate checked against the TPM maker's CA (a fleet server's `--ek-ca`): the chain
/// verifies to a certificate of the CA file, and the certified key is the EK the identity carries.
public enum EndorsementCertificate {
    /// - Parameters:
    ///   - der: the EK certificate, DER, as read from its NV index (0x01C00002, 0x01C0000A, 0x01C00016).
    ///   - caPEM: the CA file: one or more PEM certificates (root and intermediates), all trusted.
    ///   - endorsementPublic: the EK's public area (marshalled TPM2B_PUBLIC): RSA 2048, or ECC P-256
    ///     or P-384, whose key the certificate must hold (the modulus; the curve and the point).
    /// - Throws: why it does not verify, in OpenSSL's words, or that it certifies another key.
    public static func verify(der: [UInt8], caPEM: [UInt8], endorsementPublic: [UInt8]) throws(DuplicationError) {
        let area: TPMT_PUBLIC
        do { area = try Marshal.public(endorsementPublic).publicArea } catch { throw DuplicationError("the EK's public area does not parse") }
        var consumed = 0
        let certificate: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            var cursor = buffer.baseAddress
            let parsed = d2i_X509(nil, &cursor, buffer.count)
            if let cursor, let start = buffer.baseAddress { consumed = cursor - start }
            return parsed
        }
        guard let certificate else { throw DuplicationError("the EK certificate is not DER X.509") }
        defer { X509_free(certificate) }
        // d2i_X509 reads the first certificate and stops: bytes after it are refused, not ignored.
        guard consumed == der.count else { throw DuplicationError("the EK certificate has \(der.count - consumed) bytes after its DER") }
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
        let another = DuplicationError("the EK certificate certifies another key than the identity's EK")
        if area.type == UInt16(TPM2_ALG_RSA) {
            var n: OpaquePointer? = nil
            guard EVP_PKEY_get_bn_param(key, "n", &n) == 1, let n else { throw DuplicationError("the EK certificate certifies another key than the identity's EK (not an RSA key)") }
            defer { BN_free(n) }
            var modulus = [UInt8](repeating: 0, count: 256)
            guard area.unique.rsa.size == 256, (BN_num_bits(n) + 7) / 8 == 256, BN_bn2binpad(n, &modulus, 256) == 256,
                  modulus == TPM2B.bytes(area.unique.rsa.buffer, size: 256) else {
                throw another
            }
        } else if area.type == UInt16(TPM2_ALG_ECC) {
            let (group, size): (String, Int)
            switch area.parameters.eccDetail.curveID {
            case UInt16(TPM2_ECC_NIST_P256): (group, size) = ("prime256v1", 32)
            case UInt16(TPM2_ECC_NIST_P384): (group, size) = ("secp384r1", 48)
            default: throw DuplicationError("the EK's curve is neither P-256 nor P-384")
            }
            var name = [CChar](repeating: 0, count: 64)
            var nameLength = 0
            guard EVP_PKEY_get_utf8_string_param(key, "group", &name, name.count, &nameLength) == 1 else {
                throw DuplicationError("the EK certificate certifies another key than the identity's EK (not an ECC key)")
            }
            guard String(decoding: name.prefix(nameLength).map { UInt8(bitPattern: $0) }, as: UTF8.self) == group else { throw another }
            var qx: OpaquePointer? = nil, qy: OpaquePointer? = nil
            defer { BN_free(qx); BN_free(qy) }
            var x = [UInt8](repeating: 0, count: size), y = x
            guard EVP_PKEY_get_bn_param(key, "qx", &qx) == 1, EVP_PKEY_get_bn_param(key, "qy", &qy) == 1, let qx, let qy,
                  BN_bn2binpad(qx, &x, Int32(size)) == Int32(size), BN_bn2binpad(qy, &y, Int32(size)) == Int32(size),
                  Int(area.unique.ecc.x.size) == size, Int(area.unique.ecc.y.size) == size,
                  x == TPM2B.bytes(area.unique.ecc.x.buffer, size: UInt16(size)), y == TPM2B.bytes(area.unique.ecc.y.buffer, size: UInt16(size)) else {
                throw another
            }
        } else {
            throw DuplicationError("the EK is neither RSA nor ECC")
        }
    }
}
