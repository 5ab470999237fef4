import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// Vendor-signed boot states (issue 12, proof (c)): a store set up with the vendor's public key opens
/// `ThisDeviceOnly` items in any state the vendor signed, and in no other; a policy signed by another key,
/// or of a revoked generation, is refused by the TPM.
@Suite("Vendor-signed boot states", .offThePool)
struct VendorBootPolicyTests {
    static let passcode = "2580"

    struct Vendor {
        let directory: String
        var privatePEM: SecureBytes
        var publicPEM: [UInt8]

        /// A P-256 key made with the openssl tool, as a vendor's pipeline would.
        init(_ directory: String, name: String) throws {
            self.directory = directory
            let path = "\(directory)/\(name).pem"
            #expect(try run("/usr/bin/openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path]).status == 0)
            let pub = try run("/usr/bin/openssl", ["pkey", "-in", path, "-pubout"])
            privatePEM = SecureBytes(copying: Array(try Data(contentsOf: URL(fileURLWithPath: path))))
            publicPEM = pub.stdout
        }

        func sign(_ pcr7: [UInt8], generation: Int) throws -> [UInt8] {
            try KeychainAdministration.signBootPolicy(pcrs: [7: pcr7], generation: generation, privateKeyPEM: privatePEM)
        }
    }

