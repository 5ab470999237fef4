import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import SecureMemory
import Testing
import TPM2

/// SplitMix64: a seeded generator, so a failing input is made again from the seed the test prints.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// `bytes` changed one way: a byte flipped or set, cut short, grown (now and then past any
    /// document's bound), bytes put in, or replaced by random bytes of a random length.
    mutating func mutate(_ bytes: [UInt8]) -> [UInt8] {
        var out = bytes
        switch Int.random(in: 0..<7, using: &self) {
        case 0 where !out.isEmpty: out[Int.random(in: 0..<out.count, using: &self)] ^= UInt8(1 << Int.random(in: 0..<8, using: &self))
        case 1 where !out.isEmpty: out[Int.random(in: 0..<out.count, using: &self)] = UInt8.random(in: 0...255, using: &self)
        case 2: out = Array(out.prefix(Int.random(in: 0...max(0, out.count - 1), using: &self)))
        case 3: out += (0..<Int.random(in: 1...64, using: &self)).map { _ in UInt8.random(in: 0...255, using: &self) }
        case 4: out.insert(contentsOf: (0..<Int.random(in: 1...8, using: &self)).map { _ in UInt8.random(in: 0...255, using: &self) },
                           at: Int.random(in: 0...out.count, using: &self))
        case 5: out = (0..<Int.random(in: 0...300, using: &self)).map { _ in UInt8.random(in: 0...255, using: &self) }
        default: out += [UInt8](repeating: UInt8.random(in: 0...255, using: &self), count: Int.random(in: 1...4, using: &self) == 1 ? 70_000 : 600)
        }
        return out
    }
}

extension AttestationTests {
    /// The code of what `body` threw; nil when it returned.
    func thrownCode(_ body: () throws -> Void) -> KeychainError.Code? {
        do { try body(); return nil } catch { return (error as? KeychainError)?.code ?? KeychainError.Code(rawValue: "NOT A KEYCHAIN ERROR") }
    }

