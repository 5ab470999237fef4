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
        do {
            _ = try policySecret(session, entity: TPMHandle(tr: KC_ESYS_TR_RH_ENDORSEMENT, mustFlush: false),
                                 authSession: TPMHandle(tr: Self.password, mustFlush: false))
        } catch {
            flush(session)
            throw error
        }
        return session
    }

    /// TPM2_Import under the EK (see `importDuplicate`), authorized by the EK's policy.
    public func importDuplicate(publicArea: [UInt8], duplicate: [UInt8], encryptedSeed: [UInt8],
                                endorsementKey ek: TPMHandle) throws(TPMError) -> [UInt8] {
        let session = try endorsementSession()
        var used = false
        defer { if !used { flush(session) } }
        let out = try importDuplicate(publicArea: publicArea, duplicate: duplicate, encryptedSeed: encryptedSeed,
                                      parent: ek, authorization: session.tr)
        used = true  // continueSession clear: the TPM closed it.
        return out
    }

    /// TPM2_Load under the EK, authorized by the EK's policy.
    public func load(_ blob: SealedBlob, endorsementKey ek: TPMHandle) throws(TPMError) -> TPMHandle {
        let session = try endorsementSession()
        var used = false
        defer { if !used { flush(session) } }
        var inPublic = try Marshal.public(blob.publicArea)
        var inPrivate = try Marshal.private(blob.privateArea)
        var object: ESYS_TR = 0
        try call("Load(under EK)") {
            Esys_Load(esys, ek.tr, session.tr, Self.none, Self.none, &inPrivate, &inPublic, &object)
        }
        used = true
        return TPMHandle(tr: object, mustFlush: true)
    }
}
