import FoundationEssentials

/// A provisioning bundle, format 1 (docs/formats.md): one item sealed to one device's TPM by a
/// machine without a TPM (`keychainctl seal-for`), opened only by `keychainctl import` on that device.
///
/// A random 32-byte key K is the sensitive data of a TPM2 duplication blob for the device's SRK
/// (`Duplication.blob`); the object's authPolicy is the item's protection as the keychain seals it
/// (`SealPolicy`, computed from the identity). The value is XChaCha20-Poly1305 under K, with every
/// other field and the object's name as associated data.
public struct ProvisioningBundle: Sendable, Hashable, Codable {
    public static let formatName = "keychain-linux bundle"
    public static let currentVersion = 1

    public var format: String
    public var version: Int
    /// What the object is duplicated to: `ek-rsa2048` (the EK, template L-1) or `srk` (the keychain's SRK).
    public var parent: String
    /// That parent's TPM name (hex), from the device's identity.
    public var target: String
    public var service: String
    public var key: String
    public var label: String?
    public var accessible: Accessible
    public var accessControl: AccessControl
    /// The provisioning version (`--version`): an import never replaces a higher one.
    public var itemVersion: UInt64
    /// A systemd credential (`seal-for --credential UNIT:ID`): `service` is the unit and `key` the
    /// credential's ID, and the import makes it the system manager's credential (docs/credentials.md).
    /// Absent (not false) for any other bundle, whose associated data it leaves as it was.
    public var credential: Bool?
    /// Which identity the bundle was sealed from: `true`, a verified identity (`attest verify`: the SRK
    /// proved to be in the EK's TPM); `false`, an SRK bundle from a plain identity, sealed only because
    /// the sealer said so (`--unattested-srk`). Absent for an EK bundle from a plain identity (the
    /// bytes of the first bundles). Covered by the associated data: it can be neither changed nor taken out.
    public var attested: Bool?
    /// ThisDeviceOnly: the PCR selection whose approved state (PolicyAuthorizeNV on the device's
    /// boot-state approval index) the object is bound to, as the device's own ThisDeviceOnly keys are.
    public var pcrs: [Int]?
    /// Marshalled TPM2B_PUBLIC, TPM2B_PRIVATE and TPM2B_ENCRYPTED_SECRET, base64 (what `tpm2_import`
    /// reads as `-u`, `-i` and `-s`).
    public var publicArea: String
    public var duplicate: String
    public var encryptedSeed: String
    /// XChaCha20-Poly1305 of the value under K, base64.
    public var nonce: String
    public var ciphertext: String


    /// - Throws: `DATA_CORRUPTED` for a document that is not a bundle, `UNSUPPORTED` for a newer version.
    public init(json: Data) throws(KeychainError) {
        let decoded: ProvisioningBundle
        do { decoded = try JSONDecoder().decode(ProvisioningBundle.self, from: json) } catch {
            throw KeychainError(.dataCorrupted, "This is not a provisioning bundle: \(error)")
        }
        guard decoded.format == Self.formatName else { throw KeychainError(.dataCorrupted, "This is not a provisioning bundle (format '\(decoded.format)')") }
        guard decoded.version == Self.currentVersion else {
            throw KeychainError(.unsupported, "This bundle is in version \(decoded.version); this keychain reads version \(Self.currentVersion)")
        }
        self = decoded
    }

    package init(format: String, version: Int, parent: String, target: String, service: String, key: String, label: String?, accessible: Accessible,
                 accessControl: AccessControl, itemVersion: UInt64, pcrs: [Int]?, publicArea: String,
                 duplicate: String, encryptedSeed: String, nonce: String, ciphertext: String) {
        (self.format, self.version, self.parent, self.target) = (format, version, parent, target)
        (self.service, self.key, self.label) = (service, key, label)
        (self.accessible, self.accessControl, self.itemVersion, self.pcrs) = (accessible, accessControl, itemVersion, pcrs)
        (self.publicArea, self.duplicate, self.encryptedSeed, self.nonce, self.ciphertext) = (publicArea, duplicate, encryptedSeed, nonce, ciphertext)
    }
}

/// What `import` did.
public enum ImportOutcome: String, Sendable, Hashable, Codable {
    case imported
    /// The same bundle was imported before and its item is there: nothing changed.
    case alreadyInstalled
}
