internal import CP11Kit

/// A PKCS#11 mechanism (`CK_MECHANISM_TYPE`), named as the spec names it.
public struct Mechanism: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt
    public init(rawValue: UInt) { self.rawValue = rawValue }

    public static let aesKeyGen = Self(rawValue: CKM_AES_KEY_GEN)
    public static let aesGCM = Self(rawValue: CKM_AES_GCM)
    public static let rsaKeyPairGen = Self(rawValue: CKM_RSA_PKCS_KEY_PAIR_GEN)
    public static let rsaOAEP = Self(rawValue: CKM_RSA_PKCS_OAEP)
    public static let ecKeyPairGen = Self(rawValue: CKM_EC_KEY_PAIR_GEN)
    public static let ecdh1Derive = Self(rawValue: CKM_ECDH1_DERIVE)

    public var description: String {
        switch self {
        case .aesKeyGen: "CKM_AES_KEY_GEN"
        case .aesGCM: "CKM_AES_GCM"
        case .rsaKeyPairGen: "CKM_RSA_PKCS_KEY_PAIR_GEN"
        case .rsaOAEP: "CKM_RSA_PKCS_OAEP"
        case .ecKeyPairGen: "CKM_EC_KEY_PAIR_GEN"
        case .ecdh1Derive: "CKM_ECDH1_DERIVE"
        default: "CKM_" + hex(rawValue)
        }
    }
}

/// What a token says it can do with one mechanism (`CK_MECHANISM_INFO`).
public struct MechanismInfo: Sendable, Hashable {
    /// In bits for RSA and EC, in bytes for AES (as PKCS#11 2.40 §2.8, §2.3 and §2.12 define them).
    public let minimumKeySize: UInt
    public let maximumKeySize: UInt
    public let flags: Flags

    public struct Flags: OptionSet, Sendable, Hashable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let hardware = Flags(rawValue: CKF_HW)
        public static let encrypt = Flags(rawValue: CKF_ENCRYPT)
        public static let decrypt = Flags(rawValue: CKF_DECRYPT)
        public static let generate = Flags(rawValue: CKF_GENERATE)
        public static let generateKeyPair = Flags(rawValue: CKF_GENERATE_KEY_PAIR)
        public static let derive = Flags(rawValue: CKF_DERIVE)
        public static let ecNamedCurve = Flags(rawValue: CKF_EC_NAMEDCURVE)
        public static let ecUncompressed = Flags(rawValue: CKF_EC_UNCOMPRESS)
    }

    public init(minimumKeySize: UInt, maximumKeySize: UInt, flags: Flags) {
        self.minimumKeySize = minimumKeySize
        self.maximumKeySize = maximumKeySize
        self.flags = flags
    }

    init(_ info: CK_MECHANISM_INFO) {
        self.init(minimumKeySize: info.ulMinKeySize, maximumKeySize: info.ulMaxKeySize, flags: Flags(rawValue: info.flags))
    }
}

/// How a token keeps a storage's data keys: the one scheme a token gets, chosen from what it offers.
public enum WrappingScheme: String, Sendable, CaseIterable, CustomStringConvertible {
    /// An AES-256 key on the token; each data key encrypted by `CKM_AES_GCM` on the token.
    case aesGCM = "AES-GCM"
    /// An RSA-2048 key pair on the token; per seal a random key-encryption key, encrypted by
    /// `CKM_RSA_PKCS_OAEP` on the token and decrypted only there, seals the data key (XChaCha20-Poly1305).
    case rsaOAEP = "RSA-OAEP"
    /// A P-256 key pair on the token; per seal an ephemeral P-256 pair made on the token as a session
    /// object, `CKM_ECDH1_DERIVE` with the static public key, BLAKE2b over the shared secret and both
    /// points as the key-encryption key. A read derives the same secret with the static private key.
    case ecdhP256 = "ECDH-P256"

    public var description: String { rawValue }

    /// The RSA key size we generate, in bits.
    static let rsaBits: UInt = 2048
    static let aesKeyBytes: UInt = 32
    static let ecBits: UInt = 256

    /// Each scheme's mechanisms with the flags and key size it needs, in order of preference.
    var requirements: [(mechanism: Mechanism, flags: MechanismInfo.Flags, keySize: UInt)] {
        switch self {
        case .aesGCM: [(.aesKeyGen, .generate, Self.aesKeyBytes), (.aesGCM, [.encrypt, .decrypt], Self.aesKeyBytes)]
        case .rsaOAEP: [(.rsaKeyPairGen, .generateKeyPair, Self.rsaBits), (.rsaOAEP, [.encrypt, .decrypt], Self.rsaBits)]
        case .ecdhP256: [(.ecKeyPairGen, .generateKeyPair, Self.ecBits), (.ecdh1Derive, .derive, Self.ecBits)]
        }
    }
}

