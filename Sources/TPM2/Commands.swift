internal import CTSS2
import SecureMemory
import KeychainBasics

/// The TPM commands the keychain uses, each a thin typed wrapper over one ESAPI call.
extension TPMContext {
    // MARK: Sessions (Part 3, 11.1)

    public enum SessionKind: Sendable { case hmac, policy, trial }

    /// Starts a session salted with `saltKey` (the SRK), AES-128-CFB parameter encryption available.
    /// With `encryptResponse`, secrets returned by the next command cross the bus encrypted;
    /// with `decryptCommand`, the first command parameter (a new PIN, a sealed secret) does.
    public func startSession(_ kind: SessionKind, saltKey: TPMHandle?, encryptResponse: Bool = false,
                             decryptCommand: Bool = false, continueSession: Bool = false) throws(TPMError) -> TPMHandle {
        var symmetric = TPMT_SYM_DEF()
        symmetric.algorithm = UInt16(TPM2_ALG_AES)
        symmetric.keyBits.aes = 128
        symmetric.mode.aes = UInt16(TPM2_ALG_CFB)
        let type: TPM2_SE = switch kind { case .hmac: UInt8(TPM2_SE_HMAC); case .policy: UInt8(TPM2_SE_POLICY); case .trial: UInt8(TPM2_SE_TRIAL) }
        var session: ESYS_TR = 0
        let began = ContinuousClock.now
        do {
            try call("StartAuthSession") {
                Esys_StartAuthSession(esys, saltKey?.tr ?? Self.none, Self.none, Self.none, Self.none, Self.none,
                                      nil, type, &symmetric, UInt16(TPM2_ALG_SHA256), &session)
            }
        } catch where error.code.is(.sessionMemory) && kept != nil {
            // The kept session takes one of the TPM's loaded-session slots (3 on many chips and on
            // swtpm): an operation that needs them all gets it back; the next read starts a new one.
            dropKeptSession()
            try call("StartAuthSession") {
                Esys_StartAuthSession(esys, saltKey?.tr ?? Self.none, Self.none, Self.none, Self.none, Self.none,
                                      nil, type, &symmetric, UInt16(TPM2_ALG_SHA256), &session)
            }
        }
        if saltKey != nil {
            let took = ContinuousClock.now - began
            saltedSessionTime = min(saltedSessionTime ?? took, took)
        }
        let handle = adopt(session, continues: continueSession)
        var flags: TPMA_SESSION = 0
        if continueSession { flags |= KC_SESSION_CONTINUE }
        if encryptResponse { flags |= KC_SESSION_ENCRYPT }
        if decryptCommand { flags |= KC_SESSION_DECRYPT }
        let mask = KC_SESSION_CONTINUE | KC_SESSION_ENCRYPT | KC_SESSION_DECRYPT
        // On failure the session stays recorded: the caller's scope flushes it.
        try Self.local("TRSess_SetAttributes") { Esys_TRSess_SetAttributes(esys, session, flags, mask) }
        return handle
    }

    /// Runs `body` with a session, in a scope of its own (`withTransient`): the session, and whatever
    /// `body` made, is flushed afterwards, whether `body` threw or not.
    public func withSession<T>(_ kind: SessionKind, saltKey: TPMHandle?, encryptResponse: Bool = false,
                               decryptCommand: Bool = false,
                               _ body: (TPMHandle) throws(TPMError) -> T) throws(TPMError) -> T {
        try withTransient { () throws(TPMError) -> T in
            let session = try startSession(kind, saltKey: saltKey, encryptResponse: encryptResponse,
                                           decryptCommand: decryptCommand, continueSession: true)
            return try body(session)
        }
    }

    // MARK: The storage root key (TCG EK/SRK provisioning guidance: ECC P-256 SRK template)

