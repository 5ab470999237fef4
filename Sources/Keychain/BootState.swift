import Foundation
import KeychainStore
import SecureMemory
import TPM2

/// The boot state `ThisDeviceOnly` items are bound to, and its approval (docs/boot-state.md).
public struct BootStateStatus: Sendable, Hashable, Codable {
    /// The PCRs of the store's selection (SHA-256 bank).
    public var pcrs: [Int]
    /// The values this store approved last, hex by PCR; nil when the approval index holds a state
    /// approved elsewhere (another store on this TPM, or a tool) or none.
    public var approved: [Int: String]?
    /// Whether the approval index holds a state at all.
    public var approvalIndexWritten: Bool
    /// The values the PCRs hold now.
    public var current: [Int: String]
    /// Whether the current values are the approved state: ThisDeviceOnly items open and can be written.
    public var matches: Bool
    /// The PCRs whose current value differs from `approved`.
    public var differing: [Int]
}

extension KeychainDevice {
    /// The selection, the approved and current PCR values, and whether they match.
    public func bootState() async throws(KeychainError) -> BootStateStatus { try await engine.bootState() }

    /// Approves a boot state for `ThisDeviceOnly` items, revoking the one approved before: the current
    /// values of the store's PCR selection, with `predicted` values in place of some (after an update,
    /// before its reboot). Authorized by the device passcode (nil when none is set), checked by the TPM.
    public func approveBootState(predicted: [Int: [UInt8]] = [:], passcode: SecureBytes?) async throws(KeychainError) -> BootStateStatus {
        try await engine.approveBootState(predicted: predicted, passcode: passcode, owner: false)
    }

    /// As `approveBootState(predicted:passcode:)`, authorized by the configuration's owner authorization.
    public func approveBootStateAsOwner(predicted: [Int: [UInt8]] = [:]) async throws(KeychainError) -> BootStateStatus {
        try await engine.approveBootState(predicted: predicted, passcode: nil, owner: true)
    }
}

extension Engine {
    func bootState() throws(KeychainError) -> BootStateStatus {
        try configuration.checkPCRSelection()
        return try withKeyring { keyring throws(KeychainError) in try Self.bootState(keyring, selection: configuration.pcrSelection) }
    }

    private static func bootState(_ keyring: TPMKeyring, selection: [Int]) throws(KeychainError) -> BootStateStatus {
        let current: BootState
        let approvedPolicy: [UInt8]?
        do {
            current = try BootState.read(keyring.context, selection)
            approvedPolicy = try keyring.approvedBootPolicy()
        } catch {
            throw keyring.diagnose(error, doing: "read the boot state")
        }
        let recorded = keyring.recordedApproval().flatMap { approvedPolicy == BootApprovalLayout.approvedPolicy($0) ? $0 : nil }
        let differing = current.values.keys.sorted().filter { recorded?.values[$0] != current.values[$0] }
        return BootStateStatus(pcrs: current.values.keys.sorted(), approved: recorded.map(\.hexValues),
                               approvalIndexWritten: approvedPolicy != nil, current: current.hexValues,
                               matches: approvedPolicy == BootApprovalLayout.approvedPolicy(current), differing: differing)
    }

    func approveBootState(predicted: [Int: [UInt8]], passcode: SecureBytes?, owner: Bool) throws(KeychainError) -> BootStateStatus {
        try configuration.checkPCRSelection()
        let selection = PCRSelection(configuration.pcrSelection).indices
        for (pcr, value) in predicted {
            guard selection.contains(pcr) else {
                throw KeychainError.invalidArgument("Invalid --pcr \(pcr): this keychain's PCR selection is \(selection.map(String.init).joined(separator: ",")); "
                                                    + "approve values of those PCRs only")
            }
            guard value.count == 32 else {
                throw KeychainError.invalidArgument("Invalid --pcr \(pcr) value: expected a SHA-256 value (64 hex digits), got \(value.count) bytes")
            }
        }
        let status = try withKeyring { keyring throws(KeychainError) in
            var state: BootState
            state = try keyring.readBootState(selection)
            state.values.merge(predicted) { _, new in new }
            try keyring.approveBootState(state, passcode: passcode, owner: owner)
            return try Self.bootState(keyring, selection: selection)
        }
        // The state approved before is revoked: keys opened under it are opened again, under the new one.
        dropUnsealedThisDeviceOnly()
        return status
    }

    /// A key sealed to literal PCR values by an earlier version, just opened (so the PCRs hold the values
    /// it was sealed to): sealed again to the approved form, once the approval index holds that very
    /// state. Best effort, crash-safe as `reseal` (the old blob stays until one transaction replaces it).
    func migrateBootBinding(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        guard let pcrs = policy.pcrs, let pcrDigest = policy.pcrDigest else { return }
        let literal = BootApprovalLayout.approvedPolicy(selection: pcrs, pcrDigest: pcrDigest)
        let name: [UInt8]? = try? withKeyring { keyring throws(KeychainError) -> [UInt8]? in
            // A new index approves the state this key was sealed to (the recorded boot state when they agree).
            let recorded = keyring.recordedBootState(pcrs).flatMap { BootApprovalLayout.approvedPolicy($0) == literal ? $0 : nil }
            var initial: BootState
            if let recorded { initial = recorded } else {
                initial = try keyring.readBootState(pcrs)
            }
            guard BootApprovalLayout.approvedPolicy(initial) == literal,
                  let name = try keyring.ensureBootApproval(selection: pcrs, initial: initial) else { return nil }
            // Only when the index approves what the key was sealed to: never to a state nobody approved.
            let approved: [UInt8]?
            do { approved = try keyring.approvedBootPolicy() } catch { return nil }
            return approved == literal ? name : nil
        }
        guard let name = name ?? nil else { return }
        var upgraded = policy
        upgraded.pcrDigest = nil
        upgraded.bootApprovalName = name
        reseal(secret, wrapping, upgraded, store: store)
    }
}

extension Engine {
    /// After a new boot state is approved: ThisDeviceOnly keys open again under it.
    func dropUnsealedThisDeviceOnly() { unsealed = unsealed.filter { !$0.key.protection.contains("ThisDeviceOnly") } }
}

extension BootState {
    var hexValues: [Int: String] { values.mapValues { $0.map { String(format: "%02x", $0) }.joined() } }
}