/// The mechanisms a token offers (`C_GetMechanismList`, `C_GetMechanismInfo`) and its flags, read
/// before anything is made on it.
public struct TokenCapabilities: Sendable {
    public let mechanisms: [Mechanism: MechanismInfo]
    public let tokenFlags: TokenInfo.Flags

    public init(mechanisms: [Mechanism: MechanismInfo], tokenFlags: TokenInfo.Flags) {
        self.mechanisms = mechanisms
        self.tokenFlags = tokenFlags
    }

    /// What keeps `scheme` from working on this token: "CKM_AES_GCM (absent)", "CKM_RSA_PKCS_OAEP
    /// (no decrypt)", "CKM_RSA_PKCS_KEY_PAIR_GEN (keys of 512…1024, 2048 needed)". Empty when it works.
    public func missing(for scheme: WrappingScheme) -> [String] {
        var missing: [String] = []
        if tokenFlags.contains(.writeProtected) { missing.append("a writable token (it is write-protected)") }
        for (mechanism, flags, size) in scheme.requirements {
            guard let info = mechanisms[mechanism] else {
                missing.append("\(mechanism) (absent)")
                continue
            }
            let lacking = [(MechanismInfo.Flags.encrypt, "encrypt"), (.decrypt, "decrypt"), (.generate, "generate"),
                           (.generateKeyPair, "generate key pair"), (.derive, "derive")]
                .filter { flags.contains($0.0) && !info.flags.contains($0.0) }.map(\.1)
            if !lacking.isEmpty { missing.append("\(mechanism) (no \(lacking.joined(separator: ", ")))") }
            // A token that reports no sizes (0, 0) sets no limit.
            if info.maximumKeySize != 0, size < info.minimumKeySize || size > info.maximumKeySize {
                missing.append("\(mechanism) (keys of \(info.minimumKeySize)…\(info.maximumKeySize), \(size) needed)")
            }
        }
        // EC flags are optional (PKCS#11 2.40 §2.3): a token that sets some and not named curves can't take P-256 by OID.
        // CKF_EC_F_2M (1 << 21) and CKF_EC_ECPARAMETERS (1 << 22) are missing from p11-kit 0.24's header.
        let ecFlags = UInt(CKF_EC_F_P | 1 << 21 | 1 << 22 | CKF_EC_NAMEDCURVE | CKF_EC_UNCOMPRESS | CKF_EC_COMPRESS)
        if scheme == .ecdhP256, let info = mechanisms[.ecKeyPairGen], info.flags.rawValue & ecFlags != 0,
           !info.flags.contains(.ecNamedCurve) {
            missing.append("\(Mechanism.ecKeyPairGen) (no named curves)")
        }
        return missing
    }

    /// The first scheme the token can do: AES-GCM, else RSA-OAEP, else ECDH P-256.
    public var preferredScheme: WrappingScheme? {
        WrappingScheme.allCases.first { missing(for: $0).isEmpty }
    }

    /// A `CKR_MECHANISM_INVALID` error naming what each scheme lacks; for a token with no scheme.
    func noSchemeError(token: String) -> PKCS11Error {
        let reasons = WrappingScheme.allCases.map { "\($0) needs \(missing(for: $0).joined(separator: ", "))" }
        return PKCS11Error(rv: CKR_MECHANISM_INVALID, operation: "choose how token '\(token)' keeps data keys",
                           detail: reasons.joined(separator: "; "))
    }
}

extension PKCS11Token {
    /// What the token offers for the three wrapping schemes, read from the token (nothing made on it).
    public func capabilities() throws(PKCS11Error) -> TokenCapabilities {
        let flags = try info().flags
        let offered = Set(try module.mechanisms(slotID).map { Mechanism(rawValue: $0) })
        var mechanisms: [Mechanism: MechanismInfo] = [:]
        for scheme in WrappingScheme.allCases {
            for (mechanism, _, _) in scheme.requirements where offered.contains(mechanism) {
                mechanisms[mechanism] = MechanismInfo(try module.mechanismInfo(slotID, mechanism.rawValue))
            }
        }
        return TokenCapabilities(mechanisms: mechanisms, tokenFlags: flags)
    }

    /// The scheme a new wrapping key gets on this token; `CKR_MECHANISM_INVALID` naming what each
    /// scheme lacks when the token offers none. Makes nothing on the token.
    public func preferredScheme() throws(PKCS11Error) -> WrappingScheme {
        let capabilities = try capabilities()
        guard let scheme = capabilities.preferredScheme else {
            throw capabilities.noSchemeError(token: (try? info().label) ?? uri.token ?? "")
        }
        return scheme
    }
}