    /// Creates the SRK in the owner hierarchy and makes it persistent at `persistentHandle`.
    public func provisionSRK(at persistentHandle: UInt32) throws(TPMError) -> TPMHandle {
        try withTransient { () throws(TPMError) -> TPMHandle in
            let primary = try createPrimary(KC_ESYS_TR_RH_OWNER, label: "SRK")
            var persistent: ESYS_TR = 0
            let owner = try ownerAuthorization()
            try call("EvictControl(SRK)") {
                Esys_EvictControl(esys, KC_ESYS_TR_RH_OWNER, primary.tr, owner, Self.none, Self.none,
                                  persistentHandle, &persistent)
            }
            return TPMHandle(tr: persistent, mustFlush: false)
        }
    }

    /// The ECC P-256 storage-parent parameters of the SRK and ECC EK templates (TCG EK profile):
    /// AES-128-CFB, no scheme, no KDF, an empty 32-byte unique point.
    static func setP256StorageParameters(_ area: inout TPMT_PUBLIC) {
        area.type = UInt16(TPM2_ALG_ECC)
        area.parameters.eccDetail.symmetric.algorithm = UInt16(TPM2_ALG_AES)
        area.parameters.eccDetail.symmetric.keyBits.aes = 128
        area.parameters.eccDetail.symmetric.mode.aes = UInt16(TPM2_ALG_CFB)
        area.parameters.eccDetail.scheme.scheme = UInt16(TPM2_ALG_NULL)
        area.parameters.eccDetail.curveID = UInt16(TPM2_ECC_NIST_P256)
        area.parameters.eccDetail.kdf.scheme = UInt16(TPM2_ALG_NULL)
        area.unique.ecc.x.size = 32
        area.unique.ecc.y.size = 32
    }

    /// A transient primary key with the SRK template in `hierarchy`; the caller flushes it.
    func createPrimary(_ hierarchy: ESYS_TR, label: String) throws(TPMError) -> TPMHandle {
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
        inPublic.publicArea.objectAttributes = TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT
            | TPMA_OBJECT_SENSITIVEDATAORIGIN | TPMA_OBJECT_USERWITHAUTH | TPMA_OBJECT_NODA
            | TPMA_OBJECT_RESTRICTED | TPMA_OBJECT_DECRYPT
        Self.setP256StorageParameters(&inPublic.publicArea)
        var inSensitive = TPM2B_SENSITIVE_CREATE()
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var primary: ESYS_TR = 0
        try call("CreatePrimary(\(label))") {
            Esys_CreatePrimary(esys, hierarchy, Self.password, Self.none, Self.none,
                               &inSensitive, &inPublic, &outsideInfo, &creationPCR, &primary, nil, nil, nil, nil)
        }
        return adopt(primary)
    }

    // MARK: Sealed data objects (Part 3, 12.1 Create, 12.2 Load, 12.7 Unseal)

    public struct SealedBlob: Sendable, Hashable {
        /// Marshalled TPM2B_PUBLIC and TPM2B_PRIVATE, as stored.
        public var publicArea: [UInt8]
        public var privateArea: [UInt8]
        /// What TPM2_Create said of the object it made (nil for a blob read back from a store).
        public var creation: Creation?
        public init(publicArea: [UInt8], privateArea: [UInt8], creation: Creation? = nil) {
            (self.publicArea, self.privateArea, self.creation) = (publicArea, privateArea, creation)
        }
    }

    /// TPM2_Create's creation outputs, marshalled: TPM2B_CREATION_DATA (the parent's name and
    /// qualified name among them), the TPM2B_DIGEST of it, and the TPMT_TK_CREATION ticket with which
    /// TPM2_CertifyCreation (Part 3, 18.3) later proves that this TPM made the object.
    public struct Creation: Sendable, Hashable, Codable {
        public var data: [UInt8]
        public var hash: [UInt8]
        public var ticket: [UInt8]
        public init(data: [UInt8], hash: [UInt8], ticket: [UInt8]) { (self.data, self.hash, self.ticket) = (data, hash, ticket) }
    }

