internal import CTSS2
import SecureMemory

/// Hierarchy authorizations (Part 3, 24.8 HierarchyChangeAuth; Part 2, 8.6 TPMA_PERMANENT).
extension TPMContext {
    /// The TPMA_PERMANENT bits that say whether a hierarchy's authorization was ever set.
    public struct PermanentFlags: Sendable, Hashable {
        public let rawValue: UInt32
        public var ownerAuthSet: Bool { rawValue & 1 != 0 }
        public var lockoutAuthSet: Bool { rawValue & 4 != 0 }
    }

    public func permanentFlags() throws(TPMError) -> PermanentFlags {
        PermanentFlags(rawValue: try property(KC_PT_PERMANENT))
    }

    /// A transient primary key in the null hierarchy (whose authorization is always empty), to salt
    /// sessions before the SRK exists; the caller flushes it.
    public func ephemeralSaltKey() throws(TPMError) -> TPMHandle {
        try createPrimary(KC_ESYS_TR_RH_NULL, label: "salt key")
    }

    /// Sets the authorization of `hierarchy` (`owner` or `lockout`, whose current one ESAPI holds) in
    /// an HMAC session salted with `saltKey` that encrypts the command's parameter: the new value
    /// never crosses the bus in clear. ESAPI then uses the new value for the hierarchy.
    public func changeHierarchyAuth(_ hierarchy: TPMHandle, to newAuth: SecureBytes, saltKey: TPMHandle) throws(TPMError) {
        var auth = TPM2B_AUTH()
        defer { TPM2B.wipe(&auth) }
        guard newAuth.count <= MemoryLayout.size(ofValue: auth.buffer) else {
            throw TPMError(command: "HierarchyChangeAuth", code: .size)
        }
        newAuth.withUnsafeBytes { auth.size = TPM2B.set(&auth.buffer, $0) }
        try withSession(.hmac, saltKey: saltKey, decryptCommand: true) { session throws(TPMError) in
            try call("HierarchyChangeAuth") {
                Esys_HierarchyChangeAuth(esys, hierarchy.tr, session.tr, Self.none, Self.none, &auth)
            }
        }
        try setAuth(hierarchy, newAuth)
    }
}
