import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2
import KeychainCLIText

/// `keychainctl identity` on a software TPM made by `swtpm_setup --create-ek-cert` with swtpm's
/// local CA, checked against what tpm2-tools and openssl read from the same TPM and certificate.
@Suite("device identity", .offThePool)
struct IdentityTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    func identity(_ tpm: SoftwareTPM) throws -> (DeviceIdentity, Data) {
        let out = try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "identity"])
        #expect(out.status == 0, "\(out.stderr)")
        return (try DeviceIdentity(json: Data(out.stdout)), Data(out.stdout))
    }

    @Test func theIdentityNamesTheCertifiedEKTheSRKTheIndicesAndTheBootStateAsTheTPMHasThem() throws {
        let tpm = try SoftwareTPM()
        try tpm.manufacture()
        // The first unlock writes the state index: tpm2-tools then reads the name policies use.
        #expect(try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "unlock"]).status == 0)
        let (id, _) = try identity(tpm)
        #expect(id.format == DeviceIdentity.formatName && id.version == 1)
        #expect(id.tpm.manufacturer == "IBM")
        let rsa = try #require(id.endorsementKeys.first { $0.type == "rsa2048" })
        let certificate = try #require(rsa.certificate.flatMap { Data(base64Encoded: $0) })
        #expect(rsa.certificateIndex == "0x01c00002")
        // The certificate certifies the EK this identity carries: the same RSA modulus.
        let der = tpm.directory + "/ek.der"
        try certificate.write(to: URL(fileURLWithPath: der))
        let modulus = String(decoding: try run("/usr/bin/openssl", ["x509", "-inform", "DER", "-in", der, "-noout", "-modulus"]).stdout,
                             as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let area = [UInt8](try #require(Data(base64Encoded: rsa.publicArea)))
        #expect(modulus == "Modulus=" + lowerHex(Array(area.suffix(256))).uppercased())
        // It chains to swtpm's local CA.
        let chain = try run("/usr/bin/openssl", ["verify", "-CAfile", tpm.directory + "/ca/swtpm-localca-rootca-cert.pem",
                                                 "-untrusted", tpm.directory + "/ca/issuercert.pem", der])
        #expect(chain.status == 0, "\(chain.stderr)")

        let env = ["TPM2TOOLS_TCTI": tpm.tcti]
        // The ECC EK swtpm certifies is the high range's P-384 (template H-3, EK Credential Profile 2.3),
        // its certificate at 0x01c00016; the low range's P-256 index 0x01c0000a (L-2) holds none.
        #expect(id.endorsementKeys.first { $0.type == "eccP256" }?.certificate == nil)
        let p384 = try #require(id.endorsementKeys.first { $0.type == "eccP384" })
        #expect(p384.certificateIndex == "0x01c00016")
        let p384Area = [UInt8](try #require(Data(base64Encoded: p384.publicArea)))
        #expect(p384.name.hasPrefix("000c") && p384.name.count == 100, "a SHA-384 name: \(p384.name)")
        // Its certificate names this very key (the public point) and chains to swtpm's local CA.
        let eccDER = tpm.directory + "/ek384.der"
        try #require(p384.certificate.flatMap { Data(base64Encoded: $0) }).write(to: URL(fileURLWithPath: eccDER))
        let spki = try run("/bin/sh", ["-c", "openssl x509 -inform DER -in '\(eccDER)' -noout -pubkey | openssl pkey -pubin -outform DER"])
        #expect(spki.status == 0, "\(spki.stderr)")
        let point = Array(p384Area.suffix(100))  // unique: x and y, each a TPM2B of 48 bytes
        #expect(Array(spki.stdout.suffix(97)) == [0x04] + point[2..<50] + point[52...], "the certificate's key is the identity's P-384 EK")
        #expect(try run("/usr/bin/openssl", ["verify", "-CAfile", tpm.directory + "/ca/swtpm-localca-rootca-cert.pem",
                                             "-untrusted", tpm.directory + "/ca/issuercert.pem", eccDER]).status == 0)
        // tpm2-tools' high-range template makes the same key, and so did swtpm_setup (its persistent EK).
        let made = try run("/bin/sh", ["-c", """
            set -e
            cd '\(tpm.directory)'
            tpm2_createek -c ek384.ctx -G ecc384 -u ek384.pub
            tpm2_flushcontext -t
            tpm2_readpublic -c 0x81010016 -o persistent384.pub
            """], environment: env)
        #expect(made.status == 0, "\(made.stderr)")
        #expect([UInt8](try Data(contentsOf: URL(fileURLWithPath: tpm.directory + "/ek384.pub"))) == p384Area)
        #expect([UInt8](try Data(contentsOf: URL(fileURLWithPath: tpm.directory + "/persistent384.pub"))) == p384Area)
        // The SRK's name as tpm2-tools reads it.
        let name = tpm.directory + "/srk.name"
        #expect(try run("/usr/bin/tpm2_readpublic", ["-c", "0x81000001", "-n", name], environment: env).status == 0)
        #expect(id.storageRootKey.name == lowerHex([UInt8](try Data(contentsOf: URL(fileURLWithPath: name)))))
        // The state index's name as tpm2-tools reads it.
        let nv = String(decoding: try run("/usr/bin/tpm2_nvreadpublic", ["0x01004b51"], environment: env).stdout, as: UTF8.self)
        #expect(nv.contains("name: " + (id.nvIndices["state"]?.name ?? "missing")))
        #expect(Set(id.nvIndices.keys) == ["pin", "state", "epoch", "descriptor", "bootApproval"])
        // The boot state: SHA-256 over PCR 7 as tpm2_pcrread gives it.
        let pcr = tpm.directory + "/pcr7"
        #expect(try run("/usr/bin/tpm2_pcrread", ["sha256:7", "-o", pcr], environment: env).status == 0)
        let pcrValue = [UInt8](try Data(contentsOf: URL(fileURLWithPath: pcr)))
        #expect(id.bootState.pcrs == [7] && id.bootState.digest == lowerHex(sha256Bytes(pcrValue)))
    }

    @Test func aTPMWithoutCertificatesHasAnIdentityWithoutThemAndTheSameEKEveryTime() throws {
        let tpm = try SoftwareTPM()
        let (first, _) = try identity(tpm)
        let (second, _) = try identity(tpm)
        #expect(first.endorsementKeys.map(\.type) == ["rsa2048", "eccP256", "eccP384"] && first.endorsementKeys.allSatisfy { $0.certificate == nil })
        #expect(first.endorsementKeys == second.endorsementKeys && first.storageRootKey == second.storageRootKey)
    }

    /// The identity parser against changed documents: a clear error, never a crash.
    @Test func aChangedIdentityIsRefusedWithAClearCode() throws {
        let tpm = try SoftwareTPM()
        let (id, json) = try identity(tpm)
        var srkSwapped = id
        srkSwapped.storageRootKey.publicArea = id.endorsementKeys[0].publicArea
        #expect(throws: KeychainError(.dataCorrupted)) { try DeviceIdentity(json: srkSwapped.json()) }
        var newer = id
        newer.version = 2
        #expect(throws: KeychainError(.unsupported)) { try DeviceIdentity(json: newer.json()) }
        let bytes = [UInt8](json)
        for round in 0..<1500 {
            var f = bytes
            switch round % 3 {
            case 0: f[Int.random(in: 0..<f.count)] = UInt8.random(in: 0...255)
            case 1: f = Array(f[..<Int.random(in: 0..<f.count)])
            default: f.insert(UInt8.random(in: 0x20...0x7E), at: Int.random(in: 0...f.count))
            }
            do { _ = try DeviceIdentity(json: Data(f)) } catch {
                #expect(error.code == .dataCorrupted || error.code == .unsupported, "\(error)")
            }
        }
    }
}

func sha256Bytes(_ bytes: [UInt8]) -> [UInt8] { sha256(bytes) }