    /// Seals `secret` under `parent` with an authorization policy.
    /// - Parameters:
    ///   - fixed: `fixedTPM|fixedParent`: the object can never leave this TPM.
    ///   - userWithAuth: also usable with its (empty) authValue, for objects with no policy.
    ///   - session: a salted session with `decryptCommand`, so the secret crosses the bus encrypted.
    public func seal(_ secret: SecureBytes, parent: TPMHandle, policy: [UInt8], fixed: Bool,
                     userWithAuth: Bool, session: TPMHandle) throws(TPMError) -> SealedBlob {
        var attributes = TPMA_OBJECT_NODA | TPMA_OBJECT_ADMINWITHPOLICY
        if fixed { attributes |= TPMA_OBJECT_FIXEDTPM | TPMA_OBJECT_FIXEDPARENT }
        if userWithAuth { attributes |= TPMA_OBJECT_USERWITHAUTH }
        return try create(Self.keyedHash(attributes: attributes, policy: policy, hmac: false), sensitive: secret,
                          parent: parent, session: session, command: "Create(sealed)")
    }

    /// A keyedHash public area (SHA-256 name): a sealed data object, or an HMAC-SHA256 key.
    static func keyedHash(attributes: TPMA_OBJECT, policy: [UInt8], hmac: Bool) -> TPM2B_PUBLIC {
        var inPublic = TPM2B_PUBLIC()
        inPublic.publicArea.type = UInt16(TPM2_ALG_KEYEDHASH)
        inPublic.publicArea.nameAlg = UInt16(TPM2_ALG_SHA256)
        inPublic.publicArea.objectAttributes = attributes
        inPublic.publicArea.authPolicy.size = TPM2B.set(&inPublic.publicArea.authPolicy.buffer, policy)
        inPublic.publicArea.parameters.keyedHashDetail.scheme.scheme = UInt16(hmac ? TPM2_ALG_HMAC : TPM2_ALG_NULL)
        if hmac { inPublic.publicArea.parameters.keyedHashDetail.scheme.details.hmac.hashAlg = UInt16(TPM2_ALG_SHA256) }
        return inPublic
    }

    /// TPM2_Create under `parent` (Part 3, 12.1). `sensitive`, when given, is the object's secret and
    /// goes in through `session` (a salted session with the decrypt attribute); nil lets the TPM
    /// generate it. Returns the blob, loadable only under this parent.
    func create(_ template: TPM2B_PUBLIC, sensitive: SecureBytes?, parent: TPMHandle, session: TPMHandle?,
                command: String) throws(TPMError) -> SealedBlob {
        var inPublic = template
        var inSensitive = TPM2B_SENSITIVE_CREATE()
        defer { TPM2B.wipe(&inSensitive) }
        sensitive?.withUnsafeBytes { inSensitive.sensitive.data.size = TPM2B.set(&inSensitive.sensitive.data.buffer, $0) }
        var outsideInfo = TPM2B_DATA()
        var creationPCR = TPML_PCR_SELECTION()
        var outPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
        var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
        var creationData: UnsafeMutablePointer<TPM2B_CREATION_DATA>?
        var creationHash: UnsafeMutablePointer<TPM2B_DIGEST>?
        var creationTicket: UnsafeMutablePointer<TPMT_TK_CREATION>?
        try call(command, sessions: session.map { [$0.tr] } ?? []) {
            Esys_Create(esys, parent.tr, session?.tr ?? Self.password, Self.none, Self.none, &inSensitive, &inPublic,
                        &outsideInfo, &creationPCR, &outPrivate, &outPublic, &creationData, &creationHash, &creationTicket)
        }
        defer { Esys_Free(outPrivate); Esys_Free(outPublic); Esys_Free(creationData); Esys_Free(creationHash); Esys_Free(creationTicket) }
        var creation: Creation?
        if let creationData, let creationHash, let creationTicket {
            creation = Creation(data: try Marshal.encode("TPM2B_CREATION_DATA", creationData.pointee, Tss2_MU_TPM2B_CREATION_DATA_Marshal),
                                hash: TPM2B.bytes(creationHash.pointee.buffer, size: creationHash.pointee.size),
                                ticket: try Marshal.encode("TPMT_TK_CREATION", creationTicket.pointee, Tss2_MU_TPMT_TK_CREATION_Marshal))
        }
        return SealedBlob(publicArea: try Marshal.public(outPublic!.pointee),
                          privateArea: try Marshal.private(outPrivate!.pointee), creation: creation)
    }

