internal import CSodium

/// SHA-256, the name and policy hash of everything this library creates.
public func sha256(_ parts: [UInt8]...) -> [UInt8] {
    var state = crypto_hash_sha256_state()
    crypto_hash_sha256_init(&state)
    for part in parts { crypto_hash_sha256_update(&state, part, UInt64(part.count)) }
    var out = [UInt8](repeating: 0, count: 32)
    crypto_hash_sha256_final(&state, &out)
    return out
}

/// Big-endian encodings used by TPM marshalling (and by the keychain's stored fields).
extension FixedWidthInteger {
    public var bigEndianBytes: [UInt8] { withUnsafeBytes(of: self.bigEndian) { Array($0) } }
    public init?(bigEndianBytes bytes: [UInt8]) {
        guard bytes.count == MemoryLayout<Self>.size else { return nil }
        self = bytes.reduce(0) { $0 << 8 | Self($1) }
    }
}

/// A selection of SHA-256 PCRs.
public struct PCRSelection: Sendable, Hashable, Codable {
    public var indices: [Int]
    public init(_ indices: [Int]) { self.indices = Array(Set(indices)).sorted() }

    /// TPML_PCR_SELECTION with one SHA-256 bank (Part 2, 10.9.7).
    public var marshalled: [UInt8] {
        var bitmap = [UInt8](repeating: 0, count: 3)
        for i in indices where (0..<24).contains(i) { bitmap[i / 8] |= 1 << (i % 8) }
        return UInt32(1).bigEndianBytes + UInt16(0x000B).bigEndianBytes + [3] + bitmap
    }
}

/// Comparison of PolicyNV (TPM_EO).
public enum NVComparison: UInt16, Sendable, Hashable, Codable {
    case equal = 0x0000
    case unsignedGreaterOrEqual = 0x0007
    /// Every bit set in the operand is clear in the index (a bit field's revoked generations).
    case bitClear = 0x000B
}

/// One assertion of a policy, as data: it extends an offline digest and can be run on a session.
///
/// Digest rules are TPM 2.0 Part 3, section 23 (each command's "policyDigest_new" formula).
public enum PolicyStep: Sendable, Hashable {
    /// The PCRs in `selection` must hash to `digest` (SHA-256 of their concatenated values).
    case pcr(selection: PCRSelection, digest: [UInt8])
    /// The NV index's bytes at `offset` compare to `operand`.
    case nv(index: UInt32, name: [UInt8], operand: [UInt8], offset: UInt16, comparison: NVComparison)
    /// Someone proved knowledge of the authValue of the entity with this name (a PIN index).
    case secret(index: UInt32, name: [UInt8], policyRef: [UInt8])
    /// A signature by the key with this name over the session nonce and `policyRef` (the reader).
    case signed(keyName: [UInt8], policyRef: [UInt8])
    case commandCode(UInt32)
    case cpHash([UInt8])
    case authValue
    /// Any one of the branches, by their digests.
    case or([[UInt8]])
    /// Any one of the branches, as steps (the access-control branch: PolicySigned or PolicySecret):
    /// each branch extends the digest before this step; two or more are joined by PolicyOR of those
    /// digests, one alone is its own steps. A session runs the branch its caller chooses (`run`'s
    /// `branch`), then the PolicyOR.
    indirect case anyOf([[PolicyStep]])
    /// PolicyAuthorizeNV (Part 3, 23.22): the steps before it must leave the digest the NV index at
    /// `index` (named `name`) holds; then the digest restarts from this step alone. `approving` are the
    /// steps a session runs first: they are not part of this step's digest (the index holds theirs).
    indirect case authorizeNV(index: UInt32, name: [UInt8], approving: [PolicyStep])
    /// PolicyAuthorize (Part 3, 23.16): a policy signed by the key with this name for `policyRef`. The
    /// approved policy, its steps and the signature's ticket are the caller's (`run`'s `other`).
    case authorize(keyName: [UInt8], policyRef: [UInt8])

