import KeychainCore
import FoundationEssentials
import TPM2
import KeychainBasics

extension Engine {
    func identity() throws(KeychainError) -> DeviceIdentity {
        try configuration.checkPCRSelection()
        return try withKeyring { keyring throws(KeychainError) -> DeviceIdentity in
            let pcrs = keyring.pcrSelection
            let context = keyring.context
            do throws(TPMError) {
                let vendor = try context.vendorProperties()
                func text(_ words: [UInt32]) -> String {
                    let bytes = words.flatMap { $0.bigEndianBytes }.filter { $0 != 0 }
                    return String(decoding: bytes, as: UTF8.self).trimmingSpaces()
                }
                var keys: [DeviceIdentity.EndorsementKey] = []
                for type in TPMContext.EndorsementKeyType.allCases {
                    // A TPM whose endorsement hierarchy has an authorization, or lacks the algorithm: no EK of that type.
                    guard let area = try? context.endorsementKeyPublic(type), let name = DeviceIdentity.name(ofPublic: area) else { continue }
                    let certificate = try context.readWholeNV(type.certificateIndex)
                    keys.append(.init(type: type.rawValue, publicArea: Data(area).base64EncodedString(), name: name,
                                      certificate: certificate.map { Data($0).base64EncodedString() },
                                      certificateIndex: hexHandle(type.certificateIndex)))
                }
                let srkArea = try context.publicArea(of: keyring.srk)
                let indices = try keyring.nvIndexNames()
                let values = try context.readPCRs(PCRSelection(pcrs))
                return DeviceIdentity(
                    format: DeviceIdentity.formatName, version: DeviceIdentity.currentVersion,
                    created: Date(timeIntervalSince1970: (Date().timeIntervalSince1970).rounded(.down)),
                    tpm: .init(manufacturer: text([vendor.manufacturer]), vendor: text(vendor.vendor),
                               firmwareVersion: Hex.encode(vendor.firmware.0, digits: 8) + "." + Hex.encode(vendor.firmware.1, digits: 8)),
                    endorsementKeys: keys,
                    storageRootKey: .init(handle: hexHandle(TPMKeyring.srkHandle), publicArea: Data(srkArea).base64EncodedString(),
                                          name: Hex.encode(try context.name(of: keyring.srk))),
                    nvIndices: indices,
                    bootState: .init(bank: "sha256", pcrs: pcrs, digest: Hex.encode(sha256(values.flatMap { $0 }))))
            } catch {
                throw keyring.diagnose(error, doing: "read the device identity")
            }
        }
    }
}

extension TPMKeyring {
    /// The keychain's NV indices by role, with their names as policies use them: with TPMA_NV_WRITTEN
    /// (the state index is unwritten until the first unlock). An identity and an attestation request carry them.
    func nvIndexNames() throws(TPMError) -> [String: DeviceIdentity.NVIndex] {
        var indices: [String: DeviceIdentity.NVIndex] = [:]
        indices["pin"] = .init(index: hexHandle(DeviceLockLayout.pinIndex), name: Hex.encode(DeviceLockLayout.pinName))
        indices["state"] = .init(index: hexHandle(DeviceLockLayout.stateIndex), name: Hex.encode(stateName))
        indices["epoch"] = .init(index: hexHandle(DeviceLockLayout.epochIndex), name: Hex.encode(DeviceLockLayout.epochPublic.name(written: true)))
        indices["descriptor"] = .init(index: hexHandle(DeviceLockLayout.descriptorIndex),
                                      name: Hex.encode(try context.name(of: try context.resource(forPersistent: DeviceLockLayout.descriptorIndex))))
        // The boot-state approval index (issue 12) may not exist yet; its name is fixed (written).
        indices["bootApproval"] = .init(index: hexHandle(BootApprovalLayout.index), name: Hex.encode(BootApprovalLayout.name))
        return indices
    }
}
