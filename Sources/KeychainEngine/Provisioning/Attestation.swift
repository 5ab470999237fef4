import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

/// The EK templates a credential can be made for: `rsa2048` (L-1), `eccP256` (L-2), `eccP384` (H-3).
public typealias EndorsementKeyType = TPMContext.EndorsementKeyType

/// The documents of credential activation (docs/formats.md), format 1 each: the device's request,
/// the server's challenge and the state it keeps, the device's answer, and the verified identity.
public struct AttestationRequest: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux attestation request"

    public struct Key: Sendable, Hashable, Codable {
        /// Marshalled TPM2B_PUBLIC, base64.
        public var publicArea: String
        /// Its TPM name, hex.
        public var name: String
    }

    public var format: String
    public var version: Int
    /// The EK the credential is to be made for, with its certificate when the TPM holds one: the RSA
    /// EK (template L-1) the AK was made under, or an ECC EK (L-2, H-3) of the same TPM
    /// (`attest request --endorsement-key`); its `type` names which.
    public var endorsementKey: DeviceIdentity.EndorsementKey
    /// The AK: a restricted signing key, child of that EK.
    public var attestationKey: Key
    /// The keychain's SRK, whose certification by the AK the answer carries.
    public var storageRootKey: DeviceIdentity.PersistentKey
    /// The keychain's PCR selection (the SHA-256 bank), which the answer quotes.
    public var pcrs: [Int]
    /// The keychain's NV indices by role, as in the identity: what a bundle's policy names (`seal-for`
    /// with the verified identity). Absent from the first requests.
    public var nvIndices: [String: DeviceIdentity.NVIndex]?
}

/// What the device receives: TPM2_MakeCredential's output for its EK and AK, and a nonce.
public struct AttestationChallenge: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux attestation challenge"
    public var format: String
    public var version: Int
    /// The AK the credential was made for (hex name): the device answers with that key only.
    public var attestationKeyName: String
    /// The type of the EK the secret is sealed to (`rsa2048`, `eccP256`, `eccP384`): the device
    /// activates the credential with that EK. Absent from the first challenges: `rsa2048`.
    public var endorsementKey: String?
    /// TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET, base64 (`tpm2_activatecredential`'s credential blob, split).
    public var credentialBlob: String
    public var secret: String
    /// 32 random bytes, base64: the quote's and the certification's qualifying data.
    public var nonce: String
}

/// What the server keeps between challenge and answer (a file of its own, 0600): the request, the
/// credential the device must give back, and the nonce. Secret: whoever reads it can answer.
public struct AttestationState: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux attestation state"
    public var format: String
    public var version: Int
    public var request: AttestationRequest
    /// The credential, base64 (32 random bytes).
    public var credential: String
    public var nonce: String
    public var created: Date
}

/// What the server proved (format 1): this EK's TPM holds this AK and this SRK (fixedTPM and
/// fixedParent) and was in this boot state when it answered this server's challenge.
public struct VerifiedIdentity: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux verified identity"

    public struct BootState: Sendable, Hashable, Codable {
        public var bank: String
        public var pcrs: [Int]
        /// The quoted values, by index, hex, and SHA-256 over them in index order (the quote's digest).
        public var values: [String: String]
        public var digest: String
        /// TPM2_Startup(CLEAR) count at the quote: a later quote with another one came after a reboot.
        public var resetCount: UInt32
        public var restartCount: UInt32
    }

    public var format: String
    public var version: Int
    public var verified: Date
    public var endorsementKey: DeviceIdentity.EndorsementKey
    /// `true` when the EK certificate chained to the `--ek-ca` given to the verifier; `false` when no CA was given.
    public var endorsementCertificateVerified: Bool
    public var attestationKey: AttestationRequest.Key
    /// Certified by the AK, and fixedTPM/fixedParent in its public area.
    public var storageRootKey: DeviceIdentity.PersistentKey
    public var bootState: BootState
    /// The request's NV indices by role (as the device reported them), for `seal-for`.
    public var nvIndices: [String: DeviceIdentity.NVIndex]?

    /// What the certified approval index says of the quoted boot state.
    public struct BootApproval: Sendable, Hashable, Codable {
        public var index: String
        /// The index's name (its attributes and write policy, written): the keychain's own layout.
        public var name: String
        /// The index holds PolicyPCR of the quoted PCRs with the quoted values.
        public var approvesQuotedBootState: Bool
        public var statement: String
    }

    /// The answer's wrapping keys, each as `attest verify-key` reports one (what the TPM enforces on
    /// it, or how it differs from the protection its storage tag claims). Absent from identities
    /// verified before answers carried them.
    public var wrappingKeys: [KeyAttestationReport]?
    /// The approval index as the TPM certified it; nil when the device has none yet.
    public var bootApproval: BootApproval?
}