    /// Loads a sealed blob under `parent`; the returned handle must be flushed.
    public func load(_ blob: SealedBlob, parent: TPMHandle) throws(TPMError) -> TPMHandle {
        var inPublic = try Marshal.public(blob.publicArea)
        var inPrivate = try Marshal.private(blob.privateArea)
        var object: ESYS_TR = 0
        try call("Load") {
            Esys_Load(esys, parent.tr, Self.password, Self.none, Self.none, &inPrivate, &inPublic, &object)
        }
        return adopt(object)
    }

    /// Unseals with `session` (a policy session, or an HMAC session for userWithAuth objects).
    /// - Parameter encryptSession: a second session that encrypts the answer (keychaind's kept session):
    ///   the TPM checks its HMAC before the command runs, so a session that is no longer ours is refused
    ///   (TPM 2.0 Part 1, 19.6: every session's HMAC, an encrypt-only one's included).
    public func unseal(_ object: TPMHandle, session: TPMHandle, encryptSession: TPMHandle? = nil) throws(TPMError) -> SecureBytes {
        var out: UnsafeMutablePointer<TPM2B_SENSITIVE_DATA>?
        try call("Unseal", sessions: [session.tr]) { Esys_Unseal(esys, object.tr, session.tr, encryptSession?.tr ?? Self.none, Self.none, &out) }
        guard let out else { throw TPMError(command: "Unseal", code: .failure) }
        defer { TPM2B.wipe(&out.pointee); Esys_Free(out) }
        return withUnsafeBytes(of: out.pointee.buffer) { SecureBytes(copying: $0.prefix(Int(out.pointee.size))) }
    }

    /// The authPolicy digest inside a marshalled public area (what the object was sealed to).
    public static func authPolicy(ofPublic bytes: [UInt8]) throws(TPMError) -> [UInt8] {
        let pub = try Marshal.public(bytes)
        return TPM2B.bytes(pub.publicArea.authPolicy.buffer, size: pub.publicArea.authPolicy.size)
    }

    // MARK: Policy commands (Part 3, 23)

    public func policyPCR(_ session: TPMHandle, selection: PCRSelection, digest: [UInt8]) throws(TPMError) {
        var pcrDigest = TPM2B_DIGEST()
        pcrDigest.size = TPM2B.set(&pcrDigest.buffer, digest)
        var pcrs = Marshal.pcrSelection(selection)
        try call("PolicyPCR") { Esys_PolicyPCR(esys, session.tr, Self.none, Self.none, Self.none, &pcrDigest, &pcrs) }
    }

    /// PolicyNV with the index as its own read authorization (AUTHREAD with an empty authValue).
    public func policyNV(_ session: TPMHandle, index: TPMHandle, operand: [UInt8], offset: UInt16,
                         comparison: NVComparison) throws(TPMError) {
        var operandB = TPM2B_OPERAND()
        operandB.size = TPM2B.set(&operandB.buffer, operand)
        try call("PolicyNV") {
            Esys_PolicyNV(esys, index.tr, index.tr, session.tr, Self.password, Self.none, Self.none,
                          &operandB, offset, comparison.rawValue)
        }
    }

    /// PolicySecret: `authSession` proves knowledge of the entity's authValue (set with `setAuth`).
    /// With a negative `expiration` (and the session's nonce), the TPM returns a ticket.
    @discardableResult
    public func policySecret(_ session: TPMHandle, entity: TPMHandle, authSession: TPMHandle,
                             policyRef: [UInt8] = [], expiration: Int32 = 0) throws(TPMError) -> PolicyTicket? {
        var ref = TPM2B_NONCE()
        ref.size = TPM2B.set(&ref.buffer, policyRef)
        var timeout: UnsafeMutablePointer<TPM2B_TIMEOUT>?
        var ticket: UnsafeMutablePointer<TPMT_TK_AUTH>?
        var nonce = TPM2B_NONCE()
        if expiration < 0 {
            let current = try nonceTPM(session)
            nonce.size = TPM2B.set(&nonce.buffer, current)
        }
        try withUnsafePointer(to: &nonce) { noncePointer throws(TPMError) in
            try call("PolicySecret", sessions: [authSession.tr]) {
                Esys_PolicySecret(esys, entity.tr, session.tr, authSession.tr, Self.none, Self.none,
                                  expiration < 0 ? noncePointer : nil, nil, &ref, expiration, &timeout, &ticket)
            }
        }
        defer { Esys_Free(timeout); Esys_Free(ticket) }
        guard expiration < 0 else { return nil }
        return try Self.ticket(timeout: timeout, ticket: ticket, authName: try name(of: entity), policyRef: policyRef)
    }

