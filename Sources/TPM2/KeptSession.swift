internal import CTSS2

/// keychaind's kept session and saved object contexts: what a chip's first read is spared (issue 39,
/// item 3; docs/daemon.md, "The TPM connection").
extension TPMContext {
    /// The salted HMAC session kept on this connection between operations, started on first use:
    /// salted to `saltKey` (the pinned SRK), it encrypts the Unseal's answer as the per-read salted
    /// session did. The TPM checks its HMAC in every command that names it, so a session another
    /// program flushed, or replaced with its own at the same handle, is refused before the command
    /// runs (`refusedKeptSession`).
    public func keptSession(saltKey: TPMHandle) throws(TPMError) -> TPMHandle {
        if let kept { return kept }
        let session = try startSession(.hmac, saltKey: saltKey, encryptResponse: true, continueSession: true)
        // The connection's, not the operation's: no scope flushes it (`dropKeptSession` and `deinit` do).
        _ = handles.forget(session.tr)
        kept = session
        return session
    }

    /// Whether a session is kept on this connection now.
    public var holdsKeptSession: Bool { kept != nil }

    /// Flushes the kept session (the TPM's slot given back).
    public func dropKeptSession() {
        if let kept { flush([kept.tr]) }
        kept = nil
    }

    /// Forgets the kept session without flushing it: the TPM refused it, or a leftover check is about
    /// to flush every session. Its handle may be another program's session by now.
    public func forgetKeptSession() {
        guard let session = kept else { return }
        closeResources([session.tr])
        kept = nil
    }

    /// A command refused for its second session (the kept one): not loaded (TPM_RC_REFERENCE_S1, 0x919),
    /// its HMAC, nonce or handle not what the TPM holds at that handle (a format-one code about
    /// session 2), or the first session's HMAC refused (TPM_RC_BAD_AUTH, TPM_RC_AUTH_FAIL): that HMAC
    /// covers the encrypt session's nonceTPM (Part 1, 19.6.5), and the TPM checks it first, so a
    /// session swapped at the kept one's handle is refused there. The command did not run.
    public static func refusedKeptSession(_ error: TPMError) -> Bool {
        guard error.code.isTPMError, !error.timedOut else { return false }
        if error.code.rawValue & 0xFFFF == 0x919 { return true }
        guard let subject = error.code.subject, subject.kind == .session else { return false }
        return subject.number == 2 || (subject.number == 1 && (error.code.is(.badAuth) || error.code.is(.authFail)))
    }

    // MARK: Saved object contexts (Part 3, 28.2 and 28.3)

    /// A transient object's context as the TPM saved it (encrypted and integrity-protected by the TPM,
    /// loadable on this TPM only until its next reset), with ESAPI's metadata of the object.
    public struct SavedContext: Sendable {
        let bytes: [UInt8]
    }

    /// ContextSave of a loaded object: the object stays loaded (the caller flushes it).
    public func saveContext(_ object: TPMHandle) throws(TPMError) -> SavedContext {
        var saved: UnsafeMutablePointer<TPMS_CONTEXT>?
        try call("ContextSave") { Esys_ContextSave(esys, object.tr, &saved) }
        defer { Esys_Free(saved) }
        guard let saved else { throw TPMError(command: "ContextSave", code: .failure) }
        return SavedContext(bytes: try Marshal.encode("TPMS_CONTEXT", saved.pointee, Tss2_MU_TPMS_CONTEXT_Marshal))
    }

    /// ContextLoad of a saved object; the returned handle must be flushed. A context from before the
    /// TPM's last reset, or of another TPM, is refused by the TPM (its integrity check).
    public func loadContext(_ saved: SavedContext) throws(TPMError) -> TPMHandle {
        var context = try Marshal.decode("TPMS_CONTEXT", saved.bytes, as: TPMS_CONTEXT(), Tss2_MU_TPMS_CONTEXT_Unmarshal)
        var object: ESYS_TR = 0
        try call("ContextLoad") { Esys_ContextLoad(esys, &context, &object) }
        return adopt(object)
    }
}