// MARK: Reading and writing

/// The one reader of the attestation documents: JSON of the right format and version, or a clear error.
public protocol AttestationDocument: Codable {
    static var formatName: String { get }
    /// The largest document read.
    static var maxLength: Int { get }
    var format: String { get }
    var version: Int { get }
}

extension AttestationRequest: AttestationDocument {}
extension AttestationChallenge: AttestationDocument {}
extension AttestationState: AttestationDocument {}
extension AttestationAnswer: AttestationDocument {
    /// About 2 KiB per wrapping key: a store of a few hundred keys.
    public static var maxLength: Int { 1 << 20 }
}
extension VerifiedIdentity: AttestationDocument {
    public static var maxLength: Int { 1 << 20 }
}

extension AttestationDocument {
    public static var currentVersion: Int { 1 }
    /// A request with an EK certificate is about 4 KiB.
    public static var maxLength: Int { 64 << 10 }

    /// - Throws: `DATA_CORRUPTED` for what is not this document (or is larger than one can be),
    ///   `UNSUPPORTED` for another version.
    public init(json: Data) throws(KeychainError) {
        let what = Self.formatName.replacing("keychain-linux ", with: "")
        guard json.count <= Self.maxLength else { throw KeychainError(.dataCorrupted, "This is not an \(what): larger than \(Self.maxLength) bytes") }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        let decoded: Self
        do { decoded = try decoder.decode(Self.self, from: json) } catch {
            throw KeychainError(.dataCorrupted, "This is not an \(what) document: \(error)")
        }
        guard decoded.format == Self.formatName else { throw KeychainError(.dataCorrupted, "This is not an \(what) document (format '\(decoded.format)')") }
        guard decoded.version == Self.currentVersion else {
            throw KeychainError(.unsupported, "This \(what) is in version \(decoded.version); this keychain reads version \(Self.currentVersion)")
        }
        self = decoded
    }

    /// The document as written: sorted keys, ISO 8601 dates.
    public func json() -> Data { ProvisioningJSON.document(self) }
}

/// Base64 of a field, or DATA_CORRUPTED naming it.
func decoded(_ base64: String, _ field: String, count: Int? = nil) throws(KeychainError) -> [UInt8] {
    guard let data = Data(base64Encoded: base64), count.map({ data.count == $0 }) ?? true else {
        throw KeychainError(.dataCorrupted, "The \(field) is not base64\(count.map { " of \($0) bytes" } ?? "")")
    }
    return [UInt8](data)
}

// MARK: The server (no TPM)

/// Credential activation on a server with no TPM (docs/provisioning.md): a challenge for a
/// device's request, and the verification of its answer into a `VerifiedIdentity`.
public enum AttestationServer {
    /// The checks a request passes before a challenge is made for it: the public areas parse and
    /// match their names, the AK is a restricted fixedTPM signing key.
    static func check(_ request: AttestationRequest) throws(KeychainError) -> (ek: [UInt8], ak: [UInt8], srk: [UInt8]) {
        let ek = try decoded(request.endorsementKey.publicArea, "EK public area")
        let ak = try decoded(request.attestationKey.publicArea, "AK public area")
        let srk = try decoded(request.storageRootKey.publicArea, "SRK public area")
        for (area, name, what) in [(ek, request.endorsementKey.name, "EK"), (ak, request.attestationKey.name, "AK"),
                                   (srk, request.storageRootKey.name, "SRK")] where DeviceIdentity.name(ofPublic: area) != name {
            throw KeychainError(.dataCorrupted, "The request's \(what) does not match its name")
        }
        guard let type = TPMContext.EndorsementKeyType(rawValue: request.endorsementKey.type) else {
            throw KeychainError(.unsupported, "The request's EK is \(request.endorsementKey.type): credentials are made for the "
                                + "EK templates L-1 (rsa2048), L-2 (eccP256) and H-3 (eccP384)")
        }
        guard TPMContext.isEndorsementKey(type, publicArea: ek) else {
            throw KeychainError(.dataCorrupted, "The request's EK is not an \(type.description) with its template's attributes and policy")
        }
        do { _ = try Attestation.checkAttestationKey(ak) } catch { throw KeychainError(.dataCorrupted, "The request's \(error.description)") }
        // The certification proves the SRK's name, not its handle: only the keychain's own is taken.
        guard request.storageRootKey.handle == hexHandle(TPMKeyring.srkHandle) else {
            throw KeychainError(.dataCorrupted, "The request's SRK handle is \(request.storageRootKey.handle.prefix(16)), not the keychain's \(hexHandle(TPMKeyring.srkHandle))")
        }
        guard !request.pcrs.isEmpty, request.pcrs.allSatisfy({ (0..<24).contains($0) }), request.pcrs == PCRSelection(request.pcrs).indices else {
            throw KeychainError(.dataCorrupted, "The request's PCR selection is not sorted PCR indices 0-23")
        }
        return (ek, ak, srk)
    }

