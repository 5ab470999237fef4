import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import SecureMemory
import Testing
import TPM2
import KeychainCLIText

/// Credential activation with two software TPMs as two devices, and a server with no TPM
/// (`attest challenge`, `attest verify`) between them.
@Suite("attestation", .offThePool)
struct AttestationTests: TwoDeviceTest {
    typealias Device = CLIDevice
    typealias Outcome = (status: Int32, stdout: [UInt8], stderr: String)

    /// The server's commands as a server runs them: no TPM in the environment, no store made.
    func server(_ args: [String], in dir: String) throws -> Outcome {
        let nowhere = dir + "/server-has-no-store"
        let out = try run(ctl, ["--store", nowhere, "attest"] + args, input: [],
                          environment: ["KEYCHAIN_TCTI": "", "TPM2TCTI": "", "KEYCHAIN_READER": "none", "XDG_STATE_HOME": dir + "/server-state"])
        #expect(!FileManager.default.fileExists(atPath: nowhere), "the server touched a store (or started a TPM)")
        return out
    }

    func write(_ bytes: some DataProtocol, _ path: String) throws -> String {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        return path
    }

    /// `attest init` then `attest request` on `d` (for the EK `endorsementKey` names, the RSA one by
    /// default): the request's path.
    func request(_ d: Device, endorsementKey: String? = nil) throws -> String {
        let made = try cli(d, ["attest", "init"])
        #expect(made.status == 0, "\(made.stderr)")
        let out = try cli(d, ["attest", "request"] + (endorsementKey.map { ["--endorsement-key", $0] } ?? []))
        #expect(out.status == 0, "\(out.stderr)")
        return try write(out.stdout, d.tpm.directory + "/request-\(UUID().uuidString).json")
    }

    /// A challenge for `request`: its path and the server's state file.
    func challenge(_ request: String, in dir: String) throws -> (challenge: String, state: String) {
        let state = dir + "/state-\(UUID().uuidString).json"
        let out = try server(["challenge", request, "--state", state], in: dir)
        #expect(out.status == 0, "\(out.stderr)")
        return (try write(out.stdout, dir + "/challenge-\(UUID().uuidString).json"), state)
    }

    func respond(_ d: Device, _ challenge: String) throws -> Outcome {
        try cli(d, ["--json", "attest", "respond", challenge])
    }

    /// The CA chain `manufacture()` wrote.
    /// A challenge made with no TPM by `tpm2_makecredential -T none` for the request's EK (its blob: a
    /// header, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET, split into our challenge's two fields) is
    /// answered by the device with the secret it was made with.
    func answersAnOfflineMakecredentialChallenge(_ d: Device, _ request: AttestationRequest, endorsementKey: String? = nil) throws {
        let dir = d.tpm.directory
        _ = try write(Data(base64Encoded: request.endorsementKey.publicArea)!, dir + "/offline-ek.pub")
        let secret = Sodium.randomBytes(32)
        _ = try write(secret, dir + "/secret.bin")
        let made = try run("/usr/bin/tpm2_makecredential", ["-T", "none", "-u", dir + "/offline-ek.pub", "-s", dir + "/secret.bin",
                                                            "-n", request.attestationKey.name, "-o", dir + "/offline.out"])
        #expect(made.status == 0, "\(made.stderr)")
        let blob = [UInt8](try Data(contentsOf: URL(fileURLWithPath: dir + "/offline.out")))
        try #require(blob.count > 12 && blob.prefix(4) == [0xBA, 0xDC, 0xC0, 0xDE])
        let idSize = Int(blob[8]) << 8 | Int(blob[9])
        let theirs = AttestationChallenge(format: AttestationChallenge.formatName, version: 1, attestationKeyName: request.attestationKey.name,
                                          endorsementKey: endorsementKey, credentialBlob: Data(blob[8..<(10 + idSize)]).base64EncodedString(),
                                          secret: Data(blob[(10 + idSize)...]).base64EncodedString(),
                                          nonce: Data(Sodium.randomBytes(32)).base64EncodedString())
        let activated = try respond(d, try write(theirs.json(), dir + "/offline.json"))
        #expect(activated.status == 0, "\(String(decoding: activated.stdout, as: UTF8.self))")
        #expect(try AttestationAnswer(json: Data(activated.stdout)).credential == Data(secret).base64EncodedString())
    }

    func fleetCA(_ d: Device) throws -> String { d.tpm.directory + "/fleet-ca.pem" }