    public func policyCommandCode(_ session: TPMHandle, _ code: UInt32) throws(TPMError) {
        try call("PolicyCommandCode") { Esys_PolicyCommandCode(esys, session.tr, Self.none, Self.none, Self.none, code) }
    }

    public func policyCpHash(_ session: TPMHandle, _ cpHash: [UInt8]) throws(TPMError) {
        var digest = TPM2B_DIGEST()
        digest.size = TPM2B.set(&digest.buffer, cpHash)
        try call("PolicyCpHash") { Esys_PolicyCpHash(esys, session.tr, Self.none, Self.none, Self.none, &digest) }
    }

    public func policyAuthValue(_ session: TPMHandle) throws(TPMError) {
        try call("PolicyAuthValue") { Esys_PolicyAuthValue(esys, session.tr, Self.none, Self.none, Self.none) }
    }

    public func policyOR(_ session: TPMHandle, _ branches: [[UInt8]]) throws(TPMError) {
        var list = TPML_DIGEST()
        list.count = UInt32(branches.count)
        withUnsafeMutableBytes(of: &list.digests) { raw in
            let digests = raw.bindMemory(to: TPM2B_DIGEST.self)
            for (i, branch) in branches.enumerated() {
                digests[i].size = TPM2B.set(&digests[i].buffer, branch)
            }
        }
        try call("PolicyOR") { Esys_PolicyOR(esys, session.tr, Self.none, Self.none, Self.none, &list) }
    }

    public func policyDigest(_ session: TPMHandle) throws(TPMError) -> [UInt8] {
        var digest: UnsafeMutablePointer<TPM2B_DIGEST>?
        try call("PolicyGetDigest") { Esys_PolicyGetDigest(esys, session.tr, Self.none, Self.none, Self.none, &digest) }
        defer { Esys_Free(digest) }
        return TPM2B.bytes(digest!.pointee.buffer, size: digest!.pointee.size)
    }

    // MARK: NV indices (Part 3, 31)

    public func defineNV(_ pub: NVPublic, auth: SecureBytes?, ownerSession: TPMHandle? = nil) throws(TPMError) -> TPMHandle {
        var authValue = TPM2B_AUTH()
        defer { TPM2B.wipe(&authValue) }
        auth?.withUnsafeBytes { authValue.size = TPM2B.set(&authValue.buffer, $0) }
        var info = TPM2B_NV_PUBLIC()
        info.nvPublic.nvIndex = pub.index
        info.nvPublic.nameAlg = UInt16(TPM2_ALG_SHA256)
        info.nvPublic.attributes = pub.attributes
        info.nvPublic.authPolicy.size = TPM2B.set(&info.nvPublic.authPolicy.buffer, pub.authPolicy)
        info.nvPublic.dataSize = pub.size
        var handle: ESYS_TR = 0
        let owner: ESYS_TR
        if let ownerSession { owner = ownerSession.tr } else { owner = try ownerAuthorization() }
        try call("NV_DefineSpace(0x\(Hex.encode(pub.index, digits: 1)))") {
            Esys_NV_DefineSpace(esys, KC_ESYS_TR_RH_OWNER, owner, Self.none, Self.none,
                                &authValue, &info, &handle)
        }
        return TPMHandle(tr: handle, mustFlush: false)
    }

    public func undefineNV(_ index: TPMHandle) throws(TPMError) {
        let owner = try ownerAuthorization()
        try call("NV_UndefineSpace") {
            Esys_NV_UndefineSpace(esys, KC_ESYS_TR_RH_OWNER, index.tr, owner, Self.none, Self.none)
        }
    }

