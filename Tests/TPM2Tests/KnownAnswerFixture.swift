import SecureMemory
import TPM2

/// The device-lock layout of Sources/Keychain/TPM/DeviceLock.swift, restated with TPM2 values
/// (`DeviceLockLayout` is internal to Keychain), plus the inputs the tpm2-tools vectors were made from.
///
/// These vectors pin the offline calculator; the library's own layout is pinned against the same
/// vectors by `DeviceLockKnownAnswerTests` (KeychainTests), with no restated copy.
/// - Important: if DeviceLock.swift changes an index, attribute or policy, regenerate the vectors
///   (commands in PolicyKnownAnswerTests.swift) for both.
enum DeviceLockFixture {
    /// The PCR 7 value the PCR vectors assume: 32 bytes of 0x07 (file `pcr7.bin`).
    static let pcr7Value = [UInt8](repeating: 0x07, count: 32)
    /// TPMS_NV_PIN_COUNTER_PARAMETERS written to the PIN index: pinCount 0, pinLimit 5.
    static let pinParameters: [UInt8] = [0, 0, 0, 0, 0, 0, 0, 5]

    static let pin = NVPublic(
        index: 0x0100_4B50,
        attributes: NVAttributes.typePINFail | NVAttributes.ownerWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: PolicyDigest.compute([.commandCode(CommandCode.nvChangeAuth), .authValue]),
        size: 8)

    /// Name of the ECC P-256 signing key made once with tpm2_create (`key.name`); a stand-in for the
    /// one-time approval key, pinned so the state index's name is deterministic.
    static let approvalKeyName = [UInt8](hex: "000b6b0972bf7e0d2f1ba4eb5281d6ee4e69778a05a9434cd54f7516b437e6780d04")
    static let lockPolicyRef = Array("keychain-lock".utf8)

    static let unlockBranch = PolicyDigest.compute([
        .secret(index: pin.index, name: pin.name(written: true), policyRef: []),
        .commandCode(CommandCode.nvWrite),
    ])
    static let lockBranch = PolicyStep.authorizeDigest(keyName: approvalKeyName, policyRef: lockPolicyRef)

    static let state = NVPublic(
        index: 0x0100_4B51,
        attributes: NVAttributes.policyWrite | NVAttributes.authRead | NVAttributes.noDA | NVAttributes.clearSTClear,
        authPolicy: PolicyDigest.compute([.or([unlockBranch, lockBranch])]),
        size: 1)

    /// A counter with the first version of the epoch index's policy (CommandCode only). The library's
    /// epoch now also needs PolicySecret on the PIN; these vectors pin the calculator on a counter
    /// index, and `DeviceLockLayoutTests` (KeychainTests) checks the real layout against a TPM.
    static let epoch = NVPublic(
        index: 0x0100_4B52,
        attributes: NVAttributes.typeCounter | NVAttributes.policyWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: PolicyDigest.compute([.commandCode(CommandCode.nvIncrement)]),
        size: 8)

    /// The PIN index defined on `ctx` with `passcode` as its authValue, and written (PolicyNV needs
    /// written indices); ESAPI holds the passcode for it, so a session can prove it (PolicySecret).
    static func writtenPin(on ctx: TPMContext, passcode: SecureBytes) throws(TPMError) -> TPMHandle {
        let index = try ctx.defineNV(pin, auth: passcode)
        try ctx.writeNV(index, data: pinParameters, authHandle: TPMContext.owner, session: nil)
        try ctx.setAuth(index, passcode)
        return index
    }

    /// PolicyNV on the state index as SealPolicy asserts it.
    static func stateIs(_ operand: UInt8, _ comparison: NVComparison) -> PolicyStep {
        .nv(index: state.index, name: state.name(written: true), operand: [operand], offset: 0, comparison: comparison)
    }

    /// PolicyNV on the epoch counter as SealPolicy asserts it (the counter's 8 big-endian bytes).
    static func epochIs(_ value: UInt64) -> PolicyStep {
        .nv(index: epoch.index, name: epoch.name(written: true), operand: withUnsafeBytes(of: value.bigEndian) { Array($0) },
            offset: 0, comparison: .equal)
    }
}

extension [UInt8] {
    /// Bytes from a hex string as tpm2-tools and `xxd -p` print them.
    init(hex: String) {
        let digits = Array(hex.utf8)
        precondition(digits.count.isMultiple(of: 2), "odd-length hex")
        self = stride(from: 0, to: digits.count, by: 2).map { UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
    }

    /// Lower-case hex, so a failing expectation shows both digests as tpm2-tools prints them.
    var hex: String { map { ($0 < 0x10 ? "0" : "") + String($0, radix: 16) }.joined() }
}