    func pcr7(_ f: Fixture) throws -> [UInt8] { try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7]))[0] }
    func predictedPCR7(_ f: Fixture) throws -> [UInt8] { sha256(try pcr7(f), sha256(Array("keychain tests: boot changed".utf8))) }

    func vendorFixture() async throws -> (Fixture, Vendor) {
        let f = try Fixture()
        try await f.device.initialize()
        let vendor = try Vendor(f.tpm.directory, name: "vendor")
        try await f.administration.useBootPolicyKey(publicKeyPEM: vendor.publicPEM)
        return (f, vendor)
    }

    @Test func anInstalledSignedPolicyOpensItemsAndTheNextReleasesPolicyOpensThemAfterTheUpdate() async throws {
        let (f, vendor) = try await vendorFixture()
        let storage = try f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        // No policy installed yet: never sealed to a state nobody signed.
        do { try await storage.setItem("k", "v"); Issue.record("sealed without a signed policy") } catch {
            #expect(error.code == .deviceStateChanged && error.message.contains("boot-state install"), "\(error.message)")
        }
        _ = try await f.administration.installBootPolicy(try vendor.sign(try pcr7(f), generation: 0))
        try await storage.setItem("k", "v")
        let sealedRecord = try #require(try Store(directory: f.configuration.storeDirectory)
            .wrappingKey(service: "tdo", protection: try ItemProtection(accessible: .afterFirstUnlockThisDeviceOnly).storageTag))
        let sealed = try #require(SealPolicy.decode(sealedRecord.policy))
        #expect(sealed.bootVendorKeyName != nil && sealed.bootApprovalName == nil && sealed.pcrDigest == nil)
        // The next release's policy, installed before the update: nobody on the device approves anything.
        _ = try await f.administration.installBootPolicy(try vendor.sign(try predictedPCR7(f), generation: 1))
        await f.device.dropCaches()
        #expect(try await storage.getItem("k") == "v", "the current state's policy still opens")
        try f.extendPCR(7)  // the update
        await f.device.dropCaches()
        #expect(try await storage.getItem("k") == "v")
        #expect(try await f.administration.bootState().matches)
        // A state nobody signed: DEVICE_STATE_CHANGED, item kept.
        try f.extendPCR(7)
        await f.device.dropCaches()
        #expect(await code { try await storage.getItem("k") } == .deviceStateChanged)
    }

    /// A policy signed by another key: `install` is refused by the TPM's VerifySignature; and with raw
    /// ESAPI the other key's ticket neither passes PolicyAuthorize for the vendor's key name nor, under
    /// its own name, leaves the digest the key was sealed to. The control (the vendor's ticket) unseals.
    @Test func aPolicySignedByAnotherKeyIsRefusedByTheTPM() async throws {
        let (f, vendor) = try await vendorFixture()
        let other = try Vendor(f.tpm.directory, name: "other")
        _ = try await f.administration.installBootPolicy(try vendor.sign(try pcr7(f), generation: 0))
        try await f.storage("tdo", accessible: .alwaysThisDeviceOnly).setItem("k", "v")
        try f.extendPCR(7)
        let forged = try other.sign(try pcr7(f), generation: 0)
        do { _ = try await f.administration.installBootPolicy(forged); Issue.record("installed a policy of another key") } catch {
            #expect(error.code == .authenticationFailed && error.message.contains("not signed by"), "\(error.message)")
        }
        let store = try Store(directory: f.configuration.storeDirectory)
        let record = try #require(try store.wrappingKey(service: "tdo", protection: try ItemProtection(accessible: .alwaysThisDeviceOnly).storageTag))
        let vendorKey = try #require(try store.meta(StoreMeta.bootVendorKey))
        let vendorName = try TPMContext.name(ofPublic: vendorKey)
        let policy = try #require(try? JSONDecoder().decode(SignedBootPolicy.self, from: Data(forged)))
        let state = try #require(policy.state)
        let (ox, oy) = try VendorKey.publicPoint(pem: other.publicPEM)
        let otherKey = try TPMContext.eccVerificationPublic(x: ox, y: oy)

        let context = try TPMContext(device: f.tpm.device)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let generation = try context.resource(forPersistent: VendorBootLayout.generationIndex)
        let otherTicket = try context.verifySignature(keyPublic: otherKey, digest: VendorBootLayout.signedDigest(state, generation: 0),
                                                      signature: policy.signature.hexBytes ?? [])
        func attempt(keyName: [UInt8], ticket: [UInt8]) throws -> TPMError? {
            let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
            defer { context.flush(session) }
            let object = try context.load(.init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), parent: srk)
            defer { context.flush(object) }
            do {
                try context.policyPCR(session, selection: PCRSelection([7]), digest: [])
                guard case .nv(_, _, let operand, let offset, let comparison) = VendorBootLayout.generationStep(0) else { return nil }
                try context.policyNV(session, index: generation, operand: operand, offset: offset, comparison: comparison)
                try context.policyAuthorize(session, approvedPolicy: VendorBootLayout.approvedPolicy(state, generation: 0),
                                            policyRef: VendorBootLayout.policyRef, keyName: keyName, ticket: ticket)
                _ = try context.unseal(object, session: session)
                return nil
            } catch { return error }
        }
        #expect(try attempt(keyName: vendorName, ticket: otherTicket) != nil, "the other key's ticket passed for the vendor's name")
        #expect(try attempt(keyName: try TPMContext.name(ofPublic: otherKey), ticket: otherTicket)?.code.is(.policyFail) == true)
        // The control: the vendor signing the same state does unseal with these very calls.
        let genuineData = try vendor.sign(try pcr7(f), generation: 0)
        let genuine = try #require(try? JSONDecoder().decode(SignedBootPolicy.self, from: Data(genuineData)))
        let vendorTicket = try context.verifySignature(keyPublic: vendorKey, digest: VendorBootLayout.signedDigest(state, generation: 0),
                                                       signature: genuine.signature.hexBytes ?? [])
        #expect(try attempt(keyName: vendorName, ticket: vendorTicket) == nil)
    }

    /// `revoke-before N` (the passcode) makes the TPM refuse every policy of a lower generation: the
    /// library's read and a raw replay of the stored policy and ticket; a newer generation still opens.
    @Test func aRevokedGenerationIsRefusedByTheTPMAlsoWhenReplayed() async throws {
        let (f, vendor) = try await vendorFixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        _ = try await f.administration.installBootPolicy(try vendor.sign(try pcr7(f), generation: 1))
        let storage = try f.storage("tdo", accessible: .alwaysThisDeviceOnly)
        try await storage.setItem("k", "v")
        let store = try Store(directory: f.configuration.storeDirectory)
        let installedData = try #require(try store.meta(StoreMeta.bootVendorPolicies))
        let installed = try #require(try JSONDecoder().decode([InstalledBootPolicy].self, from: Data(installedData)).first)
        #expect(installed.policy.generation == 1)
        let record = try #require(try store.wrappingKey(service: "tdo", protection: try ItemProtection(accessible: .alwaysThisDeviceOnly).storageTag))
        // The replay opens the key while generation 1 stands: what it runs is what a read runs.
        #expect(try replay(f, record, installed).count > 0)
        #expect(await code { try await f.administration.revokeBootPolicies(before: 2, passcode: bytes("1111")) } == .authenticationFailed)
        try await f.administration.revokeBootPolicies(before: 2, passcode: bytes(Self.passcode))
        await f.device.dropCaches()
        do { _ = try await storage.getItem("k"); Issue.record("a revoked generation opened the item") } catch {
            #expect(error.code == .deviceStateChanged && error.message.contains("revoked"), "\(error.message)")
        }
        // The same replay of the stored policy and ticket, after the revocation: the TPM refuses its PolicyNV.
        do {
            _ = try replay(f, record, installed)
            Issue.record("a replay of a revoked generation's policy unsealed the key")
        } catch {
            #expect(error.command == "PolicyNV", "\(error)")
        }
        // Nobody without the passcode or the owner authorization un-revokes or revokes: tpm2_nvsetbits is refused.
        let env = ["TPM2TOOLS_TCTI": f.tpm.tcti]
        #expect(try run("/usr/bin/tpm2_nvsetbits", ["0x01004B55", "-C", "0x01004B55", "-i", "0x4"], environment: env).status != 0)
        // A newer generation for the same state opens the item again.
        _ = try await f.administration.installBootPolicy(try vendor.sign(try pcr7(f), generation: 2))
        #expect(try await storage.getItem("k") == "v")
    }

    /// A read of `record`'s key replayed with raw ESAPI from what the store keeps: its sealed object
    /// and policy steps, and for the vendor's step the installed policy's PCRs, generation and ticket.
    /// The unsealed secret, or the TPM's refusal.
    func replay(_ f: Fixture, _ record: WrappingKeyRecord, _ installed: InstalledBootPolicy) throws(TPMError) -> SecureBytes {
        guard let policy = SealPolicy.decode(record.policy), let state = installed.policy.state,
              let ticket = installed.ticket.hexBytes,
              case .nv(_, _, let operand, let offset, let comparison) = VendorBootLayout.generationStep(installed.policy.generation) else {
            throw TPMError(command: "decode the stored policy", code: .failure)
        }
        let context = try TPMContext(device: f.tpm.device)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let object = try context.load(TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), parent: srk)
        defer { context.flush(object) }
        let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
        defer { context.flush(session) }
        try context.run(policy.steps, on: session, nvIndex: { index throws(TPMError) in try context.resource(forPersistent: index) },
                        other: { step throws(TPMError) in
            guard case .authorize(let keyName, _) = step else { throw TPMError(command: "policy step \(step)", code: .failure) }
            try context.policyPCR(session, selection: PCRSelection(state.values.keys.sorted()), digest: [])
            try context.policyNV(session, index: try context.resource(forPersistent: VendorBootLayout.generationIndex),
                                 operand: operand, offset: offset, comparison: comparison)
            try context.policyAuthorize(session, approvedPolicy: VendorBootLayout.approvedPolicy(state, generation: installed.policy.generation),
                                        policyRef: VendorBootLayout.policyRef, keyName: keyName, ticket: ticket)
        })
        return try context.unseal(object, session: session)
    }

    /// Vectors from tpm2-tools 5.4 on swtpm (the PIN index as in PolicyKnownAnswerTests), from the library's own layout:
    ///     tpm2_policysecret -S s.ctx -c 0x01004B50 kat-pin; tpm2_policycommandcode -S s.ctx -L setbits.policy TPM2_CC_NV_SetBits
    ///     tpm2_nvdefine 0x01004B55 -C o -s 8 -a "nt=bits|policywrite|ownerwrite|authread|no_da" -L setbits.policy
    ///     tpm2_nvreadpublic 0x01004B55, before and after tpm2_nvsetbits 0x01004B55 -C o -i 0
    ///     tpm2_policypcr -S s.ctx -l sha256:7 (PCR 7 zero); tpm2_policynv -S s.ctx -i gen1.bin 0x01004B55 bc -L approved.policy
    ///         (gen1.bin: 00 00 00 00 00 00 00 02, generation 1)
    ///     tpm2_loadexternal -C o -G ecc256:ecdsa-sha256:null -a "userwithauth|sign" -u vendor.pub -n v.name
    ///     tpm2_policyauthorize -S s.ctx -i approved.policy -q ref.bin -n v.name -L key.policy (ref.bin: "keychain-boot-policy")
    @Test func theGenerationIndexAndTheVendorPoliciesMatchTpm2Tools() throws {
        let pub = VendorBootLayout.generationPublic
        #expect(pub.attributes == 0x0204_002A)
        #expect(pub.authPolicy.hex == "8e8cc432f299f16885bdfc066d65e85654027171474212599bc75880d99c87b2")
        #expect(pub.name(written: false).hex == "000baf58ec00509004d18271c2c21cdd42ecd6a70a3800d797b07915a08bfade456e")
        #expect(VendorBootLayout.generationName.hex == "000ba591c7c9baf956ef0457870a3825ff68e804ff3fdc0336da7baac77fb404073c")
        let state = BootState(values: [7: [UInt8](repeating: 0, count: 32)])
        #expect(VendorBootLayout.approvedPolicy(state, generation: 1).hex == "451cc812c2bbd16c6d668229383d517dced1f4d8c20e71917fe5d5e6b85d5879")
        let pem = """
            -----BEGIN PUBLIC KEY-----
            MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEVXiA1bVuqfyxJEwyO01byw/n8ND6
            1KaGIDfQUvcI7lH/P6ckv6AIvV3tfOu/kNOki5tLVSaXACtmjErfIVwuWw==
            -----END PUBLIC KEY-----

            """
        let (x, y) = try VendorKey.publicPoint(pem: Array(pem.utf8))
        let name = try TPMContext.name(ofPublic: try TPMContext.eccVerificationPublic(x: x, y: y))
        #expect(name.hex == "000becf3df26c9b45230e502431b3cdd1d8b152e9eeb23625b75fe4c2cc13f3238c1")
        var policy = SealPolicy(availability: .always, stateName: [])
        policy.pcrs = [7]
        policy.bootVendorKeyName = name
        #expect(policy.digest.hex == "439f8bd3e5011bf648adb5a96157c52df166dfcf64d49aa7a89d6b979774a9db")
    }

    /// The vendor's pipeline signs without a TPM or a store (`--tcti` points nowhere); the device
    /// installs the file, and the owner revokes with the CLI.
    @Test func keychainctlSignsOfflineAndTheDeviceInstallsAndRevokes() async throws {
        let (f, vendor) = try await vendorFixture()
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let key = f.tpm.directory + "/vendor.pem"
        let hex = try pcr7(f).map { String(format: "%02x", $0) }.joined()
        let signed = try run(ctl, ["--store", f.tpm.directory + "/nowhere", "--tcti", "swtpm:host=127.0.0.1,port=1",
                                   "boot-state", "sign", "--key", key, "--pcr", "7=" + hex, "--generation", "3"])
        #expect(signed.status == 0, "\(signed.stderr)")
        #expect(!FileManager.default.fileExists(atPath: f.tpm.directory + "/nowhere/keychain.db"), "no store was made")
        try Data(signed.stdout).write(to: URL(fileURLWithPath: f.tpm.directory + "/policy.json"))
        let base = ["--store", f.configuration.storeDirectory, "--tcti", f.tpm.tcti, "--reader", "none"]
        let install = try run(ctl, base + ["boot-state", "install", f.tpm.directory + "/policy.json"])
        #expect(install.status == 0 && String(decoding: install.stdout, as: UTF8.self).contains("boot state: approved"), "\(install.stderr)")
        #expect(try run(ctl, base + ["set", "tdo", "k", "--accessible", "alwaysThisDeviceOnly"], input: Array("v".utf8)).status == 0)
        #expect(try run(ctl, base + ["get", "tdo", "k"]).stdout == Array("v".utf8))
        #expect(try run(ctl, base + ["boot-state", "revoke-before", "4"], input: [0x0A]).status == 0)
        let after = try run(ctl, base + ["get", "tdo", "k"])
        #expect(after.status == 3 && after.stderr.contains("DEVICE_STATE_CHANGED") && after.stderr.contains("revoked"), "\(after.stderr)")
        _ = vendor
    }

    /// The cost: a vendor key opens with PolicyPCR, PolicyNV (generation) and PolicyAuthorize (the kept
    /// ticket): 2 commands more than a literal key, with one policy installed.
    @Test func aVendorKeyCostsTwoCommandsMoreThanALiteralOne() async throws {
        let (f, vendor) = try await vendorFixture()
        _ = try await f.administration.installBootPolicy(try vendor.sign(try pcr7(f), generation: 0))
        try await f.storage("tdo", accessible: .alwaysThisDeviceOnly).setItem("k", "v")
        let store = try Store(directory: f.configuration.storeDirectory)
        let record = try #require(try store.wrappingKey(service: "tdo", protection: try ItemProtection(accessible: .alwaysThisDeviceOnly).storageTag))
        let signed = try #require(SealPolicy.decode(record.policy))
        let keyring = try TPMKeyring(device: f.tpm.device, store: store, configuration: f.configuration)
        var start = keyring.context.commandCount
        let secret = try keyring.unseal(.init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), policy: signed)
        let signedCost = keyring.context.commandCount - start
        var literal = signed
        literal.bootVendorKeyName = nil
        literal.pcrDigest = sha256(try keyring.context.readPCRs(PCRSelection([7]))[0])
        let blob = try keyring.seal(secret, policy: literal)
        start = keyring.context.commandCount
        _ = try keyring.unseal(blob, policy: literal)
        #expect(signedCost == keyring.context.commandCount - start + 2, "signed \(signedCost)")
    }

    @Test func aKeyThatIsNotP256IsRefused() async throws {
        let f = try Fixture()
        let path = f.tpm.directory + "/rsa.pem"
        #expect(try run("/usr/bin/openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", path]).status == 0)
        let pub = try run("/usr/bin/openssl", ["pkey", "-in", path, "-pubout"]).stdout
        #expect(await code { try await f.administration.useBootPolicyKey(publicKeyPEM: pub) } == .invalidArgument)
        #expect(await code { try await f.administration.useBootPolicyKey(publicKeyPEM: Array("not a key".utf8)) } == .invalidArgument)
    }
}

private extension Array where Element == UInt8 {
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}
