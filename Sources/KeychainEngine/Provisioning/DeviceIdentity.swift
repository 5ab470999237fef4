import KeychainCore
import FoundationEssentials
import TPM2
import KeychainBasics

extension DeviceIdentity {
    /// Reads a document, checking what a sealer relies on: the format, the version, well-formed
    /// public areas whose names match, and a certificate only where the document says so.
    /// - Throws: `DATA_CORRUPTED` for anything else, `UNSUPPORTED` for a newer version.
    public init(json: Data) throws(KeychainError) {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        let decoded: DeviceIdentity
        do { decoded = try decoder.decode(DeviceIdentity.self, from: json) } catch {
            throw KeychainError(.dataCorrupted, "This is not a device identity document: \(error)")
        }
        guard decoded.format == Self.formatName else {
            throw KeychainError(.dataCorrupted, "This is not a device identity document (format '\(decoded.format)')")
        }
        guard decoded.version == Self.currentVersion else {
            throw KeychainError(.unsupported, "This identity is in version \(decoded.version); this keychain reads version \(Self.currentVersion)")
        }
        for key in decoded.endorsementKeys {
            guard let area = Data(base64Encoded: key.publicArea), Self.name(ofPublic: Array(area)) == key.name,
                  key.certificate.map({ Data(base64Encoded: $0) != nil }) ?? true else {
                throw KeychainError(.dataCorrupted, "The identity's \(key.type) endorsement key does not match its name, or is not base64")
            }
        }
        guard let srk = Data(base64Encoded: decoded.storageRootKey.publicArea),
              Self.name(ofPublic: Array(srk)) == decoded.storageRootKey.name else {
            throw KeychainError(.dataCorrupted, "The identity's storage root key does not match its name")
        }
        guard decoded.bootState.digest.count == 64, decoded.bootState.pcrs.allSatisfy({ (0..<24).contains($0) }) else {
            throw KeychainError(.dataCorrupted, "The identity's boot state is malformed")
        }
        self = decoded
    }

    /// The document as written: sorted keys, ISO 8601 dates.
    public func json() -> Data { ProvisioningJSON.document(self) }

    /// The TPM name of a marshalled TPM2B_PUBLIC with nameAlg SHA-256 (or SHA-384, the high-range
    /// EK's), hex; nil when it is not one.
    static func name(ofPublic bytes: [UInt8]) -> String? {
        // TPM2B: u16 size, then TPMT_PUBLIC: u16 type, u16 nameAlg (0x000B = SHA-256, 0x000C = SHA-384), …
        guard bytes.count > 6, Int(bytes[0]) << 8 | Int(bytes[1]) == bytes.count - 2, bytes[4] == 0x00 else { return nil }
        switch bytes[5] {
        case 0x0B: return Hex.encode([0x00, 0x0B] + sha256(Array(bytes[2...])))
        case 0x0C: return Hex.encode([0x00, 0x0C] + sha384(Array(bytes[2...])))
        default: return nil
        }
    }
}

func hexHandle(_ value: UInt32) -> String { "0x" + Hex.encode(value, digits: 8) }

/// How the provisioning documents (identity, bundle, attestation) are written: one JSON form, keys
/// sorted and dates in ISO 8601, so the same document always has the same bytes.
enum ProvisioningJSON {
    static func document<T: Encodable>(_ value: T) -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        encoder.dateEncodingStrategy = .iso8601
        return (try? encoder.encode(value)) ?? Data()
    }
}
