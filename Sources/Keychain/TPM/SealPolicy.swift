import Foundation
import TPM2

/// What a wrapping key is sealed to, derived from its item protection in exactly one place.
///
/// Stored next to the sealed blob (JSON); before use its digest is recomputed and compared with
/// the blob's authPolicy, so an edited policy is `DATA_CORRUPTED`, not a misleading TPM error.
struct SealPolicy: Codable, Equatable {
    enum Availability: String, Codable { case always, afterFirstUnlock, whenUnlocked }
    var availability: Availability
    /// `ThisDeviceOnly`: the PCRs and the SHA-256 of their values when the key was sealed.
    var pcrs: [Int]?
    var pcrDigest: [UInt8]?
    /// `whenPasscodeSet`: the passcode epoch the key belongs to.
    var passcodeEpoch: UInt64?
    /// Name of the state index (depends on the TPM's lock approval key).
    var stateName: [UInt8]

    var fixedToThisTPM: Bool { pcrs != nil }

    /// The assertions, in the order they are run and hashed: PCRs, passcode epoch, lock state.
    var steps: [PolicyStep] {
        var steps: [PolicyStep] = []
        if let pcrs, let pcrDigest {
            steps.append(.pcr(selection: PCRSelection(pcrs), digest: pcrDigest))
        }
        if let passcodeEpoch {
            steps.append(.nv(index: DeviceLockLayout.epochIndex, name: DeviceLockLayout.epochPublic.name(written: true),
                             operand: passcodeEpoch.bigEndianBytes, offset: 0, comparison: .equal))
        }
        switch availability {
        case .always: break
        case .afterFirstUnlock:
            // Any written value: the index is written only by an unlock since the TPM started.
            steps.append(.nv(index: DeviceLockLayout.stateIndex, name: stateName, operand: DeviceLockLayout.locked,
                             offset: 0, comparison: .unsignedGreaterOrEqual))
        case .whenUnlocked:
            steps.append(.nv(index: DeviceLockLayout.stateIndex, name: stateName, operand: DeviceLockLayout.unlocked,
                             offset: 0, comparison: .equal))
        }
        return steps
    }

    /// Empty when there is nothing to assert: such keys use their (empty) authValue instead.
    var digest: [UInt8] { steps.isEmpty ? [] : PolicyDigest.compute(steps) }

    func encoded() -> [UInt8] { Array((try? JSONEncoder().encode(self)) ?? Data()) }
    static func decode(_ bytes: [UInt8]) -> SealPolicy? { try? JSONDecoder().decode(SealPolicy.self, from: Data(bytes)) }
}

extension FixedWidthInteger {
    var bigEndianBytes: [UInt8] { withUnsafeBytes(of: self.bigEndian) { Array($0) } }
    init?(bigEndianBytes bytes: [UInt8]) {
        guard bytes.count == MemoryLayout<Self>.size else { return nil }
        self = bytes.reduce(0) { $0 << 8 | Self($1) }
    }
}

extension SealPolicy.Availability {
    init(_ accessible: Accessible) {
        switch accessible.availability {
        case .always: self = .always
        case .afterFirstUnlock: self = .afterFirstUnlock
        case .whenUnlocked: self = .whenUnlocked
        }
    }
}
