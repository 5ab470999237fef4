import KeychainCore
import SecureMemory
import TPM2

/// The device lock, kept in the TPM's NV memory so the TPM, not this code, decides what is unlocked.
///
/// Four indices in the owner range (TCG handle registry: 0x01000000–0x013FFFFF):
/// - `pin`: a `TPM_NT_PIN_FAIL` index whose authValue is the device passcode. The TPM counts wrong
///   passcodes there (its own limit, independent of the TPM-wide DA lockout); only the owner resets it.
/// - `state`: 1 byte, `CLEAR_STCLEAR`: unwritten after every TPM reset (before first unlock), 1 when
///   unlocked, 0 when locked. Writing it needs the passcode (PolicySecret on `pin`), except writing 0,
///   which a once-approved PolicyAuthorize allows to anyone: locking needs no secret, unlocking does.
/// - `epoch`: a counter bumped when the passcode is removed; `whenPasscodeSet` keys are sealed to its
///   value, so removing the passcode kills them in the TPM, not only in our database. Bumping it
///   needs the passcode (PolicySecret), so nobody else can destroy those items.
/// - `descriptor`: public data every store on this TPM needs: the passcode-set flag and the lock
///   approval. Writing it needs the passcode too, so nobody can lie that no passcode is set (which
///   would make the library try the empty passcode and spend the TPM's tries).
enum DeviceLockLayout {
    static let pinIndex: UInt32 = 0x0100_4B50
    static let stateIndex: UInt32 = 0x0100_4B51
    static let epochIndex: UInt32 = 0x0100_4B52
    static let descriptorIndex: UInt32 = 0x0100_4B53
    static let descriptorSize: UInt16 = 512
    static let lockPolicyRef = Array("keychain-lock".utf8)

    static let unlocked: [UInt8] = [1]
    static let locked: [UInt8] = [0]

    // Each policy below is a list of steps: its digest is computed from the list, and the session that
    // satisfies it runs the same list (`TPMContext.run`), so the two cannot drift apart.

    /// The PIN index's ADMIN policy: whoever knows the passcode may change it (NV_ChangeAuth).
    static let changeAuthSteps: [PolicyStep] = [.commandCode(CommandCode.nvChangeAuth), .authValue]

    /// The passcode can be changed by whoever knows it (ADMIN role: PolicyCommandCode + PolicyAuthValue).
    static let pinPublic = NVPublic(
        index: pinIndex,
        attributes: NVAttributes.typePINFail | NVAttributes.ownerWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: PolicyDigest.compute(changeAuthSteps),
        size: 8)

    static var pinName: [UInt8] { pinPublic.name(written: true) }

    /// "Whoever knows the passcode may run `command` on this index": PolicySecret on the PIN index, then the command.
    static func passcodeSteps(_ command: UInt32) -> [PolicyStep] {
        [.secret(index: pinIndex, name: pinPublic.name(written: true), policyRef: []), .commandCode(command)]
    }

    static func passcodePolicy(_ command: UInt32) -> [UInt8] { PolicyDigest.compute(passcodeSteps(command)) }

    /// Branch 1 of the state index's write policy: the passcode was proven, write anything.
    static let unlockBranch = passcodePolicy(CommandCode.nvWrite)

    /// Branch 2: the once-approved policy (signed by the approval key for `lockPolicyRef`).
    static func lockBranch(approvalKeyName: [UInt8]) -> [UInt8] {
        PolicyDigest.compute([.authorize(keyName: approvalKeyName, policyRef: lockPolicyRef)])
    }

    static func stateBranches(approvalKeyName: [UInt8]) -> PolicyStep {
        .or([unlockBranch, lockBranch(approvalKeyName: approvalKeyName)])
    }

    static func statePublic(approvalKeyName: [UInt8]) -> NVPublic {
        NVPublic(
            index: stateIndex,
            attributes: NVAttributes.policyWrite | NVAttributes.authRead | NVAttributes.noDA | NVAttributes.clearSTClear,
            authPolicy: PolicyDigest.compute([stateBranches(approvalKeyName: approvalKeyName)]),
            size: 1)
    }

    /// Writing "unlocked": the unlock branch, then PolicyOR.
    static func unlockSteps(approvalKeyName: [UInt8]) -> [PolicyStep] {
        passcodeSteps(CommandCode.nvWrite) + [stateBranches(approvalKeyName: approvalKeyName)]
    }

    /// The policy the approval key signs: exactly "NV_Write(state, state, [0], 0)".
    static func lockApproved(state: NVPublic) -> [PolicyStep] {
        [.cpHash(state.writeCpHash(data: locked, offset: 0, written: true))]
    }

    static func lockPolicy(state: NVPublic) -> [UInt8] { PolicyDigest.compute(lockApproved(state: state)) }

    /// Writing "locked": the approved cpHash, PolicyAuthorize (the signature: the caller's), then PolicyOR.
    static func lockSteps(approvalKeyName: [UInt8]) -> [PolicyStep] {
        let state = statePublic(approvalKeyName: approvalKeyName)
        return lockApproved(state: state) + [.authorize(keyName: approvalKeyName, policyRef: lockPolicyRef),
                                             stateBranches(approvalKeyName: approvalKeyName)]
    }

    static let epochPublic = NVPublic(
        index: epochIndex,
        attributes: NVAttributes.typeCounter | NVAttributes.policyWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: passcodePolicy(CommandCode.nvIncrement),
        size: 8)

    static let descriptorPublic = NVPublic(
        index: descriptorIndex,
        attributes: NVAttributes.policyWrite | NVAttributes.authRead | NVAttributes.noDA,
        authPolicy: passcodePolicy(CommandCode.nvWrite), size: descriptorSize)
}

/// What the descriptor's first byte says of the passcode.
///
/// `setting` and `removing` are written before NV_ChangeAuth, the one step that cannot be undone, and
/// replaced once the change is complete: a process killed in between leaves them, and the next
/// operation finds out which side of the change the TPM is on (`TPMKeyring.finishInterruptedChange`).
enum PasscodeMark: UInt8 {
    case none = 0, set = 1, setting = 2, removing = 3

    var isInterrupted: Bool { self == .setting || self == .removing }
}

/// What every store on one TPM shares, read from the descriptor index.
struct LockDescriptor: Equatable {
    var mark: PasscodeMark
    var approval: TPMContext.Approval

    var passcodeSet: Bool { mark == .set }

    /// [mark:1][keyPublic len:2][keyPublic][keyName len:2][keyName][signature len:2][signature]
    func encoded() -> [UInt8] {
        func field(_ bytes: [UInt8]) -> [UInt8] { [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xFF)] + bytes }
        return [mark.rawValue] + field(approval.keyPublic) + field(approval.keyName)
            + field(approval.signatures.first ?? [])
    }

    init(mark: PasscodeMark, approval: TPMContext.Approval) {
        self.mark = mark
        self.approval = approval
    }

    init?(decoding bytes: [UInt8]) {
        guard let first = bytes.first, let mark = PasscodeMark(rawValue: first) else { return nil }
        var offset = 1
        func field() -> [UInt8]? {
            guard offset + 2 <= bytes.count else { return nil }
            let count = Int(bytes[offset]) << 8 | Int(bytes[offset + 1])
            offset += 2
            guard count > 0, offset + count <= bytes.count else { return nil }
            defer { offset += count }
            return Array(bytes[offset..<offset + count])
        }
        guard let pub = field(), let name = field(), let sig = field() else { return nil }
        self.mark = mark
        approval = .init(keyPublic: pub, keyName: name, signatures: [sig])
    }
}