    @Test func theWholeFlowProvesTheCertifiedEKsTPMHoldsTheAKAndTheSRKInThisBootState() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        #expect(try cli(b, ["set", "wifi", "psk", "--accessible", "afterFirstUnlockThisDeviceOnly"], "v").status == 0)
        #expect(try cli(b, ["set", "mail", "password"], "v").status == 0)
        let requestPath = try request(b)
        // A second init keeps the key: the server's enrolment stays valid.
        #expect(String(decoding: try cli(b, ["--json", "attest", "init"]).stdout, as: UTF8.self).contains("\"created\":false"))
        let request = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: requestPath)))
        #expect(request.endorsementKey.certificate != nil, "swtpm_setup --create-ek-cert made one")

        let (challengePath, state) = try challenge(requestPath, in: dir)
        var info = stat()
        #expect(stat(state, &info) == 0 && info.st_mode & 0o777 == 0o600, "the state is the server's secret")
        let answer = try respond(b, challengePath)
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self)) \(answer.stderr)")
        let answerPath = try write(answer.stdout, dir + "/answer.json")
        let verified = try server(["verify", answerPath, "--state", state, "--ek-ca", try fleetCA(b)], in: dir)
        #expect(verified.status == 0, "\(verified.stderr)")
        let identity = try VerifiedIdentity(json: Data(verified.stdout))
        #expect(identity.endorsementCertificateVerified && identity.endorsementKey.name == request.endorsementKey.name)
        #expect(identity.storageRootKey.name == request.storageRootKey.name && identity.attestationKey == request.attestationKey)
        // The boot state is the TPM's own: tpm2_pcrread of the same PCRs.
        let pcrFile = dir + "/pcrs.bin"
        #expect(try run("/usr/bin/tpm2_pcrread", ["sha256:" + request.pcrs.map(String.init).joined(separator: ","), "-o", pcrFile],
                        environment: b.env).status == 0)
        let values = [UInt8](try Data(contentsOf: URL(fileURLWithPath: pcrFile)))
        #expect(identity.bootState.pcrs == request.pcrs && identity.bootState.digest == lowerHex(sha256(values)))
        // The keychain's two wrapping keys, certified, each saying what the TPM enforces on it; the
        // approval index approves the quoted state.
        let keys = try #require(identity.wrappingKeys)
        #expect(keys.map { "\($0.claim.service) \($0.claim.accessible.rawValue)" } == ["mail afterFirstUnlock", "wifi afterFirstUnlockThisDeviceOnly"])
        #expect(keys.allSatisfy { $0.matchesClaim }, "\(keys.map(\.differences))")
        #expect(keys[1].statement.hasSuffix("in the boot state (PCRs 7) the device's approval index approves, on this TPM only")
                && keys[1].approvesVerifiedBootState == true, "\(keys[1].statement)")
        #expect(keys[0].statement.hasSuffix("under the SRK, not fixedTPM (its level moves through backups)"), "\(keys[0].statement)")
        #expect(identity.bootApproval?.approvesQuotedBootState == true && identity.bootApproval?.name == lowerHex(BootApprovalLayout.name))
        // One answer per challenge: the state is gone once it served.
        #expect(!FileManager.default.fileExists(atPath: state))
        #expect(try server(["verify", answerPath, "--state", state], in: dir).status != 0)
    }

    /// `attest challenge`, `respond` and `verify` on `d`: the verified identity's path.
    func verifiedIdentity(_ d: Device) throws -> String {
        let dir = d.tpm.directory
        let (challengePath, state) = try challenge(try request(d), in: dir)
        let answer = try respond(d, challengePath)
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
        let verified = try server(["verify", try write(answer.stdout, dir + "/answer-\(UUID().uuidString).json"), "--state", state,
                                   "--ek-ca", try fleetCA(d)], in: dir)
        #expect(verified.status == 0, "\(verified.stderr)")
        return try write(verified.stdout, dir + "/verified-\(UUID().uuidString).json")
    }

    /// seal-for as the server runs it (no TPM, no store), the value on stdin.
    func sealFor(_ identity: String, _ args: [String], _ value: String, in dir: String) throws -> Outcome {
        let nowhere = dir + "/server-has-no-store"
        let out = try run(ctl, ["--store", nowhere, "seal-for", identity] + args, input: Array(value.utf8),
                          environment: ["KEYCHAIN_TCTI": "", "TPM2TCTI": "", "KEYCHAIN_READER": "none"])
        #expect(!FileManager.default.fileExists(atPath: nowhere), "seal-for touched a store (or started a TPM)")
        return out
    }

    /// seal-for with the identity `attest verify` wrote: an SRK bundle for the SRK the server proved
    /// is in that EK's TPM, which imports there and nowhere else; a device's own identity needs
    /// --unattested-srk for that, and the bundle says which it was.
    @Test func aBundleSealedForTheVerifiedIdentityImportsOnThatDeviceOnly() throws {
        let a = try Device(), b = try Device()
        try a.tpm.manufacture()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        let verifiedB = try verifiedIdentity(b)
        for args in [["--parent", "srk"], ["--parent", "srk", "--accessible", "whenUnlockedThisDeviceOnly", "--access-control", "passcode"], []] {
            let sealed = try sealFor(verifiedB, ["svc", "k\(args.count)"] + args, "for-b-\(args.count)", in: dir)
            #expect(sealed.status == 0, "\(args): \(sealed.stderr)")
            let bundle = try ProvisioningBundle(json: Data(sealed.stdout))
            #expect(bundle.attested == true && bundle.parent == (args.isEmpty ? "ek-rsa2048" : "srk"), "\(args)")
        }
        let bundlePath = try write(try sealFor(verifiedB, ["svc", "key", "--parent", "srk"], "only-b", in: dir).stdout, dir + "/b.bundle")
        let bundle = try ProvisioningBundle(json: Data(contentsOf: URL(fileURLWithPath: bundlePath)))
        let requestB = try AttestationRequest(json: try Data(contentsOf: URL(fileURLWithPath: request(b))))
        #expect(bundle.target == requestB.storageRootKey.name)

        // The same bundle on another swtpm: refused by name, and with the name rewritten to A's SRK, by A's TPM.
        let onA = try cli(a, ["--json", "import", bundlePath])
        #expect(errorCode(onA) == "INVALID_ARGUMENT" && String(decoding: onA.stdout, as: UTF8.self).contains("another device's TPM"),
                "\(String(decoding: onA.stdout, as: UTF8.self))")
        var retargeted = bundle
        retargeted.target = try AttestationRequest(json: try Data(contentsOf: URL(fileURLWithPath: request(a)))).storageRootKey.name
        let forged = try cli(a, ["--json", "import", try write(retargeted.json(), dir + "/retargeted.bundle")])
        #expect(errorCode(forged) == "DATA_CORRUPTED" && String(decoding: forged.stdout, as: UTF8.self).contains("TPM refused"),
                "\(String(decoding: forged.stdout, as: UTF8.self))")
        #expect(try cli(a, ["get", "svc", "key"]).status != 0, "nothing was stored on A")
        // On B it imports, and is the value sealed.
        #expect(try cli(b, ["import", bundlePath]).status == 0)
        #expect(try text(b, ["get", "svc", "key"]) == "only-b")

        // A device's own identity: an SRK bundle needs --unattested-srk, and says so; its mark cannot be changed.
        let plainB = dir + "/identity.json"
        #expect(try cli(b, ["identity", "--out", plainB]).status == 0)
        let refused = try sealFor(plainB, ["--json", "svc", "plain", "--parent", "srk"], "v", in: dir)
        #expect(errorCode(refused) == "INVALID_ARGUMENT" && String(decoding: refused.stdout, as: UTF8.self).contains("--unattested-srk"),
                "\(String(decoding: refused.stdout, as: UTF8.self))")
        let unattested = try sealFor(plainB, ["svc", "plain", "--parent", "srk", "--unattested-srk"], "plain-b", in: dir)
        var plainBundle = try ProvisioningBundle(json: Data(unattested.stdout))
        #expect(plainBundle.attested == false)
        #expect(try ProvisioningBundle(json: Data(try sealFor(plainB, ["svc", "ek"], "v", in: dir).stdout)).attested == nil,
                "an EK bundle from an identity is as before")
        plainBundle.attested = true
        let relabelled = try cli(b, ["--json", "import", try write(plainBundle.json(), dir + "/relabelled.bundle")])
        #expect(errorCode(relabelled) == "DATA_CORRUPTED", "\(String(decoding: relabelled.stdout, as: UTF8.self))")
        #expect(try cli(b, ["import", try write(unattested.stdout, dir + "/plain.bundle")]).status == 0)
        #expect(try text(b, ["get", "svc", "plain"]) == "plain-b")
    }

    /// Device A's EK paired with device B's AK: the credential is sealed to A's EK, so B's TPM cannot
    /// activate it, and A has no such AK (nor would its TPM activate for another key's name).
    @Test func aRequestPairingOneDevicesEKWithAnothersKeysIsRefused() throws {
        let a = try Device(), b = try Device()
        let dir = a.tpm.directory
        let requestA = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: try request(a))))
        let requestB = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: try request(b))))
        let challengePath = try aForgedPairingIsRefusedByBoth(a, requestA, b, requestB)
        // With the challenge's AK name rewritten to A's, A's TPM itself refuses: the credential names B's AK.
        var renamed = try AttestationChallenge(json: Data(contentsOf: URL(fileURLWithPath: challengePath)))
        renamed.attestationKeyName = requestA.attestationKey.name
        #expect(errorCode(try respond(a, try write(renamed.json(), dir + "/renamed.json"))) == "AUTHENTICATION_FAILED")

        // A's EK and AK with B's SRK: A answers, and its certification names A's SRK, not the request's.
        var srkSwapped = requestA
        srkSwapped.storageRootKey = requestB.storageRootKey
        let (c2, state2) = try challenge(try write(srkSwapped.json(), dir + "/srk-swapped.json"), in: dir)
        let answer = try respond(a, c2)
        #expect(answer.status == 0)
        let refused = try server(["verify", try write(answer.stdout, dir + "/a2.json"), "--state", state2], in: dir)
        #expect(refused.status == 3 && refused.stderr.contains("not the request's SRK"), "\(refused.stderr)")
    }

    /// The answer's wrapping keys and approval index are checked as `verify-key` checks a key: device
    /// A's answer carrying device B's certified keys or B's approval index, a certification changed by
    /// one byte, a key's public area swapped, a movable key relabelled ThisDeviceOnly (its public area,
    /// certified by the TPM, lacks fixedTPM), the approval certification or the key list left out: refused.
    /// A key relabelled with another movable level verifies and is reported as not matching; a boot
    /// state the index does not approve is reported.
    @Test func anAnswerCarryingAnotherDevicesKeysOrATamperedCertificationIsRefused() throws {
        let a = try Device(), b = try Device()
        let dir = a.tpm.directory
        func answered(_ d: Device) throws -> (AttestationAnswer, AttestationState) {
            #expect(try cli(d, ["set", "wifi", "psk", "--accessible", "afterFirstUnlockThisDeviceOnly"], "v").status == 0)
            #expect(try cli(d, ["set", "mail", "password"], "v").status == 0)
            let (challengePath, statePath) = try challenge(try request(d), in: d.tpm.directory)
            let answer = try respond(d, challengePath)
            #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
            return (try AttestationAnswer(json: Data(answer.stdout)), try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath))))
        }
        let (answerA, stateA) = try answered(a)
        let (answerB, _) = try answered(b)
        let keysA = try #require(answerA.wrappingKeys), keysB = try #require(answerB.wrappingKeys)
        #expect(keysA.map(\.protection) == ["afterFirstUnlock/none", "afterFirstUnlockThisDeviceOnly/none"])
        #expect(try AttestationServer.verify(answerA, state: stateA, ekCA: nil).wrappingKeys?.count == 2)
        func refusal(_ change: (inout AttestationAnswer) -> Void) -> String {
            var bad = answerA
            change(&bad)
            do { _ = try AttestationServer.verify(bad, state: stateA, ekCA: nil); return "verified" } catch {
                return error.code == .authenticationFailed ? error.message : "\(error.code): \(error.message)"
            }
        }
        func base64(_ s: String, _ change: ([UInt8]) -> [UInt8]) -> String { Data(change([UInt8](Data(base64Encoded: s)!))).base64EncodedString() }

        let bsKeys = refusal { $0.wrappingKeys = keysB }
        #expect(bsKeys.contains("wrapping key of 'mail'") && bsKeys.contains("does not verify with the attestation key"), "\(bsKeys)")
        let bsApproval = refusal { $0.bootApprovalCertification = answerB.bootApprovalCertification }
        #expect(bsApproval.contains("does not verify with the attestation key"), "\(bsApproval)")
        let flipped = refusal { $0.wrappingKeys![1].creationCertification.attest = base64(keysA[1].creationCertification.attest) { var b = $0; b[b.count - 5] ^= 1; return b } }
        #expect(flipped.contains("wrapping key of 'wifi'") && flipped.contains("does not verify"), "\(flipped)")
        let swapped = refusal { $0.wrappingKeys![1].publicArea = keysB[1].publicArea }
        #expect(swapped.contains("not the one whose public area"), "\(swapped)")
        let unfixed = refusal { $0.wrappingKeys![0].protection = "afterFirstUnlockThisDeviceOnly/none" }
        #expect(unfixed.contains("lacks fixedTPM or fixedParent"), "\(unfixed)")
        let noApproval = refusal { $0.bootApprovalCertification = nil }
        #expect(noApproval.contains("no certification of the approval index"), "\(noApproval)")
        let noKeys = refusal { $0.wrappingKeys = nil }
        #expect(noKeys.contains("no certification of the keychain's wrapping keys"), "\(noKeys)")

        var relabelled = answerA
        relabelled.wrappingKeys![0].protection = "whenUnlocked/none"
        let report = try #require(try AttestationServer.verify(relabelled, state: stateA, ekCA: nil).wrappingKeys?[0])
        #expect(!report.matchesClaim && report.differences.contains { $0.contains("the claim is whenUnlocked") }, "\(report.differences)")

        // Another boot state: the index still approves the old one, and the identity says so.
        #expect(try run("/usr/bin/tpm2_pcrextend", ["7:sha256=" + String(repeating: "5a", count: 32)], environment: a.env).status == 0)
        let (challengePath, statePath) = try challenge(try request(a), in: dir)
        let later = try respond(a, challengePath)
        let identity = try AttestationServer.verify(try AttestationAnswer(json: Data(later.stdout)),
                                                    state: try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath))), ekCA: nil)
        #expect(identity.bootApproval?.approvesQuotedBootState == false && identity.bootApproval?.statement.contains("do not open") == true)
        #expect(identity.wrappingKeys?[1].approvesVerifiedBootState == false)
    }

    @Test func aReplayedAnswerIsRefused() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let (c1, s1) = try challenge(requestPath, in: dir)
        let first = try write(try respond(b, c1).stdout, dir + "/first.json")
        #expect(try server(["verify", first, "--state", s1], in: dir).status == 0)

        let (_, s2) = try challenge(requestPath, in: dir)
        let replayed = try server(["verify", first, "--state", s2], in: dir)
        #expect(replayed.status == 3 && replayed.stderr.contains("another nonce"), "\(replayed.stderr)")
        // The old answer with the new nonce written in: the signed statements are over the old one,
        // and the credential is the old challenge's.
        var relabelled = try AttestationAnswer(json: Data(contentsOf: URL(fileURLWithPath: first)))
        relabelled.nonce = try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: s2))).nonce
        let forged = try server(["verify", try write(relabelled.json(), dir + "/relabelled.json"), "--state", s2], in: dir)
        #expect(forged.status == 3 && forged.stderr.contains("AUTHENTICATION_FAILED"), "\(forged.stderr)")
        #expect(FileManager.default.fileExists(atPath: s2), "a refused answer leaves the challenge open")
    }

    /// A quote made in another boot state shows its PCR values and is refused against the expected one.
    @Test func anAnswerFromAnotherBootStateIsRefusedAgainstTheExpectedOne() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let request = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: requestPath)))
        let (c1, s1) = try challenge(requestPath, in: dir)
        let good = try server(["verify", try write(try respond(b, c1).stdout, dir + "/good.json"), "--state", s1], in: dir)
        let goodPath = try write(good.stdout, dir + "/good-boot.verified.json")
        // The same boot: accepted against itself.
        let (c2, s2) = try challenge(requestPath, in: dir)
        let same = try server(["verify", try write(try respond(b, c2).stdout, dir + "/same.json"), "--state", s2,
                               "--expect-boot-state", goodPath], in: dir)
        #expect(same.status == 0, "\(same.stderr)")
        // Another boot: the first selected PCR extended.
        let pcr = request.pcrs[0]
        #expect(try run("/usr/bin/tpm2_pcrextend", ["\(pcr):sha256=" + String(repeating: "5a", count: 32)], environment: b.env).status == 0)
        let (c3, s3) = try challenge(requestPath, in: dir)
        let otherAnswer = try write(try respond(b, c3).stdout, dir + "/other.json")
        let refused = try server(["verify", otherAnswer, "--state", s3, "--expect-boot-state", goodPath], in: dir)
        let expected = try VerifiedIdentity(json: Data(contentsOf: URL(fileURLWithPath: goodPath))).bootState.values[String(pcr)]!
        #expect(refused.status == 3 && refused.stderr.contains("another boot state: PCR \(pcr) is ") && refused.stderr.contains("(expected \(expected))"),
                "\(refused.stderr)")
        // Without an expectation it verifies, and the document shows the new values.
        let shown = try server(["verify", otherAnswer, "--state", s3], in: dir)
        #expect(shown.status == 0, "\(shown.stderr)")
        let shownValue = try VerifiedIdentity(json: Data(shown.stdout)).bootState.values[String(pcr)]
        #expect(shownValue != nil && shownValue != expected)
    }

    /// Verifiers no one here wrote: tpm2_checkquote on the quote, tpm2_makecredential's challenge answered.
    @Test func theQuoteChecksWithTpm2ToolsAndTheirCredentialIsActivated() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let request = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: requestPath)))
        let (c1, state) = try challenge(requestPath, in: dir)
        let answer = try AttestationAnswer(json: Data(try respond(b, c1).stdout))
        let nonce = [UInt8](Data(base64Encoded: answer.nonce)!)
        _ = try write(Data(base64Encoded: request.attestationKey.publicArea)!, dir + "/ak.pub")
        _ = try write(Data(base64Encoded: answer.quote.attest)!, dir + "/quote.msg")
        _ = try write(Data(base64Encoded: answer.quote.signature)!, dir + "/quote.sig")
        _ = try write(request.pcrs.flatMap { hexBytes(answer.pcrValues[String($0)]!) }, dir + "/quote.pcrs")
        let list = "sha256:" + request.pcrs.map(String.init).joined(separator: ",")
        let checked = try run("/usr/bin/tpm2_checkquote", ["-u", dir + "/ak.pub", "-m", dir + "/quote.msg", "-s", dir + "/quote.sig",
                                                           "-f", dir + "/quote.pcrs", "-l", list, "-g", "sha256", "-q", lowerHex(nonce)])
        #expect(checked.status == 0, "\(checked.stderr)")
        // The same check with another nonce fails: tpm2_checkquote does look at it.
        #expect(try run("/usr/bin/tpm2_checkquote", ["-u", dir + "/ak.pub", "-m", dir + "/quote.msg", "-s", dir + "/quote.sig",
                                                     "-q", lowerHex(Array(nonce.reversed()))]).status != 0)
        _ = state

        // tpm2_makecredential with no TPM: its blob (header, TPM2B_ID_OBJECT, TPM2B_ENCRYPTED_SECRET) as our challenge.
        try answersAnOfflineMakecredentialChallenge(b, request)
    }

    /// `attest key` and `verify-key` of each of the six access controls at two levels: the verifier
    /// says in words what the TPM enforces (docs/security.md's table), and for ThisDeviceOnly that the
    /// certified approval index approves the verified boot state. Refused: another nonce, another
    /// device's AK, a key claimed ThisDeviceOnly whose public area lacks fixedTPM. Reported as not
    /// matching: a key whose stored policy was edited.
    @Test func keyAttestationSaysWhatTheTPMEnforcesOnEachProtection() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        #expect(try cli(b, ["passcode", "set"], "2468\n").status == 0)
        #expect(try cli(b, ["reader", "enroll", "thumb"], "2468\n").status == 0)
        let identityPath = try verifiedIdentity(b)
        let nonce = lowerHex(Sodium.randomBytes(32))
        func attest(_ service: String, _ level: Accessible, _ control: AccessControl, nonce: String = nonce) throws -> Outcome {
            try cli(b, ["--json", "attest", "key", service, "--accessible", level.rawValue, "--access-control", control.rawValue, "--nonce", nonce])
        }
        func verify(_ attestation: [UInt8], nonce: String = nonce, identity: String? = nil) throws -> Outcome {
            try server(["verify-key", try write(attestation, dir + "/key-\(UUID().uuidString).json"), "--identity", identity ?? identityPath,
                        "--nonce", nonce], in: dir)
        }
        let words: [AccessControl: [String]] = [
            .none: [], .passcode: ["only with the device passcode", "until the passcode is removed"],
            .biometryAny: ["only with a finger enrolled on the reader", "until the passcode is removed"],
            .biometryCurrentSet: ["only with a finger of the enrollment set it was made with on the reader"],
            .biometryAnyOrPasscode: ["only with a finger enrolled on the reader", "or the device passcode"],
            .biometryCurrentSetOrPasscode: ["a finger of the enrollment set it was made with", "or the device passcode"],
        ]
        for level in [Accessible.whenUnlocked, .whenUnlockedThisDeviceOnly] {
            for control in AccessControl.allCases {
                let service = "svc-\(control.rawValue)"
                #expect(try cli(b, ["set", service, level.rawValue, "--accessible", level.rawValue, "--access-control", control.rawValue],
                                "v").status == 0, "\(level) \(control)")
                let made = try attest(service, level, control)
                #expect(made.status == 0, "\(level) \(control): \(String(decoding: made.stdout, as: UTF8.self))")
                let verified = try verify(made.stdout)
                #expect(verified.status == 0, "\(level) \(control): \(verified.stderr) \(String(decoding: verified.stdout, as: UTF8.self))")
                let report = try KeyAttestationReport(json: Data(verified.stdout))
                #expect(report.matchesClaim && report.differences.isEmpty, "\(level) \(control): \(report.differences)")
                var expected = words[control]! + ["while the device is unlocked"]
                expected.append(level.isThisDeviceOnly ? "on this TPM only" : "not fixedTPM")
                if level.isThisDeviceOnly { expected.append("the device's approval index approves") }
                for phrase in expected { #expect(report.statement.contains(phrase), "\(level) \(control): '\(phrase)' not in '\(report.statement)'") }
                if control == .none { #expect(!report.statement.contains("only with"), "\(report.statement)") }
                #expect(report.approvesVerifiedBootState == (level.isThisDeviceOnly ? true : nil))
                print("\(level.rawValue)/\(control.rawValue): \(report.statement)")
            }
        }
        // Another nonce: a replayed statement.
        let passcodeKey = try attest("svc-passcode", .whenUnlocked, .passcode)
        let replayed = try verify(passcodeKey.stdout, nonce: lowerHex(Sodium.randomBytes(32)))
        #expect(replayed.status == 3 && replayed.stderr.contains("another nonce"), "\(replayed.stderr)")
        // Another device's AK: the statement is not the verified identity's.
        let a = try Device()
        try a.tpm.manufacture()
        #expect(try cli(a, ["passcode", "set"], "1357\n").status == 0)
        #expect(try cli(a, ["set", "svc-passcode", "k", "--accessible", "whenUnlocked", "--access-control", "passcode"], "v").status == 0)
        let onA = try verifiedIdentity(a)
        let fromA = try cli(a, ["--json", "attest", "key", "svc-passcode", "--accessible", "whenUnlocked", "--access-control", "passcode", "--nonce", nonce])
        #expect(try verify(fromA.stdout, identity: onA).status == 0)
        let foreign = try verify(fromA.stdout)
        #expect(foreign.status == 3 && foreign.stderr.contains("another attestation key"), "\(foreign.stderr)")
        // A whenUnlocked key (not fixedTPM) claimed ThisDeviceOnly: refused.
        var claimed = try KeyAttestation(json: Data(try attest("svc-none", .whenUnlocked, .none).stdout))
        claimed.claim.accessible = .whenUnlockedThisDeviceOnly
        let unfixed = try verify(Array(claimed.json()))
        #expect(unfixed.status == 3 && unfixed.stderr.contains("lacks fixedTPM"), "\(unfixed.stderr)")
        // The stored policy of the passcode key edited (its passcode branch's policyRef): reported, exit status 3.
        let edit = try run("/usr/bin/python3", ["-c", """
            import json, sqlite3, sys
            c = sqlite3.connect(sys.argv[1])
            (policy,) = c.execute("SELECT policy FROM wrapping_keys WHERE protection = 'whenUnlocked/passcode/0' AND service LIKE '%svc-passcode'").fetchone()
            p = json.loads(bytes(policy)); p['keyRef'][0] ^= 1
            c.execute("UPDATE wrapping_keys SET policy = ? WHERE protection = 'whenUnlocked/passcode/0' AND service LIKE '%svc-passcode'", (json.dumps(p).encode(),))
            c.commit()
            """, b.store + "/keychain.db"])
        #expect(edit.status == 0, "\(edit.stderr)")
        let edited = try attest("svc-passcode", .whenUnlocked, .passcode)
        #expect(edited.status == 0, "\(String(decoding: edited.stdout, as: UTF8.self))")
        let mismatch = try verify(edited.stdout)
        let report = try KeyAttestationReport(json: Data(mismatch.stdout))
        #expect(mismatch.status == 3 && !report.matchesClaim && report.enforced.isEmpty
                && report.differences.contains { $0.contains("authPolicy is not the digest") }, "\(report.differences)")
    }

    /// A TPM whose maker certified only an ECC EK (the RSA EK's certificate index removed): the AK is
    /// still made under the RSA EK (template L-1, derived from the endorsement seed), the request
    /// carries no certificate, `verify --ek-ca` is refused naming the RSA EK and how to go on, and
    /// without the CA the identity verifies as uncertified.
    @Test func aTPMWithOnlyAnECCEKCertificateVerifiesOnlyAsUncertified() throws {
        let b = try Device()
        let ca = try b.tpm.manufacture()
        let removed = try run("/usr/bin/tpm2_nvundefine", ["-C", "p", "0x01c00002"], environment: b.env)
        #expect(removed.status == 0, "\(removed.stderr)")
        let remaining = try run("/usr/bin/tpm2_getcap", ["handles-nv-index"], environment: b.env)
        #expect(!String(decoding: remaining.stdout, as: UTF8.self).lowercased().contains("0x1c00002")
                && String(decoding: remaining.stdout, as: UTF8.self).lowercased().contains("0x1c000"), "an ECC EK certificate is left")
        let requestPath = try request(b)
        #expect(try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: requestPath))).endorsementKey.certificate == nil)
        try answerVerifiesOnlyUncertified(b, requestPath, ca: ca, refusal: ["no certificate of the RSA EK", "without --ek-ca"])
    }

    /// A challenge for A's EK made for B's AK (the request's AK swapped): B's TPM cannot activate it,
    /// and A has no such AK. Returns the challenge's path, for more tries.
    func aForgedPairingIsRefusedByBoth(_ a: Device, _ requestA: AttestationRequest, _ b: Device, _ requestB: AttestationRequest) throws -> String {
        let dir = a.tpm.directory
        var forged = requestA
        forged.attestationKey = requestB.attestationKey
        let (challengePath, _) = try challenge(try write(forged.json(), dir + "/forged.json"), in: dir)
        let onB = try respond(b, challengePath)
        #expect(errorCode(onB) == "AUTHENTICATION_FAILED" && String(decoding: onB.stdout, as: UTF8.self).contains("refused to activate"),
                "\(String(decoding: onB.stdout, as: UTF8.self))")
        let onA = try respond(a, challengePath)
        #expect(errorCode(onA) == "INVALID_ARGUMENT", "\(String(decoding: onA.stdout, as: UTF8.self))")
        return challengePath
    }

    /// The answer to a request whose EK has no certificate: `verify --ek-ca` refuses it with each of
    /// `refusal` in its message, and `verify` without `--ek-ca` gives an identity whose EK is uncertified.
    func answerVerifiesOnlyUncertified(_ d: Device, _ requestPath: String, ca: String, refusal: [String]) throws {
        let dir = d.tpm.directory
        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let answer = try respond(d, challengePath)
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
        let answerPath = try write(answer.stdout, dir + "/uncertified-answer.json")
        try FileManager.default.copyItem(atPath: statePath, toPath: statePath + ".kept")
        let refused = try server(["verify", answerPath, "--state", statePath, "--ek-ca", ca], in: dir)
        #expect(refused.status == 3 && refusal.allSatisfy { refused.stderr.contains($0) }, "\(refused.stderr)")
        let uncertified = try server(["verify", answerPath, "--state", statePath + ".kept"], in: dir)
        #expect(uncertified.status == 0, "\(uncertified.stderr)")
        #expect(try !VerifiedIdentity(json: Data(uncertified.stdout)).endorsementCertificateVerified)
    }

    /// `attest key` through keychaind (an appliance's daemon owns the store): the administrator makes
    /// the AK and proves the device where the store is (`--direct`); a user's `keychainctl attest key`
    /// through the daemon certifies the wrapping key of that user's own items, with the daemon's AK.
    /// `nobody` (setpriv) attests its own "mail" (the store's `uid:65534/mail` key, not root's
    /// `uid:0/mail`), gets INVALID_ARGUMENT for a service only root has, and a raw request naming
    /// `uid:0/mail` reaches nobody's own (absent) key, never root's.
    @Test func keyAttestationThroughKeychaindIsOfTheCallersOwnKey() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm)
        let dir = tpm.directory
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let nobody: UInt32 = 65534
        func direct(_ args: [String]) throws -> Outcome { try run(ctl, ["--store", daemon.store, "--tcti", tpm.tcti] + args) }
        func through(_ args: [String], _ input: String = "", uid: UInt32? = nil) throws -> Outcome {
            let prefix = uid.map { ["--reuid=\($0)", "--regid=\($0)", "--clear-groups", keychainctl] } ?? []
            return try run(uid == nil ? keychainctl : "/usr/bin/setpriv", prefix + args, input: Array(input.utf8), environment: daemon.environment)
        }
        #expect(try through(["set", "mail", "k"], "root's").status == 0)
        #expect(try through(["set", "bank", "k"], "root's").status == 0)
        #expect(try through(["set", "mail", "k"], "nobody's", uid: nobody).status == 0)
        let nonce = lowerHex(Sodium.randomBytes(32))
        // Before the administrator made the AK: the daemon says so.
        let early = try through(["--json", "attest", "key", "mail", "--nonce", nonce], uid: nobody)
        #expect(errorCode(early) == "INVALID_ARGUMENT" && String(decoding: early.stdout, as: UTF8.self).contains("attest init"),
                "\(String(decoding: early.stdout, as: UTF8.self))")
        // The administrator, where the store is: the AK, and the device proved to the server.
        #expect(try direct(["attest", "init"]).status == 0)
        let requestPath = try write(try direct(["attest", "request"]).stdout, dir + "/request.json")
        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let answer = try direct(["--json", "attest", "respond", challengePath])
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
        let verified = try server(["verify", try write(answer.stdout, dir + "/answer.json"), "--state", statePath], in: dir)
        #expect(verified.status == 0, "\(verified.stderr)")
        let identityPath = try write(verified.stdout, dir + "/identity.json")
        // A service only root has: nobody has no key of it.
        let rootOnly = try through(["--json", "attest", "key", "bank", "--nonce", nonce], uid: nobody)
        #expect(errorCode(rootOnly) == "INVALID_ARGUMENT" && String(decoding: rootOnly.stdout, as: UTF8.self).contains("has no key"),
                "\(String(decoding: rootOnly.stdout, as: UTF8.self))")
        // A raw request (a client we did not write) naming root's scope in the service: nobody's own name space.
        let script = rawWireClient + """
            body = bytes([V, \(WireOp.attestKey.rawValue)]) + field(1, options('uid:0/bank')) + field(\(WireTag.nonce), bytes.fromhex(sys.argv[2]))
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
            reply = request(s, body)
            sys.stdout.write(json.dumps({'kind': reply[1], 'fields': fields(reply)}))
            """
        let raw = try run("/usr/bin/setpriv", ["--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups",
                                               "/usr/bin/python3", "-c", script, daemon.socket, nonce])
        #expect(raw.status == 0, "\(raw.stderr)")
        let rawReply = try #require(try JSONSerialization.jsonObject(with: Data(raw.stdout)) as? [String: Any])
        let rawFields = rawReply["fields"] as? [String: String] ?? [:]
        #expect(rawReply["kind"] as? Int == Int(WireKind.error) && rawFields["30"] == "INVALID_ARGUMENT"
                && rawFields["31"]?.contains("has no key") == true, "\(rawReply)")
        #expect(rawFields["20"] == nil, "no statement of root's key went to nobody")
        // nobody's own key, through the daemon, certified by the daemon's AK.
        let made = try through(["--json", "attest", "key", "mail", "--nonce", nonce], uid: nobody)
        #expect(made.status == 0, "\(String(decoding: made.stdout, as: UTF8.self)) \(made.stderr)")
        let attestation = try KeyAttestation(json: Data(made.stdout))
        let store = try Store(directory: daemon.store)
        let nobodys = try #require(try store.wrappingKey(service: "uid:\(nobody)/mail", protection: "afterFirstUnlock/none"))
        let roots = try #require(try store.wrappingKey(service: "uid:0/mail", protection: "afterFirstUnlock/none"))
        #expect(attestation.publicArea == Data(nobodys.sealedPublic).base64EncodedString(), "the statement is of nobody's key")
        #expect(attestation.publicArea != Data(roots.sealedPublic).base64EncodedString())
        #expect(attestation.claim.service == "mail")
        let report = try server(["verify-key", try write(made.stdout, dir + "/key.json"), "--identity", identityPath, "--nonce", nonce], in: dir)
        #expect(report.status == 0, "\(report.stderr)")
        #expect(try KeyAttestationReport(json: Data(report.stdout)).matchesClaim)
    }

    /// The key attestation's parser and verifier given changed statements: each field cut, emptied,
    /// grown or changed, and random bytes in the certified statement: a clear KeychainError or a
    /// report that does not match, never a crash, never a matching report.
    @Test func hostileKeyAttestationsGetAClearErrorNeverAMatchingReport() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let identity = try VerifiedIdentity(json: Data(contentsOf: URL(fileURLWithPath: try verifiedIdentity(b))))
        #expect(try cli(b, ["set", "svc", "k", "--accessible", "whenUnlockedThisDeviceOnly"], "v").status == 0)
        let nonce = Sodium.randomBytes(32)
        let made = try cli(b, ["--json", "attest", "key", "svc", "--accessible", "whenUnlockedThisDeviceOnly", "--nonce", lowerHex(nonce)])
        let good = try KeyAttestation(json: Data(made.stdout))
        #expect(try AttestationServer.verifyKey(good, identity: identity, nonce: nonce).matchesClaim)
        /// nil for a clear refusal or a report that does not match; the code otherwise.
        func outcome(_ a: KeyAttestation) -> String? {
            do { return try AttestationServer.verifyKey(a, identity: identity, nonce: nonce).matchesClaim ? "MATCHES" : nil } catch {
                let code = error.code
                return code == .authenticationFailed || code == .dataCorrupted ? nil : "\(error)"
            }
        }
        func base64(_ s: String, _ change: ([UInt8]) -> [UInt8]) -> String { Data(change([UInt8](Data(base64Encoded: s)!))).base64EncodedString() }
        let changes: [([UInt8]) -> [UInt8]] = [{ Array($0.prefix($0.count / 2)) }, { _ in [] }, { $0 + [UInt8](repeating: 0, count: 5_000) },
                                               { var b = $0; b[b.count / 3] ^= 0x40; return b }, { var b = $0; b[b.count - 1] ^= 0x01; return b }]
        for (n, change) in changes.enumerated() {
            for field in 0..<7 {
                var bad = good
                switch field {
                case 0: bad.publicArea = base64(good.publicArea, change)
                case 1: bad.policy = base64(good.policy, change)
                case 2: bad.creationData = base64(good.creationData, change)
                case 3: bad.creationCertification.attest = base64(good.creationCertification.attest, change)
                case 4: bad.creationCertification.signature = base64(good.creationCertification.signature, change)
                case 5: bad.bootApprovalCertification!.attest = base64(good.bootApprovalCertification!.attest, change)
                default: bad.bootApprovalCertification!.signature = base64(good.bootApprovalCertification!.signature, change)
                }
                #expect(outcome(bad) == nil, "change \(n) of field \(field)")
            }
        }
        // Each field of the policy renamed (a name this version does not know): before, an optional one that
        // is not in the digest (`keyRef`, `creation`) was read as absent and the key matched its claim.
        let policyText = String(decoding: Data(base64Encoded: good.policy)!, as: UTF8.self)
        for field in ["availability", "pcrs", "pcrDigest", "bootApprovalName", "bootVendorKeyName", "passcodeEpoch", "stateName",
                      "biometry", "passcode", "keyRef", "authValidity", "creation"] where policyText.contains("\"\(field)\":") {
            var renamed = good
            renamed.policy = Data(policyText.replacingOccurrences(of: "\"\(field)\":", with: "\"\(field)_\":").utf8).base64EncodedString()
            #expect(outcome(renamed) == nil, "the policy's \(field) renamed")
        }
        // The two statements swapped, the approval left out, the documents' JSON cut.
        var swapped = good
        (swapped.creationCertification, swapped.bootApprovalCertification) = (good.bootApprovalCertification!, good.creationCertification)
        #expect(outcome(swapped) == nil)
        var without = good
        without.bootApprovalCertification = nil
        #expect(outcome(without) == nil)
        let json = good.json()
        for cut in [0, 1, json.count / 2, json.count - 2] {
            #expect(throws: KeychainError.self) { _ = try KeyAttestation(json: json.prefix(cut)) }
        }
        // Random bytes in the certified statement.
        var rng = SystemRandomNumberGenerator()
        let attest = [UInt8](Data(base64Encoded: good.creationCertification.attest)!)
        for _ in 0..<200 {
            var bytes = attest
            bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            guard bytes != attest else { continue }
            var bad = good
            bad.creationCertification.attest = Data(bytes).base64EncodedString()
            #expect(outcome(bad) == nil)
        }
    }

    /// The server's state copied before `attest verify` and put back after it: the copy is the same
    /// document, but the challenge was spent in the verifier's ledger, so the same answer does not
    /// verify twice. A state whose challenge another verifier's ledger never opened does not verify
    /// either, and a refused answer spends nothing.
    @Test func aKeptCopyOfTheServersStateDoesNotVerifyTheSameAnswerTwice() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let (challengePath, state) = try challenge(requestPath, in: dir)
        let answer = try write(try respond(b, challengePath).stdout, dir + "/answer.json")
        let kept = try Data(contentsOf: URL(fileURLWithPath: state))
        let first = try server(["verify", answer, "--state", state], in: dir)
        #expect(first.status == 0, "\(first.stderr)")
        try kept.write(to: URL(fileURLWithPath: state))
        let replayed = try server(["verify", answer, "--state", state], in: dir)
        #expect(replayed.status == 3 && replayed.stderr.contains("AUTHENTICATION_FAILED")
                && replayed.stderr.contains("not open in the attestation ledger"), "\(replayed.stderr)")
        #expect(replayed.stdout.isEmpty)

        let (c2, s2) = try challenge(requestPath, in: dir)
        let a2 = try write(try respond(b, c2).stdout, dir + "/a2.json")
        let elsewhere = try server(["verify", a2, "--state", s2, "--ledger", dir + "/another-verifier"], in: dir)
        #expect(elsewhere.status == 3 && elsewhere.stderr.contains("not open in the attestation ledger"), "\(elsewhere.stderr)")
        #expect(try server(["verify", a2, "--state", s2], in: dir).status == 0)
    }

    /// A software key dressed as the AK: its public area made by TPM2_LoadExternal (public part only,
    /// which takes fixedTPM) on the device's TPM, put in the device's request in place of its AK.
    /// With adminWithPolicy and an authPolicy anyone satisfies (PolicyCommandCode ActivateCredential),
    /// `attest challenge` refuses it naming what differs from the AK template; with the template's own
    /// attributes the public area cannot tell, and the TPM refuses to activate the credential for it
    /// (TPM_RC_AUTH_UNAVAILABLE: a public-only object has no authValue).
    @Test func aSoftwareKeyDressedAsTheAttestationKeyIsRefused() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let request = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: try request(b))))
        func forged(_ attributes: String, policy: Bool) throws -> String {
            let script = """
                set -e
                cd '\(dir)'
                rm -f forged.ctx forged.pub forged.name policy.dat
                [ -f soft.pem ] || openssl genrsa -out soft.pem 2048 2>/dev/null
                openssl rsa -in soft.pem -pubout -out soft.pub.pem 2>/dev/null
                tpm2_startauthsession -S trial.ctx
                tpm2_policycommandcode -S trial.ctx -L policy.dat TPM2_CC_ActivateCredential >/dev/null
                tpm2_flushcontext trial.ctx
                tpm2_loadexternal -C n -G rsa:rsassa-sha256:null -u soft.pub.pem -a '\(attributes)' \(policy ? "-L policy.dat" : "") -c forged.ctx -n forged.name >/dev/null
                tpm2_readpublic -c forged.ctx -o forged.pub >/dev/null
                tpm2_flushcontext -t
                """
            let made = try run("/bin/sh", ["-c", script], environment: b.env)
            #expect(made.status == 0, "\(made.stderr)")
            var dressed = request
            let publicArea = try Data(contentsOf: URL(fileURLWithPath: dir + "/forged.pub"))
            dressed.attestationKey = .init(publicArea: publicArea.base64EncodedString(),
                                           name: lowerHex([UInt8](try Data(contentsOf: URL(fileURLWithPath: dir + "/forged.name")))))
            #expect(DeviceIdentity.name(ofPublic: [UInt8](publicArea)) == dressed.attestationKey.name)
            return try write(dressed.json(), dir + "/dressed-\(UUID().uuidString).json")
        }
        let template = "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|restricted|sign"
        let withPolicy = try forged(template + "|adminwithpolicy", policy: true)
        let refused = try server(["challenge", withPolicy, "--state", dir + "/dressed.state"], in: dir)
        #expect(refused.status == 3 && refused.stderr.contains("DATA_CORRUPTED")
                && refused.stderr.contains("not made from the keychain's AK template: adminWithPolicy set, an authPolicy"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/dressed.state"), "a refused request leaves no state")

        // The template's attributes on a software key: the challenge is made, and the TPM holds.
        let (challengePath, _) = try challenge(try forged(template, policy: false), in: dir)
        let challenge = try AttestationChallenge(json: Data(contentsOf: URL(fileURLWithPath: challengePath)))
        try writeForTpm2Activatecredential(b, challenge)
        let script = """
            set -e
            cd '\(dir)'
            tpm2_createek -c ek.ctx -G rsa -u ek.pub >/dev/null
            tpm2_flushcontext -t
            tpm2_loadexternal -C n -G rsa:rsassa-sha256:null -u soft.pub.pem -a '\(template)' -c forged.ctx >/dev/null
            tpm2_flushcontext -t
            tpm2_startauthsession --policy-session -S s.ctx
            tpm2_policysecret -S s.ctx -c e >/dev/null
            tpm2_activatecredential -c forged.ctx -C ek.ctx -i cred.blob -o cred.out -P session:s.ctx
            """
        let activated = try run("/bin/sh", ["-c", script], environment: b.env)
        #expect(activated.status != 0 && activated.stderr.contains("0x12F"), "\(activated.stderr)")
    }

    /// Our challenge answered by tpm2-tools alone: tpm2_activatecredential with our AK (its blob from
    /// the store) under the EK, and the credential is the one the server keeps.
    @Test func theServersChallengeIsAnsweredByTpm2Activatecredential() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        let (challengePath, statePath) = try challenge(try request(b), in: dir)
        let challenge = try AttestationChallenge(json: Data(contentsOf: URL(fileURLWithPath: challengePath)))
        let state = try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath)))
        try writeForTpm2Activatecredential(b, challenge)
        let script = """
            \(loadOurAKUnderTheRSAEK(dir))
            tpm2_startauthsession --policy-session -S s.ctx
            tpm2_policysecret -S s.ctx -c e
            tpm2_activatecredential -c ak.ctx -C ek.ctx -i cred.blob -o cred.out -P session:s.ctx
            tpm2_flushcontext s.ctx
            tpm2_flushcontext -t
            """
        let activated = try run("/bin/sh", ["-c", script], environment: b.env)
        #expect(activated.status == 0, "\(activated.stderr)")
        let credential = try Data(contentsOf: URL(fileURLWithPath: dir + "/cred.out"))
        #expect(credential.base64EncodedString() == state.credential)
    }

    /// What tpm2_activatecredential reads, in the device's folder: our AK's public and private areas
    /// (`ak.pub`, `ak.priv`) and the challenge as tpm2_makecredential's file (`cred.blob`: magic,
    /// version, then the TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET).
    func writeForTpm2Activatecredential(_ d: Device, _ challenge: AttestationChallenge) throws {
        let dir = d.tpm.directory
        let ak = try attestationKeyBlob(d)
        _ = try write(ak.publicArea, dir + "/ak.pub")
        _ = try write(ak.privateArea, dir + "/ak.priv")
        _ = try write([0xBA, 0xDC, 0xC0, 0xDE, 0, 0, 0, 1] + [UInt8](Data(base64Encoded: challenge.credentialBlob)!)
                      + [UInt8](Data(base64Encoded: challenge.secret)!), dir + "/cred.blob")
    }

    /// The shell lines that load our AK (`ak.ctx`) under tpm2_createek's RSA EK (`ek.ctx`) in `dir`.
    func loadOurAKUnderTheRSAEK(_ dir: String) -> String {
        """
        set -e
        cd '\(dir)'
        # No resource manager: each tool's objects are flushed once saved (3 slots).
        tpm2_createek -c ek.ctx -G rsa -u ek.pub
        tpm2_flushcontext -t
        tpm2_startauthsession --policy-session -S s.ctx
        tpm2_policysecret -S s.ctx -c e
        tpm2_load -C ek.ctx -u ak.pub -r ak.priv -c ak.ctx -P session:s.ctx
        tpm2_flushcontext s.ctx
        tpm2_flushcontext -t
        """
    }

    /// The AK blob the store keeps (its TPM2B_PUBLIC, then its TPM2B_PRIVATE).
    func attestationKeyBlob(_ d: Device) throws -> TPMContext.SealedBlob {
        let blob = try run("/usr/bin/sqlite3", [d.store + "/keychain.db", "SELECT hex(value) FROM meta WHERE name = 'tpm.attestation-key'"])
        let ak = hexBytes(String(decoding: blob.stdout, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).lowercased())
        let publicCount = 2 + (Int(ak[0]) << 8 | Int(ak[1]))
        return .init(publicArea: Array(ak[..<publicCount]), privateArea: Array(ak[publicCount...]))
    }

    /// A key made by tpm2-tools under the SRK without fixedTPM and fixedParent (it could be duplicated
    /// out of the TPM), certified by this device's own AK over the server's nonce (TPM2_Certify
    /// through our TPMContext: tpm2_certify 5.4 takes no qualifying data) and handed to the server as
    /// the request's SRK: every signature verifies, and the verifier refuses the key.
    @Test func anAKCertificationOfAKeyWithoutFixedTPMIsRefused() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let genuine = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: try request(b))))
        let made = try run("/bin/sh", ["-c", """
            set -e
            cd '\(dir)'
            tpm2_create -C 0x81000001 -G rsa2048 -a 'sign|userwithauth|sensitivedataorigin|noda' -u loose.pub -r loose.priv
            tpm2_flushcontext -t
            """], environment: b.env)
        #expect(made.status == 0, "\(made.stderr)")
        let loose = TPMContext.SealedBlob(publicArea: [UInt8](try Data(contentsOf: URL(fileURLWithPath: dir + "/loose.pub"))),
                                          privateArea: [UInt8](try Data(contentsOf: URL(fileURLWithPath: dir + "/loose.priv"))))
        #expect(try Attestation.isFixedToItsTPM(loose.publicArea) == false)
        let looseName = try #require(DeviceIdentity.name(ofPublic: loose.publicArea))

        var forged = genuine
        forged.storageRootKey = .init(handle: genuine.storageRootKey.handle, publicArea: Data(loose.publicArea).base64EncodedString(), name: looseName)
        let (challengePath, statePath) = try challenge(try write(forged.json(), dir + "/forged.json"), in: dir)
        let answer = try respond(b, challengePath)
        #expect(answer.status == 0, "\(String(decoding: answer.stdout, as: UTF8.self))")
        let nonce = [UInt8](Data(base64Encoded: try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath))).nonce)!)
        let akBlob = try attestationKeyBlob(b)
        let certification = try {
            let context = try TPMContext(device: b.tpm.device)
            let ek = try context.endorsementKey(.rsa2048)
            let ak = try context.load(akBlob, endorsementKey: ek)
            context.flush(ek)
            defer { context.flush(ak) }
            let object = try context.load(loose, parent: try context.resource(forPersistent: 0x8100_0001))
            defer { context.flush(object) }
            return try context.certify(object, ak: ak, nonce: nonce)
        }()
        var substituted = try AttestationAnswer(json: Data(answer.stdout))
        substituted.storageRootKeyCertification = .init(attest: Data(certification.attest).base64EncodedString(),
                                                        signature: Data(certification.signature).base64EncodedString())
        let refused = try server(["verify", try write(substituted.json(), dir + "/substituted.json"), "--state", statePath], in: dir)
        #expect(refused.status == 3 && refused.stderr.contains("not fixedTPM and fixedParent"), "\(refused.stderr)")
        #expect(FileManager.default.fileExists(atPath: statePath), "a refused answer leaves the challenge open")
    }

    /// Every server-side parser given what a hostile network sends: a clear KeychainError, never a crash,
    /// never a verified identity.
    @Test func hostileInputsToTheServerGetAClearErrorNeverAVerifiedIdentity() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let requestData = try Data(contentsOf: URL(fileURLWithPath: requestPath))
        let request = try AttestationRequest(json: requestData)
        let (c1, statePath) = try challenge(requestPath, in: dir)
        let answerData = Data(try respond(b, c1).stdout)
        let answer = try AttestationAnswer(json: answerData)
        let state = try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath)))
        #expect(throws: Never.self) { try AttestationServer.verify(answer, state: state, ekCA: nil) }

        func code(_ body: () throws -> Void) -> KeychainError.Code? {
            do { try body(); return nil } catch { return (error as? KeychainError)?.code ?? KeychainError.Code(rawValue: "NOT A KEYCHAIN ERROR") }
        }
        // Truncated, oversized, another version, another document.
        for data in [requestData.prefix(requestData.count / 2), Data(repeating: 0x20, count: 70_000) + requestData, Data()] {
            #expect(code { _ = try AttestationRequest(json: data) } == .dataCorrupted)
        }
        let v2 = String(decoding: requestData, as: UTF8.self).replacingOccurrences(of: "\"version\" : 1", with: "\"version\" : 2")
        #expect(code { _ = try AttestationRequest(json: Data(v2.utf8)) } == .unsupported)
        #expect(code { _ = try AttestationAnswer(json: requestData) } == .dataCorrupted)
        // A request whose public areas are cut, or swapped with each other.
        var cut = request
        cut.attestationKey.publicArea = String(request.attestationKey.publicArea.dropLast(8))
        #expect(code { _ = try AttestationServer.challenge(for: cut) } == .dataCorrupted)
        var swapped = request
        (swapped.attestationKey, swapped.storageRootKey.publicArea, swapped.storageRootKey.name)
            = (.init(publicArea: request.storageRootKey.publicArea, name: request.storageRootKey.name), request.attestationKey.publicArea, request.attestationKey.name)
        #expect(code { _ = try AttestationServer.challenge(for: swapped) } == .dataCorrupted, "an SRK is no attestation key")

        // Each signed field of the answer: cut, emptied, grown, one byte changed, or swapped.
        func base64(_ s: String, _ change: ([UInt8]) -> [UInt8]) -> String { Data(change([UInt8](Data(base64Encoded: s)!))).base64EncodedString() }
        let changes: [([UInt8]) -> [UInt8]] = [{ Array($0.prefix($0.count / 2)) }, { _ in [] }, { $0 + [UInt8](repeating: 0, count: 70_000) },
                                               { var b = $0; b[b.count / 3] ^= 0x40; return b }, { var b = $0; b[6] ^= 0x01; return b }]
        var trials = 0
        for change in changes {
            for field in 0..<5 {
                var bad = answer
                switch field {
                case 0: bad.quote.attest = base64(answer.quote.attest, change)
                case 1: bad.quote.signature = base64(answer.quote.signature, change)
                case 2: bad.storageRootKeyCertification.attest = base64(answer.storageRootKeyCertification.attest, change)
                case 3: bad.storageRootKeyCertification.signature = base64(answer.storageRootKeyCertification.signature, change)
                default: bad.credential = base64(answer.credential, change)
                }
                let got = code { _ = try AttestationServer.verify(bad, state: state, ekCA: nil) }
                #expect(got == .authenticationFailed || got == .dataCorrupted, "field \(field): \(String(describing: got))")
                trials += 1
            }
        }
        // The quote and the certification swapped: each is the other's type.
        var crossed = answer
        (crossed.quote, crossed.storageRootKeyCertification) = (answer.storageRootKeyCertification, answer.quote)
        #expect(code { _ = try AttestationServer.verify(crossed, state: state, ekCA: nil) } == .authenticationFailed)
        // PCR values that are not the quoted ones.
        var otherValues = answer
        otherValues.pcrValues[String(request.pcrs[0])] = String(repeating: "ab", count: 32)
        #expect(code { _ = try AttestationServer.verify(otherValues, state: state, ekCA: nil) } == .authenticationFailed)
        // Random bytes in each position of the quote: fuzzed, never verified.
        var rng = SystemRandomNumberGenerator()
        let attest = [UInt8](Data(base64Encoded: answer.quote.attest)!)
        for _ in 0..<300 {
            var bytes = attest
            bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
            if Bool.random(using: &rng) { bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &rng))) }
            guard bytes != attest else { continue }
            var bad = answer
            bad.quote.attest = Data(bytes).base64EncodedString()
            #expect(code { _ = try AttestationServer.verify(bad, state: state, ekCA: nil) } == .authenticationFailed)
            trials += 1
        }
        #expect(trials > 300)
    }

    /// `attest init` and `attest respond` killed after each of their TPM commands in turn
    /// (KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS): a killed run wrote no document and no half key, left
    /// no persistent handle, and the run again works. For init, each kill starts from the same
    /// device (the swtpm's state and the store copied back); for respond, the same challenge is
    /// answered again and verifies.
    @Test func initAndRespondKilledAtEveryTPMCommandLeaveNothingHalfDone() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        #expect(try cli(b, ["status"]).status == 0)  // provisioned: the kills fall in the attestation's own commands
        func getcap(_ what: String) throws -> String {
            let out = try run("/usr/bin/tpm2_getcap", [what], environment: b.env)
            #expect(out.status == 0, "\(out.stderr)")
            return String(decoding: out.stdout, as: UTF8.self)
        }
        let persistent = try getcap("handles-persistent")
        func killed(_ args: [String], after n: Int) throws -> Outcome {
            try run(ctl, ["--store", b.store, "--tcti", b.tpm.tcti] + args, environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
        }
        func shell(_ script: String) throws {
            let out = try run("/bin/sh", ["-c", script])
            #expect(out.status == 0, "\(script): \(out.stderr)")
        }
        b.tpm.stop()
        try shell("cp -a '\(dir)/state' '\(dir)/state.before' && cp -a '\(b.store)' '\(b.store).before'")
        try b.tpm.reboot()

        var initKills = 0
        for n in 1...40 {
            let out = try killed(["--json", "attest", "init"], after: n)
            #expect(out.status == 134 || out.status == 0, "kill \(n): \(out.stderr)")
            if out.status == 0 { break }
            initKills += 1
            #expect(out.stdout.isEmpty, "kill \(n): a killed init wrote \(String(decoding: out.stdout, as: UTF8.self))")
            // No half key: the store has none (attest request says so), and no handle was made persistent.
            let request = try cli(b, ["--json", "attest", "request"])
            #expect(errorCode(request) == "INVALID_ARGUMENT" && String(decoding: request.stdout, as: UTF8.self).contains("attest init"),
                    "kill \(n): \(String(decoding: request.stdout, as: UTF8.self))")
            #expect(try getcap("handles-persistent") == persistent, "kill \(n)")
            // The run again makes the key, whole: a request, a second init keeps it.
            let again = try cli(b, ["--json", "attest", "init"])
            #expect(again.status == 0 && String(decoding: again.stdout, as: UTF8.self).contains("\"created\":true"), "after kill \(n): \(again.stderr)")
            #expect(try cli(b, ["attest", "request"]).status == 0, "after kill \(n)")
            #expect(String(decoding: try cli(b, ["--json", "attest", "init"]).stdout, as: UTF8.self).contains("\"created\":false"))
            #expect(try getcap("handles-persistent") == persistent, "after kill \(n)")
            b.tpm.stop()
            try shell("rm -rf '\(dir)/state' '\(b.store)' && cp -a '\(dir)/state.before' '\(dir)/state' && cp -a '\(b.store).before' '\(b.store)'")
            try b.tpm.reboot()
        }
        #expect(initKills >= 5, "attest init sent \(initKills) TPM commands")

        let requestPath = try write(try cli(b, ["attest", "request"]).stdout, dir + "/request.json")
        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let state = try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath)))
        var respondKills = 0
        for n in 1...60 {
            let out = try killed(["--json", "attest", "respond", challengePath], after: n)
            #expect(out.status == 134 || out.status == 0, "kill \(n): \(out.stderr)")
            if out.status == 0 {
                #expect(throws: Never.self) { try AttestationServer.verify(try AttestationAnswer(json: Data(out.stdout)), state: state, ekCA: nil) }
                break
            }
            respondKills += 1
            #expect(out.stdout.isEmpty, "kill \(n): a killed answer wrote \(String(decoding: out.stdout, as: UTF8.self))")
            #expect(try getcap("handles-persistent") == persistent, "kill \(n)")
            // The same challenge is answered again, and the answer verifies.
            let again = try respond(b, challengePath)
            #expect(again.status == 0, "after kill \(n): \(String(decoding: again.stdout, as: UTF8.self))")
            #expect(throws: Never.self, "after kill \(n)") {
                try AttestationServer.verify(try AttestationAnswer(json: Data(again.stdout)), state: state, ekCA: nil)
            }
            #expect(try getcap("handles-persistent") == persistent, "after kill \(n)")
        }
        #expect(respondKills >= 10, "attest respond sent \(respondKills) TPM commands")
        // What the kills left in the TPM (transient objects, sessions) the next runs flushed.
        #expect(try getcap("handles-transient").trimmingCharacters(in: .whitespacesAndNewlines).isEmpty)
        print("attest init killed after each of \(initKills) TPM commands, attest respond after each of \(respondKills)")
    }

    /// The TPM commands of `attest init`, `request`, `respond` and `key` (of a ThisDeviceOnly key) as
    /// tpm2-tss's pcap TCTI records each process's, in order, on a TPM with an EK certificate: what
    /// `theAttestationCallsSendTheCountedTPMCommands` counts, plus each process's opening NV_Read.
    @Test func eachAttestationCommandSendsTheseTPMCommandsInOrder() throws {
        let b = try Device()
        try b.tpm.manufacture()
        let dir = b.tpm.directory
        #expect(try cli(b, ["status"]).status == 0)  // provisioned first: the counts are of the attestation alone
        #expect(try cli(b, ["set", "svc", "k", "--accessible", "afterFirstUnlockThisDeviceOnly"], "v").status == 0)
        let names: [UInt32: String] = [
            0x17a: "GetCapability", 0x14e: "NV_Read", 0x131: "CreatePrimary", 0x176: "StartAuthSession", 0x151: "PolicySecret",
            0x153: "Create", 0x165: "FlushContext", 0x169: "NV_ReadPublic", 0x173: "ReadPublic", 0x157: "Load",
            0x147: "ActivateCredential", 0x158: "Quote", 0x148: "Certify", 0x17e: "PCR_Read", 0x14a: "CertifyCreation", 0x184: "NV_Certify"]
        func captured(_ args: [String]) throws -> [String] {
            let path = dir + "/capture-\(UUID().uuidString).pcap"
            let out = try run(ctl, ["--store", b.store, "--tcti", "pcap:" + b.tpm.tcti] + args, environment: ["TCTI_PCAP_FILE": path])
            #expect(out.status == 0, "\(out.stderr)")
            return try TPMCapture(path: path).codes.map { names[$0] ?? String($0, radix: 16) }
        }
        let opening = ["GetCapability", "NV_Read"]  // the leftover check, the keyring's read of the lock-state index
        // The EK, a policy session with PolicySecret(endorsement) for its child, the AK made, the EK flushed.
        #expect(try captured(["attest", "init"]) == opening + ["CreatePrimary", "StartAuthSession", "PolicySecret", "Create", "FlushContext"])
        // The EK's public area (made, flushed), its certificate (the index's public area twice: for its
        // ESAPI object and its size; two NV_Reads of 1,024 bytes at most), the SRK's, the state index's.
        let requestPath = try write(try cli(b, ["attest", "request"]).stdout, dir + "/request.json")
        #expect(try captured(["attest", "request"]) == opening + ["CreatePrimary", "FlushContext", "NV_ReadPublic", "NV_ReadPublic",
                                                                   "NV_Read", "NV_Read", "ReadPublic", "NV_ReadPublic"])
        // The EK; the AK loaded under it (PolicySecret); ActivateCredential (the EK's PolicySecret
        // again), Quote, Certify of the SRK; the EK flushed; the one wrapping key loaded under the SRK,
        // CertifyCreation, flushed; NV_Certify of the approval index; the PCRs read; the AK flushed.
        let (challengePath, _) = try challenge(requestPath, in: dir)
        #expect(try captured(["attest", "respond", challengePath]) == opening + [
            "CreatePrimary", "StartAuthSession", "PolicySecret", "Load", "StartAuthSession", "PolicySecret", "ActivateCredential",
            "Quote", "Certify", "FlushContext", "Load", "CertifyCreation", "FlushContext", "NV_Certify", "PCR_Read", "FlushContext"])
        // With the P-384 EK: the AK loaded under the RSA EK, which goes to make room for the ECC EK;
        // ActivateCredential with the ECC EK's empty authValue (H-3 has userWithAuth), the ECC EK
        // flushed; then as with the RSA EK. ESAPI sends ActivateCredential twice here (seen in every
        // capture; the call point counts one call, as theAttestationCallsSendTheCountedTPMCommands does).
        let eccRequestPath = try write(try cli(b, ["attest", "request", "--endorsement-key", "eccP384"]).stdout, dir + "/ecc-request.json")
        let (eccChallengePath, _) = try challenge(eccRequestPath, in: dir)
        let eccCommands = try captured(["attest", "respond", eccChallengePath])
        #expect(eccCommands == opening + [
            "CreatePrimary", "StartAuthSession", "PolicySecret", "Load", "FlushContext", "CreatePrimary", "ActivateCredential", "ActivateCredential",
            "FlushContext", "Quote", "Certify", "Load", "CertifyCreation", "FlushContext", "NV_Certify", "PCR_Read", "FlushContext"], "\(eccCommands)")
        // The key under the SRK; the EK while the AK loads (three object slots), then flushed;
        // CertifyCreation, NV_Certify of the approval index (ThisDeviceOnly); the AK and the key flushed.
        #expect(try captured(["attest", "key", "svc", "--accessible", "afterFirstUnlockThisDeviceOnly", "--nonce", "00"]) == opening + [
            "Load", "CreatePrimary", "StartAuthSession", "PolicySecret", "Load", "FlushContext", "CertifyCreation", "NV_Certify",
            "FlushContext", "FlushContext"])
    }

    /// The TPM commands of the device's attestation calls, counted at the one ESAPI call point
    /// (`takeTPMCommandCount`, as WarmReadTests and EmbeddedTPMStartTests count), on a provisioned
    /// device whose keyring is open: `attest init`, `attest request`, the answer to a challenge, and
    /// `attest key` of a key not bound to the boot state and of a ThisDeviceOnly key (its policy names
    /// the approval index: one NV_Certify more). docs/performance.md states these counts.
    @Test func theAttestationCallsSendTheCountedTPMCommands() async throws {
        let tpm = try SoftwareTPM()
        try tpm.manufacture()
        let configuration = tpm.configuration()
        let device = KeychainDevice(configuration: configuration)
        let administration = try KeychainAdministration(configuration: configuration)
        _ = try await device.initialize()
        let levels: [Accessible] = [.afterFirstUnlock, .afterFirstUnlockThisDeviceOnly]
        var storages: [Keychain] = []
        for level in levels {
            let storage = try createKeychain(.init(service: "svc-\(level.rawValue)", accessible: level), configuration: configuration)
            try await storage.setItem("k", "v")
            storages.append(storage)
        }
        _ = await device.takeTPMCommandCount()
        var counts: [String: Int] = [:]
        #expect(try await administration.makeAttestationKey().created)
        counts["init"] = await device.takeTPMCommandCount()
        #expect(try await !administration.makeAttestationKey().created)
        counts["init again"] = await device.takeTPMCommandCount()
        let request = try await administration.attestationRequest()
        counts["request"] = await device.takeTPMCommandCount()
        let (challenge, state) = try AttestationServer.challenge(for: request)
        let answer = try await administration.answer(challenge)
        counts["respond"] = await device.takeTPMCommandCount()
        let ca = [UInt8](try Data(contentsOf: URL(fileURLWithPath: tpm.directory + "/fleet-ca.pem")))
        let identity = try AttestationServer.verify(answer, state: state, ekCA: ca)
        for type in [EndorsementKeyType.eccP384, .eccP256] {
            let eccRequest = try await administration.attestationRequest(endorsementKey: type)
            counts["request \(type.rawValue)"] = await device.takeTPMCommandCount()
            let (eccChallenge, eccState) = try AttestationServer.challenge(for: eccRequest)
            let eccAnswer = try await administration.answer(eccChallenge)
            counts["respond \(type.rawValue)"] = await device.takeTPMCommandCount()
            #expect(try AttestationServer.verify(eccAnswer, state: eccState, ekCA: type == .eccP384 ? ca : nil).endorsementKey.type == type.rawValue)
        }
        #expect(identity.wrappingKeys?.count == 2 && identity.wrappingKeys?.allSatisfy { $0.matchesClaim } == true && identity.bootApproval != nil)
        for (level, storage) in zip(levels, storages) {
            let nonce = Sodium.randomBytes(32)
            let attestation = try await storage.attestKey(nonce: nonce)
            counts["key \(level.rawValue)"] = await device.takeTPMCommandCount()
            let report = try AttestationServer.verifyKey(attestation, identity: identity, nonce: nonce)
            #expect(report.matchesClaim, "\(level): \(report.differences)")
        }
        print("attestation TPM commands: \(counts.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))")
        // No leftover check (GetCapability): each call's turn follows this engine's last one (its
        // mark in the lock file). What eachAttestationCommandSendsTheseTPMCommandsInOrder lists:
        // init 5 (a second init finds the key in the store: none), request 8, the answer 19 (12,
        // then Load, CertifyCreation and FlushContext for each of the two wrapping keys, and the
        // approval index's NV_Certify), a key 9 (10 with the approval index's NV_Certify).
        // With an ECC EK: the request reads that EK and its certificate index (swtpm has none for
        // P-256: one NV_ReadPublic that fails, no NV_Read); the answer as many as with the RSA EK
        // for P-384 (FlushContext of the RSA EK and CreatePrimary of the ECC one in place of the
        // second policy session), two more for P-256 (its activation takes the policy session).
        #expect(counts == ["init": 5, "init again": 0, "request": 8, "respond": 19,
                           "request eccP384": 8, "respond eccP384": 19, "request eccP256": 5, "respond eccP256": 21,
                           "key afterFirstUnlock": 9, "key afterFirstUnlockThisDeviceOnly": 10])
    }

    /// The server keeps nothing but a challenge's state: each challenge is new (nonce and credential),
    /// and the library verifies the same answer against its state every time (only the CLI removes
    /// the state after use). Prints challenges and verifications per second on this thread.
    @Test func theServersChallengesAreFreshAndItsVerificationKeepsNoState() throws {
        let b = try Device()
        let dir = b.tpm.directory
        let requestPath = try request(b)
        let request = try AttestationRequest(json: Data(contentsOf: URL(fileURLWithPath: requestPath)))
        let (c1, statePath) = try challenge(requestPath, in: dir)
        let answer = try AttestationAnswer(json: Data(try respond(b, c1).stdout))
        let state = try AttestationState(json: Data(contentsOf: URL(fileURLWithPath: statePath)))
        let rounds = 200
        var nonces = Set<String>(), credentials = Set<String>()
        let started = ContinuousClock.now
        for _ in 0..<rounds {
            let made = try AttestationServer.challenge(for: request)
            nonces.insert(made.challenge.nonce)
            credentials.insert(made.state.credential)
        }
        let challenged = ContinuousClock.now
        for _ in 0..<rounds { _ = try AttestationServer.verify(answer, state: state, ekCA: nil) }
        let verified = ContinuousClock.now
        #expect(nonces.count == rounds && credentials.count == rounds)
        func rate(_ d: Duration) -> Int { Int(Double(rounds) / (Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)) }
        print("server: \(rate(challenged - started)) challenges/s, \(rate(verified - challenged)) verifications/s (one thread)")
    }
}