    /// A challenge for `request`, and the state the server keeps until the answer.
    /// - Throws: `DATA_CORRUPTED` for a malformed request, `UNSUPPORTED` for an EK that is not RSA 2048.
    public static func challenge(for request: AttestationRequest) throws(KeychainError) -> (challenge: AttestationChallenge, state: AttestationState) {
        let (ek, _, _) = try check(request)
        let credential = SecureBytes(random: 32)
        let nonce = Sodium.randomBytes(32)
        let made: (credentialBlob: [UInt8], secret: [UInt8])
        do {
            made = try Attestation.makeCredential(credential, objectName: hexBytes(request.attestationKey.name), endorsementPublic: ek)
        } catch {
            throw KeychainError(.dataCorrupted, "Cannot make a credential for this request: \(error.description)")
        }
        let challenge = AttestationChallenge(format: AttestationChallenge.formatName, version: 1,
                                             attestationKeyName: request.attestationKey.name, endorsementKey: request.endorsementKey.type,
                                             credentialBlob: Data(made.credentialBlob).base64EncodedString(),
                                             secret: Data(made.secret).base64EncodedString(), nonce: Data(nonce).base64EncodedString())
        let state = AttestationState(format: AttestationState.formatName, version: 1, request: request,
                                     credential: credential.withUnsafeBytes { Data($0).base64EncodedString() },
                                     nonce: challenge.nonce, created: Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down)))
        return (challenge, state)
    }

    /// Verifies `answer` against the challenge whose `state` the server kept. This only checks: a
    /// verifier spends the challenge after (`AttestationLedger.spend`, as `attest verify` does), or a
    /// kept copy of `state` verifies the same answer again.
    /// - Parameters:
    ///   - ekCA: the TPM maker's CA (PEM); nil leaves the EK uncertified (said in the result).
    ///   - expectedBootState: the boot state the device must be in (an earlier verified identity's,
    ///     from a known-good boot); nil reports the quoted values without judging them.
    /// - Throws: `AUTHENTICATION_FAILED` naming the first check that fails, `DATA_CORRUPTED` for a malformed answer.
    public static func verify(_ answer: AttestationAnswer, state: AttestationState, ekCA: [UInt8]?,
                              expectedBootState: VerifiedIdentity.BootState? = nil) throws(KeychainError) -> VerifiedIdentity {
        let request = state.request
        let (ek, ak, srk) = try check(request)
        let refuse = refusal
        let nonce = try checkCredential(answer, state: state)
        let certified = try checkEndorsementCertificate(request, ek: ek, ekCA: ekCA)
        let signedQuote = try signed(answer.quote, "quote")
        let signedCertification = try signed(answer.storageRootKeyCertification, "SRK certification")
        let quote: Attestation.Quote, certification: Attestation.Certification
        do throws(AttestationError) {
            quote = try Attestation.verifyQuote(signedQuote, akPublic: ak)
            certification = try Attestation.verifyCertification(signedCertification, akPublic: ak)
        } catch {
            throw refuse(error.description)
        }
        guard quote.nonce == nonce, certification.nonce == nonce else { throw refuse("a signed statement is over another nonce") }
        try checkBootState(quote, answer: answer, request: request, expected: expectedBootState)
        guard certification.name == hexBytes(request.storageRootKey.name) else { throw refuse("the certified key is not the request's SRK") }
        let fixed: Bool
        do { fixed = try Attestation.isFixedToItsTPM(srk) } catch { throw refuse(error.description) }
        guard fixed else { throw refuse("the certified SRK is not fixedTPM and fixedParent: it could leave its TPM") }
        guard let keys = answer.wrappingKeys else {
            throw refuse("it carries no certification of the keychain's wrapping keys (a keychain older than this verifier answered: update the device's)")
        }
        var identity = VerifiedIdentity(
            format: VerifiedIdentity.formatName, version: 1, verified: Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down)),
            endorsementKey: request.endorsementKey, endorsementCertificateVerified: certified,
            attestationKey: request.attestationKey, storageRootKey: request.storageRootKey,
            bootState: .init(bank: "sha256", pcrs: quote.pcrs, values: answer.pcrValues, digest: Hex.encode(quote.pcrDigest),
                             resetCount: quote.resetCount, restartCount: quote.restartCount),
            nvIndices: request.nvIndices)
        if let signedApproval = answer.bootApprovalCertification {
            let approves = try approvalApprovesBootState(signedApproval, akPublic: ak, nonce: nonce, bootState: identity.bootState, refuse: refuse)
            let list = quote.pcrs.map(String.init).joined(separator: ",")
            identity.bootApproval = .init(
                index: hexHandle(BootApprovalLayout.index), name: Hex.encode(BootApprovalLayout.name), approvesQuotedBootState: approves,
                statement: approves ? "the approval index approves the quoted boot state (PCRs \(list)): ThisDeviceOnly items open in it"
                    : "the approval index does not approve the quoted boot state (PCRs \(list)): ThisDeviceOnly items do not open "
                        + "until it is approved (keychainctl boot-state approve)")
        }
        identity.wrappingKeys = try wrappingKeyReports(keys, answer: answer, state: state, identity: identity, nonce: nonce)
        return identity
    }

    private static func refusal(_ why: String) -> KeychainError {
        KeychainError(.authenticationFailed, "The answer does not verify: \(why)")
    }

    /// The answer is to this challenge, with the credential made for this EK and AK: the challenge's nonce.
    private static func checkCredential(_ answer: AttestationAnswer, state: AttestationState) throws(KeychainError) -> [UInt8] {
        guard answer.nonce == state.nonce else { throw refusal("it answers another challenge (another nonce: replayed or stale)") }
        let nonce = try decoded(state.nonce, "state's nonce", count: 32)
        let expected = try decoded(state.credential, "state's credential", count: 32)
        let given = try decoded(answer.credential, "answer's credential")
        guard given.count == expected.count, zip(given, expected).reduce(0, { $0 | ($1.0 ^ $1.1) }) == 0 else {
            throw refusal("the credential is not the one made for this EK and AK (activated in another TPM, or for another key)")
        }
        return nonce
    }

    /// Whether the EK's certificate chains to `ekCA` (false when no CA is given).
    private static func checkEndorsementCertificate(_ request: AttestationRequest, ek: [UInt8],
                                                    ekCA: [UInt8]?) throws(KeychainError) -> Bool {
        guard let ekCA else { return false }
        let type = TPMContext.EndorsementKeyType(rawValue: request.endorsementKey.type) ?? .rsa2048
        guard let certificate = request.endorsementKey.certificate.flatMap({ Data(base64Encoded: $0) }) else {
            throw refusal("the request carries no certificate of the \(type.description) to check against the CA: the TPM's maker "
                          + "certified none (a TPM may hold another EK's: ask for a request with --endorsement-key "
                          + "naming the certified one); verify without --ek-ca to enrol its EK as uncertified")
        }
        do { try EndorsementCertificate.verify(der: [UInt8](certificate), caPEM: ekCA, endorsementPublic: ek) } catch {
            throw refusal(error.description)
        }
        return true
    }

    /// The answer's PCR values are the quoted ones, and those of `expected` when one is given.
    private static func checkBootState(_ quote: Attestation.Quote, answer: AttestationAnswer, request: AttestationRequest,
                                       expected: VerifiedIdentity.BootState?) throws(KeychainError) {
        let refuse = refusal
        guard quote.pcrs == request.pcrs else { throw refuse("the quote covers PCRs \(quote.pcrs), the request \(request.pcrs)") }
        guard Set(answer.pcrValues.keys) == Set(request.pcrs.map(String.init)) else { throw refuse("the PCR values are not those of the quoted PCRs") }
        var values: [UInt8] = []
        for pcr in request.pcrs {
            let value = hexBytes(answer.pcrValues[String(pcr)] ?? "")
            guard value.count == 32 else { throw KeychainError(.dataCorrupted, "PCR \(pcr)'s value is not 32 bytes of hex") }
            values += value
        }
        guard sha256(values) == quote.pcrDigest else { throw refuse("the PCR values are not the ones the TPM quoted") }
        if let expected {
            guard expected.pcrs == quote.pcrs else { throw refuse("the quote covers PCRs \(quote.pcrs), the expected boot state \(expected.pcrs)") }
            let changed = quote.pcrs.filter { answer.pcrValues[String($0)] != expected.values[String($0)] }
            guard changed.isEmpty else {
                throw refuse("the TPM is in another boot state: " + changed.map {
                    "PCR \($0) is \(answer.pcrValues[String($0)] ?? "") (expected \(expected.values[String($0)] ?? "none"))"
                }.joined(separator: "; "))
            }
        }
    }

    /// Each key as `attest verify-key` checks one: the AK's signature over this nonce, the TPM made
    /// it under the SRK just certified, fixedTPM and fixedParent for a ThisDeviceOnly tag, and what
    /// its policy enforces against the protection its tag claims.
    private static func wrappingKeyReports(_ keys: [AttestationAnswer.CertifiedKey], answer: AttestationAnswer,
                                           state: AttestationState, identity: VerifiedIdentity,
                                           nonce: [UInt8]) throws(KeychainError) -> [KeyAttestationReport] {
        var reports: [KeyAttestationReport] = []
        for key in keys {
            let what = "the wrapping key of '\(key.service)' (\(key.protection))"
            guard let protection = ItemProtection(storageTag: key.protection) else {
                throw KeychainError(.dataCorrupted, "The answer's \(what.dropFirst(4)) names no protection this keychain knows")
            }
            let attestation = KeyAttestation(
                format: KeyAttestation.formatName, version: 1,
                claim: .init(service: key.service, accessible: protection.accessible, accessControl: protection.accessControl,
                             authValidity: protection.accessControl.takesWindow ? ItemProtection.storedWindow(ofTag: key.protection) : nil),
                attestationKeyName: state.request.attestationKey.name, nonce: state.nonce, publicArea: key.publicArea, policy: key.policy,
                creationData: key.creationData, creationCertification: key.creationCertification,
                bootApprovalCertification: answer.bootApprovalCertification)
            do { reports.append(try verifyKey(attestation, identity: identity, nonce: nonce)) } catch where error.code == .authenticationFailed {
                throw refusal(what + ": " + error.message.replacing("The key attestation does not verify: ", with: ""))
            }
        }
        return reports
    }

    /// Whether the approval index, as the AK certified it over `nonce`, approves `bootState`
    /// (PolicyPCR of its PCRs with its values).
    /// - Throws: `refuse`'s error when the certification does not verify or is not of the keychain's index.
    static func approvalApprovesBootState(_ signedApproval: AttestationAnswer.Signed, akPublic: [UInt8], nonce: [UInt8],
                                          bootState: VerifiedIdentity.BootState,
                                          refuse: (String) -> KeychainError) throws(KeychainError) -> Bool {
        let approval = try signed(signedApproval, "approval certification")
        let nv: Attestation.NVCertification
        do throws(AttestationError) { nv = try Attestation.verifyNVCertification(approval, akPublic: akPublic) }
        catch { throw refuse(error.description) }
        guard nv.nonce == nonce else { throw refuse("the approval index's certification is over another nonce") }
        guard nv.indexName == BootApprovalLayout.name, nv.offset == 0 else {
            throw refuse("the certified index is not the keychain's boot-state approval index (another public area or policy)")
        }
        let quoted = bootState.pcrs.flatMap { hexBytes(bootState.values[String($0)] ?? "") }
        return nv.contents == BootApprovalLayout.contents(BootApprovalLayout.approvedPolicy(selection: bootState.pcrs, pcrDigest: sha256(quoted)))
    }

    static func signed(_ s: AttestationAnswer.Signed, _ what: String) throws(KeychainError) -> TPMContext.SignedAttestation {
        TPMContext.SignedAttestation(attest: try decoded(s.attest, "\(what)'s statement"), signature: try decoded(s.signature, "\(what)'s signature"))
    }
}

/// Bytes of a hex string; empty for one that is not hex.
func hexBytes(_ text: String) -> [UInt8] {
    Hex.decode(text.utf8) ?? []
}
