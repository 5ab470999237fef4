import Foundation
import SecureMemory
import Testing
import TPM2

/// KDFa and KDFe pinned against known answers (computed with Python's hmac and hashlib from the
/// formulas of TPM 2.0 Part 1, 11.4.10.2 and 11.4.10.3); the blob they make is checked end to end by
/// `ProvisioningTests` (tpm2_import on a software TPM accepts it).
@Suite("duplication blobs")
struct DuplicationTests {
    func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
    let key = Array(0..<32).map(UInt8.init)
    var name: [UInt8] { [0x00, 0x0B] + Array(100..<132).map(UInt8.init) }

    @Test func kdfaGivesTheKnownAnswers() {
        #expect(hex(Duplication.kdfa(key: key, label: "STORAGE", contextU: name, contextV: [], bits: 128))
                == "d98939313878365f823837e2ce0286ca")
        #expect(hex(Duplication.kdfa(key: key, label: "INTEGRITY", contextU: [], contextV: [], bits: 256))
                == "bacf689f634ece301e1f1b15b072d9c87db6a69585db42b1a0cb8f73ebe2692e")
        // Three HMAC blocks, truncated: the counter and the bit count in each.
        #expect(hex(Duplication.kdfa(key: key, label: "TEST", contextU: [1, 2], contextV: [3], bits: 520))
                == "02e7e8e48f5aba2cae75a79abf38845c57eecd5e0f0e99346b070c92b31ce8db39d48454ccec5b49b85dfa510e013a5f"
                + "50c03a5c87e49a86e4b8bb5cc650540d50")
    }

    @Test func kdfeGivesTheKnownAnswer() {
        let z = Array(200..<232).map(UInt8.init), u = Array(32..<64).map(UInt8.init), v = Array(64..<96).map(UInt8.init)
        #expect(hex(Duplication.kdfe(z: z, use: "DUPLICATE", partyU: u, partyV: v, bits: 256))
                == "5d142457800ff53788f9409446b6e7d910a95dc02a63923ee7c7465e4a14356b")
    }

    /// The blob's structure: TPM2B_PRIVATE holding a 32-byte HMAC and the encrypted sensitive area,
    /// a 68-byte ECC point as the seed, a name that is the public area's; a fresh seed every time.
    @Test func aBlobHasTheTPMsShapesAndANewSeedEachTime() throws {
        // A P-256 point: the generator (any point on the curve will do for the shape).
        let gx: [UInt8] = [0x6b, 0x17, 0xd1, 0xf2, 0xe1, 0x2c, 0x42, 0x47, 0xf8, 0xbc, 0xe6, 0xe5, 0x63, 0xa4, 0x40, 0xf2,
                           0x77, 0x03, 0x7d, 0x81, 0x2d, 0xeb, 0x33, 0xa0, 0xf4, 0xa1, 0x39, 0x45, 0xd8, 0x98, 0xc2, 0x96]
        let gy: [UInt8] = [0x4f, 0xe3, 0x42, 0xe2, 0xfe, 0x1a, 0x7f, 0x9b, 0x8e, 0xe7, 0xeb, 0x4a, 0x7c, 0x0f, 0x9e, 0x16,
                           0x2b, 0xce, 0x33, 0x57, 0x6b, 0x31, 0x5e, 0xce, 0xcb, 0xb6, 0x40, 0x68, 0x37, 0xbf, 0x51, 0xf5]
        let parent = srkPublic(x: gx, y: gy)
        let one = try Duplication.blob(SecureBytes(random: 32), policy: [], parentPublic: parent)
        let two = try Duplication.blob(SecureBytes(random: 32), policy: [], parentPublic: parent)
        #expect(one.encryptedSeed.count == 70 && one.encryptedSeed.prefix(4) == [0x00, 0x44, 0x00, 0x20])
        #expect(Int(one.duplicate[0]) << 8 | Int(one.duplicate[1]) == one.duplicate.count - 2 && one.duplicate[2...3] == [0x00, 0x20])
        #expect(one.name == Duplication.name(ofPublic: one.publicArea))
        #expect(one.encryptedSeed != two.encryptedSeed)
        // A point off the curve is refused, as is a parent of another kind.
        var off = gy
        off[31] ^= 1
        #expect(throws: DuplicationError.self) { try Duplication.blob(SecureBytes(random: 32), policy: [], parentPublic: srkPublic(x: gx, y: off)) }
        #expect(throws: DuplicationError.self) { try Duplication.blob(SecureBytes(random: 32), policy: [], parentPublic: Array(parent.dropLast())) }
        #expect(throws: DuplicationError.self) { try Duplication.blob(SecureBytes(random: 129), policy: [], parentPublic: parent) }
    }

    /// A marshalled TPM2B_PUBLIC of the SRK template (ECC P-256, AES-128-CFB, restricted decrypt).
    func srkPublic(x: [UInt8], y: [UInt8]) -> [UInt8] {
        var area: [UInt8] = [0x00, 0x23, 0x00, 0x0B]            // type ECC, nameAlg SHA-256
        area += [0x00, 0x03, 0x04, 0x72]                        // fixedTPM|fixedParent|sensitiveDataOrigin|userWithAuth|noDA|restricted|decrypt
        area += [0x00, 0x00]                                    // authPolicy: empty
        area += [0x00, 0x06, 0x00, 0x80, 0x00, 0x43]            // AES 128 CFB
        area += [0x00, 0x10, 0x00, 0x03, 0x00, 0x10]            // scheme NULL, curve P-256, kdf NULL
        area += [0x00, 0x20] + x + [0x00, 0x20] + y
        return [UInt8(area.count >> 8), UInt8(area.count & 0xFF)] + area
    }
}