    /// The fields issue 23 added to the server's inputs, given what a hostile network sends, from a
    /// seeded generator (the seed is printed): each wrapping key's public area, stored policy,
    /// creation data and CreationCertification, the NV_Certify of the approval index, the ECC EK's
    /// public area and certificate in the request, the challenge's EK type, and the JSON of every
    /// document (request, challenge, state, answer, verified identity) cut, grown and changed;
    /// fields swapped with each other; every version but 1. Each is a KeychainError of the codes a
    /// reader gives (DATA_CORRUPTED, UNSUPPORTED, AUTHENTICATION_FAILED) and never a verified
    /// identity with a changed signed field, nor a changed policy reported as matching its claim.
    @Test func hostileNewerFieldsGetAClearErrorNeverAVerifiedIdentity() throws {
        let b = try Device()
        let ca = [UInt8](try Data(contentsOf: URL(fileURLWithPath: try b.tpm.manufacture())))
        let dir = b.tpm.directory
        #expect(try cli(b, ["set", "wifi", "psk", "--accessible", "afterFirstUnlockThisDeviceOnly"], "v").status == 0)
        #expect(try cli(b, ["set", "mail", "password"], "v").status == 0)
        let requestPath = try request(b, endorsementKey: "eccP384")
        let eccRequest: AttestationRequest = try json(requestPath)
        let (challengePath, statePath) = try challenge(requestPath, in: dir)
        let challengeData = try Data(contentsOf: URL(fileURLWithPath: challengePath))
        let stateData = try Data(contentsOf: URL(fileURLWithPath: statePath))
        let state = try AttestationState(json: stateData)
        let answered = try respond(b, challengePath)
        #expect(answered.status == 0, "\(String(decoding: answered.stdout, as: UTF8.self))")
        let answerData = Data(answered.stdout)
        let answer = try AttestationAnswer(json: answerData)
        let identity = try AttestationServer.verify(answer, state: state, ekCA: ca)
        let keys = try #require(answer.wrappingKeys)
        try #require(keys.count == 2 && answer.bootApprovalCertification != nil && identity.endorsementCertificateVerified)

        let seed = ProcessInfo.processInfo.environment["KEYCHAIN_FUZZ_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 0...UInt64.max)
        print("attestation fuzz seed \(seed)")
        var rng = SeededGenerator(seed: seed)
        let readerCodes: Set<KeychainError.Code> = [.dataCorrupted, .unsupported, .authenticationFailed]
        func base64(_ s: String) -> [UInt8] { [UInt8](Data(base64Encoded: s) ?? Data()) }
        func encoded(_ b: [UInt8]) -> String { Data(b).base64EncodedString() }
        var trials = 0, reported = 0

        // The answer's newer fields, one at a time, 150 mutations each.
        for field in 0..<9 {
            for _ in 0..<150 {
                var bad = answer
                let k = Int.random(in: 0..<2, using: &rng)
                var key = keys[k]
                var signedFieldChanged = true
                switch field {
                case 0: key.publicArea = encoded(rng.mutate(base64(key.publicArea)))
                case 1: key.policy = encoded(rng.mutate(base64(key.policy))); signedFieldChanged = false
                case 2: key.creationData = encoded(rng.mutate(base64(key.creationData)))
                case 3: key.creationCertification.attest = encoded(rng.mutate(base64(key.creationCertification.attest)))
                case 4: key.creationCertification.signature = encoded(rng.mutate(base64(key.creationCertification.signature)))
                case 5: bad.bootApprovalCertification?.attest = encoded(rng.mutate(base64(answer.bootApprovalCertification!.attest)))
                case 6: bad.bootApprovalCertification?.signature = encoded(rng.mutate(base64(answer.bootApprovalCertification!.signature)))
                case 7: key.service = String(decoding: rng.mutate(Array(key.service.utf8)), as: UTF8.self); signedFieldChanged = false
                default: key.protection = String(decoding: rng.mutate(Array(key.protection.utf8)), as: UTF8.self); signedFieldChanged = false
                }
                bad.wrappingKeys![k] = key
                guard bad != answer else { continue }
                trials += 1
                var result: VerifiedIdentity?
                let code = thrownCode { result = try AttestationServer.verify(bad, state: state, ekCA: nil) }
                if let code {
                    #expect(readerCodes.contains(code), "seed \(seed) field \(field): \(code)")
                    continue
                }
                #expect(!signedFieldChanged, "seed \(seed): field \(field) changed and the answer verified")
                // Unsigned: the policy (its digest is checked), the service's name, the storage tag.
                let report = try #require(result?.wrappingKeys?[k])
                switch field {
                case 1:
                    // Matching only when what the TPM checks is unchanged: the same digest (an edit of
                    // what the digest does not cover, such as the stored creation ticket, matches).
                    let same = SealPolicy.decode(base64(key.policy))?.digest == SealPolicy.decode(base64(keys[k].policy))?.digest
                    #expect(!report.matchesClaim || same, "seed \(seed): an edited policy reported as matching")
                case 8: #expect(!report.matchesClaim || key.protection == keys[k].protection, "seed \(seed): another tag reported as matching")
                default: #expect(report.claim.service == key.service)
                }
                reported += 1
            }
        }
        // Fields swapped with each other: statements of another type, another key's parts.
        var swaps: [AttestationAnswer] = []
        var s1 = answer
        (s1.wrappingKeys![0].creationCertification, s1.bootApprovalCertification) = (answer.bootApprovalCertification!, keys[0].creationCertification)
        swaps.append(s1)
        var s2 = answer
        (s2.wrappingKeys![0].publicArea, s2.wrappingKeys![0].creationData) = (keys[0].creationData, keys[0].publicArea)
        swaps.append(s2)
        var s3 = answer
        (s3.wrappingKeys![0].creationCertification, s3.wrappingKeys![1].creationCertification) = (keys[1].creationCertification, keys[0].creationCertification)
        swaps.append(s3)
        var s4 = answer
        (s4.quote, s4.wrappingKeys![1].creationCertification) = (keys[1].creationCertification, answer.quote)
        swaps.append(s4)
        var s5 = answer
        (s5.storageRootKeyCertification, s5.bootApprovalCertification) = (answer.bootApprovalCertification!, answer.storageRootKeyCertification)
        swaps.append(s5)
        var s6 = answer
        (s6.wrappingKeys![0].publicArea, s6.wrappingKeys![1].publicArea) = (keys[1].publicArea, keys[0].publicArea)
        swaps.append(s6)
        for (i, bad) in swaps.enumerated() {
            #expect(thrownCode { _ = try AttestationServer.verify(bad, state: state, ekCA: nil) } == .authenticationFailed, "swap \(i)")
            trials += 1
        }
        var policiesSwapped = answer
        (policiesSwapped.wrappingKeys![0].policy, policiesSwapped.wrappingKeys![1].policy) = (keys[1].policy, keys[0].policy)
        let swappedReports = try AttestationServer.verify(policiesSwapped, state: state, ekCA: nil).wrappingKeys ?? []
        #expect(swappedReports.count == 2 && swappedReports.allSatisfy { !$0.matchesClaim }, "another key's policy reported as matching")

        // The ECC EK in the request: its public area changed (its name made to match, so the parser
        // behind the name check sees it), its certificate changed (checked with --ek-ca).
        for _ in 0..<200 {
            var bad = eccRequest
            let area = rng.mutate(base64(eccRequest.endorsementKey.publicArea))
            bad.endorsementKey.publicArea = encoded(area)
            bad.endorsementKey.name = DeviceIdentity.name(ofPublic: area) ?? bad.endorsementKey.name
            guard bad != eccRequest else { continue }
            let code = thrownCode { _ = try AttestationServer.challenge(for: bad) }
            #expect(code == .dataCorrupted || code == .unsupported, "seed \(seed): a changed EK public area gave \(String(describing: code))")
            trials += 1
        }
        // A changed certificate is refused, or (OpenSSL tolerates some encodings) still chains to the
        // CA and holds this EK's key: printed with where it differs, never a verification for another key.
        var acceptedCertificates: [String] = []
        let certificate = base64(eccRequest.endorsementKey.certificate!)
        for _ in 0..<150 {
            var badState = state
            let changed = rng.mutate(certificate)
            guard changed != certificate else { continue }
            badState.request.endorsementKey.certificate = encoded(changed)
            let code = thrownCode { _ = try AttestationServer.verify(answer, state: badState, ekCA: ca) }
            if let code {
                #expect(code == .authenticationFailed || code == .dataCorrupted, "seed \(seed): a changed EK certificate gave \(code)")
            } else {
                let at = (0..<min(changed.count, certificate.count)).first { changed[$0] != certificate[$0] } ?? min(changed.count, certificate.count)
                acceptedCertificates.append("\(certificate.count) → \(changed.count) bytes, first difference at \(at)")
            }
            trials += 1
        }
        print("changed EK certificates that still verified: \(acceptedCertificates)")

        // Every document's JSON, changed; what still decodes goes on to the server's next step.
        let identityData = identity.json()
        let documents: [(String, Data)] = [("request", try Data(contentsOf: URL(fileURLWithPath: requestPath))), ("challenge", challengeData),
                                           ("state", stateData), ("answer", answerData), ("verified identity", identityData)]
        var decodedAnyway = 0
        for (name, data) in documents {
            for _ in 0..<250 {
                let bytes = Data(rng.mutate([UInt8](data)))
                guard bytes != data else { continue }
                trials += 1
                let code: KeychainError.Code?
                switch name {
                case "request":
                    code = thrownCode { _ = try AttestationServer.challenge(for: try AttestationRequest(json: bytes)) }
                case "challenge":
                    code = thrownCode { _ = try AttestationChallenge(json: bytes) }
                case "state":
                    code = thrownCode {
                        let badState = try AttestationState(json: bytes)
                        let verified = try AttestationServer.verify(answer, state: badState, ekCA: nil)
                        let same = badState.nonce == state.nonce && badState.credential == state.credential
                        #expect(same && verified.storageRootKey == eccRequest.storageRootKey,
                                "seed \(seed): a changed state verified: \(verified.storageRootKey) for \(eccRequest.storageRootKey)")
                    }
                case "answer":
                    code = thrownCode {
                        let bad = try AttestationAnswer(json: bytes)
                        _ = try AttestationServer.verify(bad, state: state, ekCA: nil)
                        // Compared as bytes: base64 text whose unused low bits before the padding changed
                        // decodes to the same bytes.
                        func raw(_ s: AttestationAnswer.Signed?) -> [[UInt8]]? { s.map { [base64($0.attest), base64($0.signature)] } }
                        let signedFields = [bad.quote, bad.storageRootKeyCertification, bad.bootApprovalCertification].map(raw)
                            + (bad.wrappingKeys ?? []).map { raw($0.creationCertification) }
                        let genuine = [answer.quote, answer.storageRootKeyCertification, answer.bootApprovalCertification].map(raw)
                            + keys.map { raw($0.creationCertification) }
                        let changed = zip(signedFields, genuine).filter { $0.0 != $0.1 }.map { "\(String(describing: $0.0)) for \(String(describing: $0.1))" }
                        #expect(signedFields == genuine && base64(bad.credential) == base64(answer.credential),
                                "seed \(seed): an answer with a changed signed field verified: \(changed)")
                    }
                default:
                    code = thrownCode {
                        let bad = try VerifiedIdentity(json: bytes)
                        _ = try Provisioning.seal(SecureBytes(copying: Array("v".utf8)), service: "s", key: "k", for: bad)
                    }
                }
                if let code {
                    #expect(readerCodes.contains(code) || (name == "verified identity" && code == .invalidArgument),
                            "seed \(seed) \(name): \(code)")
                } else {
                    decodedAnyway += 1
                }
            }
            // Every version but 1: UNSUPPORTED; another document's format: DATA_CORRUPTED.
            for version in [0, 2, -1, Int.max] {
                let text = String(decoding: data, as: UTF8.self).replacingOccurrences(of: "\"version\" : 1", with: "\"version\" : \(version)")
                #expect(text != String(decoding: data, as: UTF8.self), "\(name) has no version field to change")
                let got: KeychainError.Code? = switch name {
                case "request": thrownCode { _ = try AttestationRequest(json: Data(text.utf8)) }
                case "challenge": thrownCode { _ = try AttestationChallenge(json: Data(text.utf8)) }
                case "state": thrownCode { _ = try AttestationState(json: Data(text.utf8)) }
                case "answer": thrownCode { _ = try AttestationAnswer(json: Data(text.utf8)) }
                default: thrownCode { _ = try VerifiedIdentity(json: Data(text.utf8)) }
                }
                #expect(got == .unsupported, "\(name) version \(version): \(String(describing: got))")
            }
        }
        #expect(thrownCode { _ = try AttestationChallenge(json: answerData) } == .dataCorrupted)
        #expect(thrownCode { _ = try AttestationState(json: challengeData) } == .dataCorrupted)
        #expect(thrownCode { _ = try VerifiedIdentity(json: stateData) } == .dataCorrupted)
        print("attestation fuzz: \(trials) hostile inputs, \(reported) verified with an unsigned field changed (reported), "
              + "\(decodedAnyway) changed documents accepted")
        #expect(trials > 2_500)
    }
}