    /// NV_Write authorized by `authHandle` (the owner or the index) with `session` (password if nil).
    public func writeNV(_ index: TPMHandle, data: [UInt8], offset: UInt16 = 0, authHandle: TPMHandle,
                        session: TPMHandle?) throws(TPMError) {
        var buffer = TPM2B_MAX_NV_BUFFER()
        buffer.size = TPM2B.set(&buffer.buffer, data)
        let auth: ESYS_TR
        if let session { auth = session.tr } else if authHandle == Self.owner { auth = try ownerAuthorization() } else { auth = Self.password }
        try call("NV_Write") {
            Esys_NV_Write(esys, authHandle.tr, index.tr, auth, Self.none, Self.none, &buffer, offset)
        }
    }

    /// NV_Read with the index's own (empty) authValue.
    public func readNV(_ index: TPMHandle, size: UInt16, offset: UInt16 = 0, session: TPMHandle? = nil) throws(TPMError) -> [UInt8] {
        var out: UnsafeMutablePointer<TPM2B_MAX_NV_BUFFER>?
        try call("NV_Read") {
            Esys_NV_Read(esys, index.tr, index.tr, session?.tr ?? Self.password, Self.none, Self.none, size, offset, &out)
        }
        defer { Esys_Free(out) }
        return TPM2B.bytes(out!.pointee.buffer, size: out!.pointee.size)
    }

    /// NV_ChangeAuth: `session` is a policy session satisfying the index's ADMIN policy, with `decryptCommand`.
    public func changeNVAuth(_ index: TPMHandle, to newAuth: SecureBytes?, session: TPMHandle) throws(TPMError) {
        var auth = TPM2B_AUTH()
        defer { TPM2B.wipe(&auth) }
        newAuth?.withUnsafeBytes { auth.size = TPM2B.set(&auth.buffer, $0) }
        try call("NV_ChangeAuth") { Esys_NV_ChangeAuth(esys, index.tr, session.tr, Self.none, Self.none, &auth) }
    }

    public func incrementNV(_ index: TPMHandle, session: TPMHandle) throws(TPMError) {
        try call("NV_Increment") { Esys_NV_Increment(esys, index.tr, index.tr, session.tr, Self.none, Self.none) }
    }

    // MARK: PCRs (Part 3, 22)

    /// Current SHA-256 values of the selected PCRs, in index order.
    public func readPCRs(_ selection: PCRSelection) throws(TPMError) -> [[UInt8]] {
        var values: [[UInt8]] = []
        // PCR_Read returns at most 8 digests per call: read one PCR at a time, simple and bounded.
        for index in selection.indices {
            var sel = Marshal.pcrSelection(PCRSelection([index]))
            var counter: UInt32 = 0
            var outSel: UnsafeMutablePointer<TPML_PCR_SELECTION>?
            var outValues: UnsafeMutablePointer<TPML_DIGEST>?
            try call("PCR_Read") { Esys_PCR_Read(esys, Self.none, Self.none, Self.none, &sel, &counter, &outSel, &outValues) }
            defer { Esys_Free(outSel); Esys_Free(outValues) }
            guard let outValues, outValues.pointee.count == 1 else {
                throw TPMError(command: "PCR_Read(\(index))", code: .value)
            }
            values.append(TPM2B.bytes(outValues.pointee.digests.0.buffer, size: outValues.pointee.digests.0.size))
        }
        return values
    }

    /// Extends a PCR with a SHA-256 digest (tests use it to change the device state).
    public func extendPCR(_ index: Int, digest: [UInt8]) throws(TPMError) {
        var digests = TPML_DIGEST_VALUES()
        digests.count = 1
        digests.digests.0.hashAlg = UInt16(TPM2_ALG_SHA256)
        withUnsafeMutableBytes(of: &digests.digests.0.digest) { $0.copyBytes(from: digest) }
        try call("PCR_Extend") { Esys_PCR_Extend(esys, ESYS_TR(index), Self.password, Self.none, Self.none, &digests) }
    }

    // MARK: Capabilities and dictionary-attack settings

