import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import SecureMemory
import Testing
import TPM2

/// Credential activation with an ECC EK (issue 23): the server's challenge made with no TPM for
/// the P-384 EK (template H-3, the one swtpm certifies) or the P-256 EK (L-2), answered by the
/// device with that EK; the ECC EK's certificate checked with `--ek-ca`; tpm2-tools on both sides.
extension AttestationTests {
    func json<T: AttestationDocument>(_ path: String, as: T.Type = T.self) throws -> T {
        try T(json: Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// The P-384 EK's request, challenge, answer and verification with its certificate against the
    /// CA swtpm_setup made; the P-256 EK (no certificate on swtpm) verifies only as uncertified. A
    /// request carrying the RSA EK's certificate for the ECC EK (or the ECC EK's for the RSA EK) is
    /// refused with --ek-ca: the certificate's key is not the EK the credential was made for.
    @Test func anECCEKActivatesTheCredentialAndItsCertificateVerifiesAgainstTheCA() throws {
        let b = try Device()
        let ca = try b.tpm.manufacture()
        let dir = b.tpm.directory
        #expect(try cli(b, ["set", "wifi", "psk", "--accessible", "afterFirstUnlockThisDeviceOnly"], "v").status == 0)
        let requestPath = try request(b, endorsementKey: "eccP384")
        let eccRequest: AttestationRequest = try json(requestPath)
        #expect(eccRequest.endorsementKey.type == "eccP384" && eccRequest.endorsementKey.certificateIndex == "0x01c00016")
        #expect(eccRequest.endorsementKey.certificate != nil, "swtpm_setup --create-ek-cert certified the P-384 EK")
        #expect(eccRequest.endorsementKey.name.hasPrefix("000c"), "H-3's name is SHA-384")

        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let eccChallenge: AttestationChallenge = try json(challengePath)
        #expect(eccChallenge.endorsementKey == "eccP384")
        // TPM2B_ENCRYPTED_SECRET of an ephemeral P-384 point: two 48-byte coordinates, each sized.
        #expect(Data(base64Encoded: eccChallenge.secret)?.count == 102)
        let answer = try respond(b, challengePath)
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
        let answerPath = try write(answer.stdout, dir + "/answer.json")
        let verified = try server(["verify", answerPath, "--state", statePath, "--ek-ca", ca], in: dir)
        #expect(verified.status == 0, "\(verified.stderr)")
        let identity = try VerifiedIdentity(json: Data(verified.stdout))
        #expect(identity.endorsementCertificateVerified && identity.endorsementKey == eccRequest.endorsementKey)
        #expect(identity.wrappingKeys?.count == 1 && identity.wrappingKeys?.first?.matchesClaim == true)
        // seal-for from it: no RSA EK to seal to, so the attested SRK is the parent; it imports on b.
        let bundle = try sealFor(try write(verified.stdout, dir + "/verified.json"), ["net", "wifi"], "secret", in: dir)
        #expect(bundle.status == 0, "\(bundle.stderr)")
        #expect(try ProvisioningBundle(json: Data(bundle.stdout)).parent == "srk")
        let imported = try cli(b, ["import", try write(bundle.stdout, dir + "/bundle.json")])
        #expect(imported.status == 0, "\(imported.stderr)")

        // The RSA EK's certificate in the ECC EK's request, and the other way round: refused.
        let rsaRequest: AttestationRequest = try json(try request(b))
        for (base, other) in [(eccRequest, rsaRequest), (rsaRequest, eccRequest)] {
            var swapped = base
            swapped.endorsementKey.certificate = other.endorsementKey.certificate
            let (c, s) = try challenge(try write(swapped.json(), dir + "/swapped-\(UUID().uuidString).json"), in: dir)
            let answered = try respond(b, c)
            #expect(answered.status == 0, "\(String(decoding: answered.stdout, as: UTF8.self))")
            let refused = try server(["verify", try write(answered.stdout, dir + "/a-\(UUID().uuidString).json"), "--state", s, "--ek-ca", ca], in: dir)
            #expect(refused.status == 3 && refused.stderr.contains("certifies another key than the identity's EK"),
                    "\(base.endorsementKey.type): \(refused.stderr)")
            #expect(FileManager.default.fileExists(atPath: s), "a refused answer leaves the challenge open")
        }

        // P-256 (L-2): its policy session on activation; swtpm made no certificate for it.
        let p256Path = try request(b, endorsementKey: "eccP256")
        let p256: AttestationRequest = try json(p256Path)
        #expect(p256.endorsementKey.type == "eccP256" && p256.endorsementKey.certificate == nil)
        try answerVerifiesOnlyUncertified(b, p256Path, ca: ca, refusal: ["no certificate of the ECC P-256 EK (template L-2)"])

        // An EK type the keychain does not know, in the request or the challenge: UNSUPPORTED.
        var unknown = eccRequest
        unknown.endorsementKey.type = "eccP521"
        let unknownRefused = try server(["challenge", try write(unknown.json(), dir + "/unknown.json"), "--state", dir + "/unknown.state"], in: dir)
        #expect(unknownRefused.status != 0 && unknownRefused.stderr.contains("credentials are made for the EK templates L-1"), "\(unknownRefused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/unknown.state"))
        var otherChallenge = eccChallenge
        otherChallenge.endorsementKey = "eccP521"
        #expect(errorCode(try respond(b, try write(otherChallenge.json(), dir + "/other.json"))) == "UNSUPPORTED")
        // A request calling its RSA EK an ECC one (the public area is not that template's): refused.
        var mislabelled = rsaRequest
        mislabelled.endorsementKey.type = "eccP384"
        let refusedRequest = try server(["challenge", try write(mislabelled.json(), dir + "/mislabelled.json"), "--state", dir + "/m.state"], in: dir)
        #expect(refusedRequest.status != 0 && refusedRequest.stderr.contains("not an ECC P-384 EK (template H-3)"), "\(refusedRequest.stderr)")
    }

    /// Device A's ECC EK paired with device B's AK: B's TPM does not activate it (its P-384 EK is
    /// another key), A refuses a challenge for another AK, and with the name rewritten to A's AK, A's
    /// TPM refuses it too (the credential's HMAC covers B's AK name).
    @Test func aCredentialForOneDevicesECCEKPairedWithAnothersAKIsRefused() throws {
        let a = try Device(), b = try Device()
        try a.tpm.manufacture()
        try b.tpm.manufacture()
        let dir = a.tpm.directory
        let requestA: AttestationRequest = try json(try request(a, endorsementKey: "eccP384"))
        let requestB: AttestationRequest = try json(try request(b, endorsementKey: "eccP384"))
        #expect(requestA.endorsementKey.name != requestB.endorsementKey.name)
        // B's request carrying A's P-384 EK certificate (its chain verifies against A's CA, its key is
        // A's EK): B answers, and the server refuses it with A's CA.
        var borrowed = requestB
        borrowed.endorsementKey.certificate = requestA.endorsementKey.certificate
        let (cb, sb) = try challenge(try write(borrowed.json(), dir + "/borrowed.json"), in: dir)
        let answered = try respond(b, cb)
        #expect(answered.status == 0, "\(String(decoding: answered.stdout, as: UTF8.self))")
        let refusedBorrowed = try server(["verify", try write(answered.stdout, dir + "/borrowed-answer.json"), "--state", sb,
                                          "--ek-ca", try fleetCA(a)], in: dir)
        #expect(refusedBorrowed.status == 3 && refusedBorrowed.stderr.contains("certifies another key than the identity's EK"), "\(refusedBorrowed.stderr)")
        let challengePath = try aForgedPairingIsRefusedByBoth(a, requestA, b, requestB)
        var renamed: AttestationChallenge = try json(challengePath)
        renamed.attestationKeyName = requestA.attestationKey.name
        #expect(errorCode(try respond(a, try write(renamed.json(), dir + "/renamed.json"))) == "AUTHENTICATION_FAILED")
        // The same challenge told to use the RSA EK: that is another key too.
        var rsa: AttestationChallenge = try json(challengePath)
        rsa.endorsementKey = "rsa2048"
        #expect(errorCode(try respond(b, try write(rsa.json(), dir + "/rsa.json"))) == "AUTHENTICATION_FAILED")
    }

    /// tpm2-tools on both sides of an ECC EK: a credential tpm2_makecredential made with no TPM for
    /// the P-384 EK's public area is activated by `attest respond`; our server's challenge for it is
    /// activated by tpm2_activatecredential with our AK (loaded under tpm2_createek's RSA EK) and
    /// tpm2_createek -G ecc384's EK, which is the request's key.
    @Test func anECCEKCredentialInteroperatesWithTpm2MakecredentialAndTpm2Activatecredential() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        let requestPath = try request(b, endorsementKey: "eccP384")
        let eccRequest: AttestationRequest = try json(requestPath)
        try answersAnOfflineMakecredentialChallenge(b, eccRequest, endorsementKey: "eccP384")

        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let made2: AttestationChallenge = try json(challengePath)
        let state: AttestationState = try json(statePath)
        try writeForTpm2Activatecredential(b, made2)
        let script = """
            \(loadOurAKUnderTheRSAEK(dir))
            tpm2_createek -c ecc-ek.ctx -G ecc384 -u tools-ecc-ek.pub
            tpm2_flushcontext -t
            # H-3 has userWithAuth: its empty authValue serves the EK's USER role.
            tpm2_activatecredential -c ak.ctx -C ecc-ek.ctx -i cred.blob -o cred.out
            tpm2_flushcontext -t
            """
        let done = try run("/bin/sh", ["-c", script], environment: b.env)
        #expect(done.status == 0, "\(done.stderr)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/tools-ecc-ek.pub")) == Data(base64Encoded: eccRequest.endorsementKey.publicArea)!,
                "tpm2_createek -G ecc384 made another key than the request's EK")
        #expect(try Data(contentsOf: URL(fileURLWithPath: dir + "/cred.out")).base64EncodedString() == state.credential)
    }
}