    public func extend(_ digest: [UInt8]) -> [UInt8] {
        switch self {
        case .pcr(let selection, let pcrDigest):
            return sha256(digest, CommandCode.policyPCR.bigEndianBytes, selection.marshalled, pcrDigest)
        case .nv(_, let name, let operand, let offset, let comparison):
            let args = sha256(operand, offset.bigEndianBytes, comparison.rawValue.bigEndianBytes)
            return sha256(digest, CommandCode.policyNV.bigEndianBytes, args, name)
        case .secret(_, let name, let policyRef):
            let first = sha256(digest, CommandCode.policySecret.bigEndianBytes, name)
            return sha256(first, policyRef)
        case .signed(let keyName, let policyRef):
            return sha256(sha256(digest, CommandCode.policySigned.bigEndianBytes, keyName), policyRef)
        case .commandCode(let code):
            return sha256(digest, CommandCode.policyCommandCode.bigEndianBytes, code.bigEndianBytes)
        case .cpHash(let cpHash):
            return sha256(digest, CommandCode.policyCpHash.bigEndianBytes, cpHash)
        case .authValue:
            return sha256(digest, CommandCode.policyAuthValue.bigEndianBytes)
        case .or(let branches):
            return sha256([UInt8](repeating: 0, count: 32), CommandCode.policyOR.bigEndianBytes, branches.flatMap { $0 })
        case .anyOf(let branches):
            let digests = PolicyStep.branchDigests(branches, after: digest)
            return digests.count == 1 ? digests[0] : PolicyStep.or(digests).extend(digest)
        case .authorize(let keyName, let policyRef):
            return PolicyStep.authorizeDigest(keyName: keyName, policyRef: policyRef)
        case .authorizeNV(_, let name, _):
            return sha256([UInt8](repeating: 0, count: 32), CommandCode.policyAuthorizeNV.bigEndianBytes, name)
        }
    }
}

extension PolicyStep {
    /// The digest each branch of an `anyOf` ends with, from `digest` (the steps before it).
    public static func branchDigests(_ branches: [[PolicyStep]], after digest: [UInt8]) -> [[UInt8]] {
        branches.map { $0.reduce(digest) { $1.extend($0) } }
    }
}

/// The offline policy calculator: the digest a trial session would end with.
public enum PolicyDigest {
    public static let empty = [UInt8](repeating: 0, count: 32)
    public static func compute(_ steps: [PolicyStep]) -> [UInt8] {
        steps.reduce(empty) { $1.extend($0) }
    }
}

/// The command codes this library names in policies (Part 2, Table 12).
public enum CommandCode {
    public static let nvWrite: UInt32 = 0x137
    public static let nvChangeAuth: UInt32 = 0x13B
    public static let nvIncrement: UInt32 = 0x134
    public static let nvSetBits: UInt32 = 0x135
    public static let unseal: UInt32 = 0x15E
    public static let startAuthSession: UInt32 = 0x176
    static let policyNV: UInt32 = 0x149
    public static let policySecret: UInt32 = 0x151
    static let policySigned: UInt32 = 0x160
    static let policyAuthValue: UInt32 = 0x16B
    static let policyCommandCode: UInt32 = 0x16C
    static let policyCpHash: UInt32 = 0x16E
    static let policyOR: UInt32 = 0x171
    static let policyPCR: UInt32 = 0x17F
    public static let policyAuthorizeNV: UInt32 = 0x192
}

/// The public area of an NV index, enough to compute its name offline (Part 2, 13.5).
public struct NVPublic: Sendable, Hashable {
    public var index: UInt32
    public var attributes: UInt32
    public var authPolicy: [UInt8]
    public var size: UInt16
    public init(index: UInt32, attributes: UInt32, authPolicy: [UInt8], size: UInt16) {
        self.index = index; self.attributes = attributes; self.authPolicy = authPolicy; self.size = size
    }

    /// nameAlg || SHA-256(TPMS_NV_PUBLIC), with TPMA_NV_WRITTEN as given.
    public func name(written: Bool) -> [UInt8] {
        let attrs = written ? attributes | NVAttributes.written : attributes & ~NVAttributes.written
        let marshalled = index.bigEndianBytes + UInt16(0x000B).bigEndianBytes + attrs.bigEndianBytes
            + UInt16(authPolicy.count).bigEndianBytes + authPolicy + size.bigEndianBytes
        return UInt16(0x000B).bigEndianBytes + sha256(marshalled)
    }

    /// cpHash of NV_Write(authHandle: this index, nvIndex: this index, data, offset) (Part 1, 18.7).
    public func writeCpHash(data: [UInt8], offset: UInt16, written: Bool) -> [UInt8] {
        let name = name(written: written)
        return sha256(CommandCode.nvWrite.bigEndianBytes, name, name,
                      UInt16(data.count).bigEndianBytes + data, offset.bigEndianBytes)
    }
}

/// TPMA_NV bits (Part 2, 13.4).
public enum NVAttributes {
    public static let ownerWrite: UInt32 = 0x0000_0002
    public static let authWrite: UInt32 = 0x0000_0004
    public static let policyWrite: UInt32 = 0x0000_0008
    public static let typePINFail: UInt32 = 0x0000_0080
    public static let typeCounter: UInt32 = 0x0000_0010
    public static let typeBits: UInt32 = 0x0000_0020
    public static let ownerRead: UInt32 = 0x0002_0000
    public static let authRead: UInt32 = 0x0004_0000
    public static let noDA: UInt32 = 0x0200_0000
    public static let clearSTClear: UInt32 = 0x0800_0000
    public static let written: UInt32 = 0x2000_0000
}
