import Foundation
@testable import PKCS11
import SecureMemory
import Testing

/// The three wrapping schemes on a real SoftHSM2 token, some restricted with `slots.mechanisms` to
/// what an RSA-only or EC-only secure element offers. Part of `TokenTests`, whose tests run one at a
/// time: SoftHSM2 reads its configuration once per process.
extension TokenTests {
    static let rsaOnly = "CKM_RSA_PKCS_KEY_PAIR_GEN,CKM_RSA_PKCS_OAEP"
    static let ecOnly = "CKM_EC_KEY_PAIR_GEN,CKM_ECDH1_DERIVE"
    /// Everything but the three schemes' operations (AES-CBC, RSA PKCS#1 v1.5, ECDSA… stay).
    static let noScheme = "-,CKM_AES_GCM,CKM_RSA_PKCS_OAEP,CKM_ECDH1_DERIVE"

    /// The token's own listing (`pkcs11-tool -M`), to see that SoftHSM2 applies the restriction.
    func listedMechanisms(_ hsm: SoftHSM) throws -> String {
        try hsm.run("/usr/bin/pkcs11-tool", ["--module", SoftHSM.modulePath, "-M"]).output
    }

    /// Every object pkcs11-tool sees on the token, logged in (another process: token objects only).
    func objectCount(_ hsm: SoftHSM) throws -> Int {
        let listing = try hsm.run("/usr/bin/pkcs11-tool", ["--module", SoftHSM.modulePath, "--login", "--pin", SoftHSM.userPIN, "-O"])
        return listing.output.split(separator: "\n").filter { $0.contains(" Object;") || $0.hasPrefix("Data object") }.count
    }

    // MARK: Choosing

