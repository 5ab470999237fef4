internal import CTSS2

/// Objects duplicated to the endorsement key: the EK (a transient primary from the default
/// template) authorizes with its policy, PolicySecret(TPM_RH_ENDORSEMENT) in a new policy session
/// for each use (EK Credential Profile, B.3.3); the endorsement hierarchy's authorization is empty.
extension TPMContext {
    /// The EK of `type` as a transient object; the caller flushes it.
    public func endorsementKey(_ type: EndorsementKeyType) throws(TPMError) -> TPMHandle {
        try createEndorsementKey(type).handle
    }

    /// A policy session that satisfies the EK's policy, for one command.
    func endorsementSession() throws(TPMError) -> TPMHandle {
        let session = try startSession(.policy, saltKey: nil, continueSession: false)
        _ = try policySecret(session, entity: TPMHandle(tr: KC_ESYS_TR_RH_ENDORSEMENT, mustFlush: false),
                             authSession: TPMHandle(tr: Self.password, mustFlush: false))
        return session
    }

    /// TPM2_Import under the EK (see `importDuplicate`), authorized by the EK's policy.
    public func importDuplicate(publicArea: [UInt8], duplicate: [UInt8], encryptedSeed: [UInt8],
                                endorsementKey ek: TPMHandle) throws(TPMError) -> [UInt8] {
        try withTransient { () throws(TPMError) -> [UInt8] in
            // continueSession clear: the Import closes the session; on an error the scope flushes it.
            try importDuplicate(publicArea: publicArea, duplicate: duplicate, encryptedSeed: encryptedSeed,
                                parent: ek, authorization: try endorsementSession().tr)
        }
    }

    /// TPM2_Load under the EK, authorized by the EK's policy.
    public func load(_ blob: SealedBlob, endorsementKey ek: TPMHandle) throws(TPMError) -> TPMHandle {
        var inPublic = try Marshal.public(blob.publicArea)
        var inPrivate = try Marshal.private(blob.privateArea)
        var object: ESYS_TR = 0
        // Not in a scope of its own: the object outlives this call (the caller's scope flushes it),
        // and the session is closed by the Load (continueSession clear) or flushed with the object.
        let session = try endorsementSession()
        try call("Load(under EK)", sessions: [session.tr]) {
            Esys_Load(esys, ek.tr, session.tr, Self.none, Self.none, &inPrivate, &inPublic, &object)
        }
        return adopt(object)
    }
}
