import FoundationEssentials

/// A device's identity document, format 1 (docs/formats.md): what a server with no TPM needs to seal a
/// secret to this device and to compute the policy it will be sealed under. Only public values.
public struct DeviceIdentity: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux identity"
    public static let currentVersion = 1

    public struct TPMInfo: Sendable, Hashable, Codable {
        /// TPM_PT_MANUFACTURER as four ASCII characters (`IBM ` is swtpm).
        public var manufacturer: String
        /// TPM_PT_VENDOR_STRING_1…4 as text, trailing NULs and spaces removed.
        public var vendor: String
        /// TPM_PT_FIRMWARE_VERSION_1 and _2, 8 hex digits each.
        public var firmwareVersion: String

        package init(manufacturer: String, vendor: String, firmwareVersion: String) {
            (self.manufacturer, self.vendor, self.firmwareVersion) = (manufacturer, vendor, firmwareVersion)
        }
    }

    public struct EndorsementKey: Sendable, Hashable, Codable {
        /// `rsa2048` (template L-1), `eccP256` (template L-2) or `eccP384` (template H-3).
        public var type: String
        /// Marshalled TPM2B_PUBLIC, base64.
        public var publicArea: String
        /// The EK's TPM name (nameAlg SHA-256 and the digest of its public area), hex.
        public var name: String
        /// The EK certificate (DER, base64) from its NV index, when the TPM holds one.
        public var certificate: String?
        /// Where the certificate is read: `0x01c00002` (RSA), `0x01c0000a` (ECC P-256) or `0x01c00016` (ECC P-384).
        public var certificateIndex: String

        package init(type: String, publicArea: String, name: String, certificate: String? = nil, certificateIndex: String) {
            (self.type, self.publicArea, self.name, self.certificate, self.certificateIndex) = (type, publicArea, name, certificate, certificateIndex)
        }
    }

    public struct PersistentKey: Sendable, Hashable, Codable {
        public var handle: String
        public var publicArea: String
        public var name: String

        package init(handle: String, publicArea: String, name: String) {
            (self.handle, self.publicArea, self.name) = (handle, publicArea, name)
        }
    }

    /// An NV index and its TPM name with TPMA_NV_WRITTEN set (as the policies that name it use it).
    public struct NVIndex: Sendable, Hashable, Codable {
        public var index: String
        public var name: String

        package init(index: String, name: String) {
            (self.index, self.name) = (index, name)
        }
    }

    public struct BootState: Sendable, Hashable, Codable {
        public var bank: String
        public var pcrs: [Int]
        /// SHA-256 over the selected PCR values in index order when the identity was made (the values
        /// the device approves at its first ThisDeviceOnly seal; keys are bound to the approved state
        /// through `nvIndices.bootApproval`, not to this digest).
        public var digest: String

        package init(bank: String, pcrs: [Int], digest: String) {
            (self.bank, self.pcrs, self.digest) = (bank, pcrs, digest)
        }
    }

    public var format: String
    public var version: Int
    public var created: Date
    public var tpm: TPMInfo
    /// The endorsement keys, RSA first; empty when the endorsement hierarchy refuses CreatePrimary.
    public var endorsementKeys: [EndorsementKey]
    /// The keychain's storage root key (ECC P-256 at 0x81000001).
    public var storageRootKey: PersistentKey
    /// The keychain's NV indices by role: `state`, `pin`, `epoch`, `descriptor` (the device lock),
    /// `bootApproval` (the approved boot state of ThisDeviceOnly keys).
    public var nvIndices: [String: NVIndex]
    public var bootState: BootState

    package init(format: String, version: Int, created: Date, tpm: TPMInfo, endorsementKeys: [EndorsementKey],
                 storageRootKey: PersistentKey, nvIndices: [String: NVIndex], bootState: BootState) {
        (self.format, self.version, self.created, self.tpm) = (format, version, created, tpm)
        (self.endorsementKeys, self.storageRootKey, self.nvIndices, self.bootState) = (endorsementKeys, storageRootKey, nvIndices, bootState)
    }
}