    @Test func theFullTokenGetsAESGCMAndCouldDoAllThree() throws {
        let hsm = try SoftHSM()
        let capabilities = try hsm.token().capabilities()
        for scheme in WrappingScheme.allCases { #expect(capabilities.missing(for: scheme) == [], "\(scheme)") }
        #expect(capabilities.preferredScheme == .aesGCM)
        #expect(capabilities.mechanisms[.aesGCM]?.flags.isSuperset(of: [.encrypt, .decrypt]) == true)
    }

    @Test func anRSAOnlyTokenGetsRSAOAEP() throws {
        let hsm = try SoftHSM(mechanisms: TokenTests.rsaOnly)
        let listed = try listedMechanisms(hsm)
        #expect(listed.contains("RSA-PKCS-OAEP") && !listed.contains("AES-GCM") && !listed.contains("ECDH1-DERIVE"), "\(listed)")
        let capabilities = try hsm.token().capabilities()
        #expect(capabilities.preferredScheme == .rsaOAEP)
        #expect(capabilities.missing(for: .aesGCM) == ["CKM_AES_KEY_GEN (absent)", "CKM_AES_GCM (absent)"])
    }

    @Test func anECOnlyTokenGetsECDH() throws {
        let hsm = try SoftHSM(mechanisms: TokenTests.ecOnly)
        let listed = try listedMechanisms(hsm)
        #expect(listed.contains("ECDH1-DERIVE") && !listed.contains("AES-GCM") && !listed.contains("RSA-PKCS-OAEP"), "\(listed)")
        #expect(try hsm.token().capabilities().preferredScheme == .ecdhP256)
    }

    @Test func aTokenWithNoSchemeIsRefusedNamingWhatIsMissingAndKeepsNothing() throws {
        let hsm = try SoftHSM(mechanisms: TokenTests.noScheme)
        let listed = try listedMechanisms(hsm)
        #expect(!listed.contains("AES-GCM") && !listed.contains("RSA-PKCS-OAEP") && !listed.contains("ECDH1-DERIVE"))
        #expect(listed.contains("AES-CBC"), "the rest stays: \(listed)")
        let token = try hsm.loggedInToken()
        let error = pkcs11Error { try token.wrappingKey(label: "service", id: [1], create: true) }
        #expect(error?.returnValue == .mechanismInvalid)
        for missing in ["CKM_AES_GCM (absent)", "CKM_RSA_PKCS_OAEP (absent)", "CKM_ECDH1_DERIVE (absent)"] {
            #expect(error?.detail?.contains(missing) == true, "\(String(describing: error))")
        }
        #expect(try objectCount(hsm) == 0)
    }

    @Test func aKeySizeOutsideTheTokensRangeIsMissingToo() {
        let small = MechanismInfo(minimumKeySize: 512, maximumKeySize: 1024, flags: [.generateKeyPair])
        let oaep = MechanismInfo(minimumKeySize: 512, maximumKeySize: 4096, flags: [.encrypt])
        let capabilities = TokenCapabilities(mechanisms: [.rsaKeyPairGen: small, .rsaOAEP: oaep], tokenFlags: [])
        #expect(capabilities.missing(for: .rsaOAEP) == ["CKM_RSA_PKCS_KEY_PAIR_GEN (keys of 512…1024, 2048 needed)",
                                                        "CKM_RSA_PKCS_OAEP (no decrypt)"])
        #expect(capabilities.preferredScheme == nil)
    }

    // MARK: Each scheme

    @Test(arguments: WrappingScheme.allCases)
    func eachSchemeSealsAndOpensAndItsSecretNeverLeaves(_ scheme: WrappingScheme) throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try token.createWrappingKey(label: "service", id: [1], scheme: scheme)
        let value = pkcs11Error {
            // CKA_PRIVATE_EXPONENT (0x123) for RSA, CKA_VALUE (0x11) for AES and EC.
            try token.withSession { session throws(PKCS11Error) in
                try token.module.attributeValues(session, key.secret, [scheme == .rsaOAEP ? 0x123 : 0x11])
            }
        }
        #expect(value?.returnValue == .attributeSensitive)
        let dataKey = SecureBytes(random: 32)
        let aad = Array("service/item".utf8)
        let sealed = try token.seal(dataKey, with: key, associatedData: aad)
        #expect(PKCS11Token.scheme(ofSealed: sealed) == scheme)
        if scheme == .rsaOAEP {
            // OAEP with SHA-256 where the token takes it; SoftHSM2 2.6 takes SHA-1 only. The format byte says which.
            let version = token.module.info.version
            #expect(sealed[0] == (version.major == 2 && version.minor < 7 ? 3 : 2))
            #expect(token.oaepTakesSHA256 == (sealed[0] == 2))
        }
        #expect(try token.open(sealed, with: key, associatedData: aad) == dataKey)
        #expect(try token.seal(dataKey, with: key, associatedData: aad) != sealed, "fresh randomness every seal")

        // Another process's view: found again by label and ID, in its scheme.
        let again = try hsm.loggedInToken()
        let found = try #require(try again.wrappingKey(label: "service", id: [1]))
        #expect(found.scheme == scheme)
        #expect(try again.open(sealed, with: found, associatedData: aad) == dataKey)

        let attributes = try token.attributes(of: key)
        #expect(attributes.token && attributes.sensitive && attributes.alwaysSensitive)
        #expect(!attributes.extractable && attributes.neverExtractable)
        #expect(!attributes.sign && !attributes.wrap && !attributes.unwrap)
        #expect(attributes.decrypt == (scheme != .ecdhP256) && attributes.derive == (scheme == .ecdhP256))
        #expect(try token.destroyKeys(label: "service") == (scheme == .aesGCM ? 1 : 2), "the key, or both halves of the pair")
        #expect(try token.wrappingKey(label: "service", id: [1]) == nil)
    }

    @Test func ecdhLeavesOnlyTheStaticPairOnTheTokenAndInTheSession() throws {
        let hsm = try SoftHSM(mechanisms: TokenTests.ecOnly)
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        for _ in 0..<3 {
            let sealed = try token.seal(SecureBytes(random: 32), with: key, associatedData: [])
            _ = try token.open(sealed, with: key, associatedData: [])
        }
        // Ephemeral pairs and derived secrets are session objects, destroyed after each use.
        let inSession = try token.withSession { session throws(PKCS11Error) in
            try token.module.findObjects(session, matching: AttributeTemplate())
        }
        #expect(inSession.count == 2)
        #expect(try objectCount(hsm) == 2)
    }

    @Test(arguments: WrappingScheme.allCases)
    func anAlteredByteOrOtherAssociatedDataIsRejected(_ scheme: WrappingScheme) throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try token.createWrappingKey(label: "service", id: [1], scheme: scheme)
        let aad = Array("service/item".utf8)
        let sealed = try token.seal(SecureBytes(random: 32), with: key, associatedData: aad)
        // The format byte, the token's part (IV, RSA ciphertext or ephemeral point), the nonce, the tag.
        for index in [0, 1, 5, sealed.count - 40, sealed.count - 1] {
            var altered = sealed
            altered[index] ^= 0x01
            let error = pkcs11Error { try token.open(altered, with: key, associatedData: aad) }
            #expect(error?.isDataRejected == true, "byte \(index): \(String(describing: error))")
        }
        #expect(pkcs11Error { try token.open(sealed, with: key, associatedData: [1]) }?.isDataRejected == true)
        #expect(pkcs11Error { try token.open(Array(sealed.prefix(30)), with: key, associatedData: aad) }?.isDataRejected == true)
        let other = try token.createWrappingKey(label: "other", id: [1], scheme: scheme)
        #expect(pkcs11Error { try token.open(sealed, with: other, associatedData: aad) }?.isDataRejected == true)
        #expect(try token.open(sealed, with: key, associatedData: aad).count == 32, "the token still works")
    }

    #if DEBUG
    @Test func aSealedKeyFromBeforeTheFormatByteStillOpens() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let dataKey = SecureBytes(random: 32)
        let legacy = try token.legacySeal(dataKey, with: key, associatedData: [7])
        #expect(legacy.count == 60)
        #expect(PKCS11Token.scheme(ofSealed: legacy) == .aesGCM)
        #expect(try token.open(legacy, with: key, associatedData: [7]) == dataKey)
        #expect(pkcs11Error { try token.open(legacy, with: key, associatedData: [8]) }?.isDataRejected == true)
    }
    #endif

    @Test func aKeyOfAnotherSchemeCannotOpenASealedKey() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let aes = try token.createWrappingKey(label: "a", id: [1], scheme: .aesGCM)
        let ec = try token.createWrappingKey(label: "e", id: [1], scheme: .ecdhP256)
        let sealed = try token.seal(SecureBytes(random: 32), with: aes, associatedData: [])
        let error = pkcs11Error { try token.open(sealed, with: ec, associatedData: []) }
        #expect(error?.isDataRejected == true && error?.detail?.contains("AES-GCM") == true)
    }

    // MARK: Failures leave nothing

    #if DEBUG
    @Test(arguments: WrappingScheme.allCases)
    func aStepThatFailsAfterTheKeyIsMadeLeavesNothingOnTheToken(_ scheme: WrappingScheme) throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        for point in [PKCS11Token.FaultPoint.afterKeyGeneration, .afterProbeSeal] {
            token.faultPoint = point
            let error = pkcs11Error { try token.createWrappingKey(label: "service", id: [1], scheme: scheme) }
            #expect(error?.returnValue == .deviceError)
            #expect(try token.wrappingKey(label: "service", id: [1]) == nil)
            #expect(try objectCount(hsm) == 0, "\(scheme) after \(point)")
        }
    }
    #endif
}
