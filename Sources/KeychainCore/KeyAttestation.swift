/// The AK's statement of one wrapping key (`attest key`, docs/formats.md): the key's public area and
/// stored policy, TPM2_CertifyCreation of it by the AK over the caller's nonce (the TPM made this
/// object, under this parent), and for a ThisDeviceOnly key TPM2_NV_Certify of the boot-state
/// approval index its policy names.
public struct KeyAttestation: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux key attestation"

    /// What the key is said to protect: the service (as the caller names it) and its items' protection.
    public struct Claim: Sendable, Hashable, Codable {
        public var service: String
        public var accessible: Accessible
        public var accessControl: AccessControl
        /// The item window the key's tag stores, for the access controls that take one.
        public var authValidity: Int?

        package init(service: String, accessible: Accessible, accessControl: AccessControl, authValidity: Int? = nil) {
            self.service = service
            self.accessible = accessible
            self.accessControl = accessControl
            self.authValidity = authValidity
        }
    }

    public var format: String
    public var version: Int
    public var claim: Claim
    public var attestationKeyName: String
    /// The caller's nonce, base64.
    public var nonce: String
    /// The sealed object's TPM2B_PUBLIC, base64.
    public var publicArea: String
    /// The policy the keychain stored beside the key (JSON, base64): what the verifier hashes.
    public var policy: String
    /// TPM2B_CREATION_DATA of the key, base64.
    public var creationData: String
    public var creationCertification: AttestationAnswer.Signed
    /// NV_Certify of the boot-state approval index, for a key whose policy names it.
    public var bootApprovalCertification: AttestationAnswer.Signed?

    package init(format: String, version: Int, claim: Claim, attestationKeyName: String, nonce: String, publicArea: String,
                 policy: String, creationData: String, creationCertification: AttestationAnswer.Signed,
                 bootApprovalCertification: AttestationAnswer.Signed? = nil) {
        self.format = format
        self.version = version
        self.claim = claim
        self.attestationKeyName = attestationKeyName
        self.nonce = nonce
        self.publicArea = publicArea
        self.policy = policy
        self.creationData = creationData
        self.creationCertification = creationCertification
        self.bootApprovalCertification = bootApprovalCertification
    }
}

/// What the verifier concluded of a key attestation (`attest verify-key`).
public struct KeyAttestationReport: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux key attestation report"
    public var format: String
    public var version: Int
    public var claim: KeyAttestation.Claim
    /// The key's TPM name, hex.
    public var keyName: String
    /// The key's authPolicy is the claimed protection's, and its attributes are those of that level.
    public var matchesClaim: Bool
    /// What the TPM enforces on the key, one condition each; empty when it does not match its claim.
    public var enforced: [String]
    /// The same in one sentence.
    public var statement: String
    /// Where the key is weaker (or other) than claimed; empty when it matches.
    public var differences: [String]
    /// For a key bound to the approved boot state: whether the approval index, as certified, approves
    /// the boot state quoted when the identity was verified.
    public var approvesVerifiedBootState: Bool?

    package init(format: String, version: Int, claim: KeyAttestation.Claim, keyName: String, matchesClaim: Bool,
                 enforced: [String], statement: String, differences: [String], approvesVerifiedBootState: Bool? = nil) {
        self.format = format
        self.version = version
        self.claim = claim
        self.keyName = keyName
        self.matchesClaim = matchesClaim
        self.enforced = enforced
        self.statement = statement
        self.differences = differences
        self.approvesVerifiedBootState = approvesVerifiedBootState
    }
}

/// The device's answer: the activated credential, a quote of its PCRs, the AK's certification of
/// its SRK and of the keychain's wrapping keys, and its NV_Certify of the boot-state approval index.
public struct AttestationAnswer: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux attestation answer"

    public struct Signed: Sendable, Hashable, Codable {
        /// TPMS_ATTEST as the TPM marshalled it, base64 (`tpm2_quote -m`).
        public var attest: String
        /// TPMT_SIGNATURE, base64 (`tpm2_quote -s`).
        public var signature: String

        package init(attest: String, signature: String) {
            self.attest = attest
            self.signature = signature
        }
    }

    /// One wrapping key of the store, as `attest key` gives it: the TPM made it under the SRK
    /// (TPM2_CertifyCreation by the AK over the challenge's nonce), with the policy stored beside it.
    public struct CertifiedKey: Sendable, Hashable, Codable {
        /// The service's name in the store (`uid:N/…` for a keychaind user's) and the storage tag
        /// ("<accessible>/<accessControl>[/<window>]"): the protection the key claims.
        public var service: String
        public var protection: String
        /// The sealed object's TPM2B_PUBLIC, its stored policy (JSON) and TPM2B_CREATION_DATA, base64.
        public var publicArea: String
        public var policy: String
        public var creationData: String
        public var creationCertification: Signed

        package init(service: String, protection: String, publicArea: String, policy: String, creationData: String,
                     creationCertification: Signed) {
            self.service = service
            self.protection = protection
            self.publicArea = publicArea
            self.policy = policy
            self.creationData = creationData
            self.creationCertification = creationCertification
        }
    }

    public var format: String
    public var version: Int
    /// The challenge's nonce, base64.
    public var nonce: String
    /// The credential ActivateCredential returned, base64.
    public var credential: String
    public var quote: Signed
    /// The quoted PCRs' SHA-256 values read after the quote, by index, hex.
    public var pcrValues: [String: String]
    public var storageRootKeyCertification: Signed
    /// Every wrapping key of the store the TPM holds and can certify (a token's keys, and keys
    /// sealed before key attestation, are not in it), sorted by service then protection. Absent from
    /// answers of keychains before it: such an answer is refused.
    public var wrappingKeys: [CertifiedKey]?
    /// NV_Certify of the whole boot-state approval index over the nonce; absent while the device
    /// has none (no ThisDeviceOnly key sealed yet).
    public var bootApprovalCertification: Signed?

    package init(format: String, version: Int, nonce: String, credential: String, quote: Signed,
                 pcrValues: [String: String], storageRootKeyCertification: Signed, wrappingKeys: [CertifiedKey]? = nil,
                 bootApprovalCertification: Signed? = nil) {
        self.format = format
        self.version = version
        self.nonce = nonce
        self.credential = credential
        self.quote = quote
        self.pcrValues = pcrValues
        self.storageRootKeyCertification = storageRootKeyCertification
        self.wrappingKeys = wrappingKeys
        self.bootApprovalCertification = bootApprovalCertification
    }
}