    /// A TPM property (TPM_PT_*) from GetCapability.
    public func property(_ property: UInt32) throws(TPMError) -> UInt32 {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try call("GetCapability") {
            Esys_GetCapability(esys, Self.none, Self.none, Self.none, TPM2_CAP_TPM_PROPERTIES, property, 1, &more, &data)
        }
        defer { Esys_Free(data) }
        guard let data, data.pointee.data.tpmProperties.count >= 1,
              data.pointee.data.tpmProperties.tpmProperty.0.property == property else { return 0 }
        return data.pointee.data.tpmProperties.tpmProperty.0.value
    }

    /// Whether the TPM implements `command` (a TPM_CC): GetCapability(TPM_CAP_COMMANDS) from it, one entry.
    /// A TPM of spec revision 1.16 leaves out what it lacks (PolicyAuthorizeNV, CreateLoaded, …) and
    /// answers TPM_RC_COMMAND_CODE when sent it: asking first is the only way to know without sending it.
    public func implements(command: UInt32) throws(TPMError) -> Bool {
        var more: TPMI_YES_NO = 0
        var data: UnsafeMutablePointer<TPMS_CAPABILITY_DATA>?
        try call("GetCapability(commands)") {
            Esys_GetCapability(esys, Self.none, Self.none, Self.none, TPM2_CAP_COMMANDS, command, 1, &more, &data)
        }
        defer { Esys_Free(data) }
        guard let data, data.pointee.data.command.count >= 1 else { return false }
        // TPMA_CC (Part 2, 8.9): commandIndex in bits 0–15, V (a vendor command) in bit 29.
        let attributes = data.pointee.data.command.commandAttributes.0
        return attributes & 0xFFFF == command & 0xFFFF && attributes & 0x2000_0000 == 0
    }

    public static let propertyManufacturer: UInt32 = KC_PT_MANUFACTURER
    public static let propertyLockoutCounter: UInt32 = KC_PT_LOCKOUT_COUNTER
    public static let propertyMaxAuthFail: UInt32 = KC_PT_MAX_AUTH_FAIL

    /// Sets the TPM-wide dictionary-attack limits (needs the lockout authorization).
    public func setDictionaryAttackParameters(maxTries: UInt32, recoveryTime: UInt32, lockoutRecovery: UInt32) throws(TPMError) {
        try call("DictionaryAttackParameters") {
            Esys_DictionaryAttackParameters(esys, KC_ESYS_TR_RH_LOCKOUT, Self.password, Self.none, Self.none,
                                            maxTries, recoveryTime, lockoutRecovery)
        }
    }
}

/// Marshalling of the structures we store (Marshal.swift has the generic part).
extension Marshal {
    static func `public`(_ value: TPM2B_PUBLIC) throws(TPMError) -> [UInt8] {
        try encode("TPM2B_PUBLIC", value, Tss2_MU_TPM2B_PUBLIC_Marshal)
    }
    static func `private`(_ value: TPM2B_PRIVATE) throws(TPMError) -> [UInt8] {
        try encode("TPM2B_PRIVATE", value, Tss2_MU_TPM2B_PRIVATE_Marshal)
    }
    static func `public`(_ bytes: [UInt8]) throws(TPMError) -> TPM2B_PUBLIC {
        try decode("TPM2B_PUBLIC", bytes, as: TPM2B_PUBLIC(), Tss2_MU_TPM2B_PUBLIC_Unmarshal)
    }
    static func `private`(_ bytes: [UInt8]) throws(TPMError) -> TPM2B_PRIVATE {
        try decode("TPM2B_PRIVATE", bytes, as: TPM2B_PRIVATE(), Tss2_MU_TPM2B_PRIVATE_Unmarshal)
    }
    static func pcrSelection(_ selection: PCRSelection) -> TPML_PCR_SELECTION {
        var sel = TPML_PCR_SELECTION()
        sel.count = 1
        sel.pcrSelections.0.hash = UInt16(TPM2_ALG_SHA256)
        sel.pcrSelections.0.sizeofSelect = 3
        withUnsafeMutableBytes(of: &sel.pcrSelections.0.pcrSelect) { raw in
            for i in selection.indices where (0..<24).contains(i) { raw[i / 8] |= UInt8(1 << (i % 8)) }
        }
        return sel
    }
}
