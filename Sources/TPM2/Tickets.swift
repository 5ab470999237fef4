internal import CTSS2

/// Policy tickets (Part 3, 23.5 PolicyTicket): a PolicySigned or PolicySecret run with a negative
/// expiration returns a ticket that stands in for it in later sessions until the expiration, and,
/// because it was bound to a session nonce, never after a TPM reset.
public struct PolicyTicket: Sendable, Hashable, Codable {
    /// The TPM2B_TIMEOUT's bytes, as the TPM returned them.
    public var timeout: [UInt8]
    /// Marshalled TPMT_TK_AUTH.
    public var ticket: [UInt8]
    /// The name of the key (PolicySigned) or entity (PolicySecret) it stands for, and its policyRef.
    public var authName: [UInt8]
    public var policyRef: [UInt8]
}

extension TPMContext {
    static func ticket(timeout: UnsafeMutablePointer<TPM2B_TIMEOUT>?, ticket: UnsafeMutablePointer<TPMT_TK_AUTH>?,
                       authName: [UInt8], policyRef: [UInt8]) throws(TPMError) -> PolicyTicket? {
        guard let timeout, let ticket, ticket.pointee.digest.size > 0 else { return nil }
        return PolicyTicket(timeout: TPM2B.bytes(timeout.pointee.buffer, size: timeout.pointee.size),
                            ticket: try Marshal.encode("TPMT_TK_AUTH", ticket.pointee, Tss2_MU_TPMT_TK_AUTH_Marshal),
                            authName: authName, policyRef: policyRef)
    }

    /// PolicyTicket: replays an earlier PolicySigned/PolicySecret while its ticket is valid.
    public func policyTicket(_ session: TPMHandle, _ stored: PolicyTicket) throws(TPMError) {
        var timeout = TPM2B_TIMEOUT()
        timeout.size = TPM2B.set(&timeout.buffer, stored.timeout)
        var cpHash = TPM2B_DIGEST()
        var ref = TPM2B_NONCE()
        ref.size = TPM2B.set(&ref.buffer, stored.policyRef)
        var name = TPM2B_NAME()
        name.size = TPM2B.set(&name.name, stored.authName)
        var ticket = try Marshal.decode("TPMT_TK_AUTH", stored.ticket, as: TPMT_TK_AUTH(), Tss2_MU_TPMT_TK_AUTH_Unmarshal)
        try call("PolicyTicket") {
            Esys_PolicyTicket(esys, session.tr, Self.none, Self.none, Self.none, &timeout, &cpHash, &ref, &name, &ticket)
        }
    }
}
