import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// Local approval of boot states (issue 12): a PCR 7 extension stands in for a firmware or Secure Boot
/// update. Items stay; a state opens them once it is approved with the passcode or the owner authorization.
@Suite("Approved boot states for ThisDeviceOnly items", .offThePool)
struct BootApprovalTests {
    static let passcode = "2580"
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    func cli(_ f: Fixture, _ args: [String], _ input: String = "", abortAfter: Int? = nil) throws -> (status: Int32, stdout: String, stderr: String) {
        let result = try run(ctl, ["--store", f.configuration.storeDirectory, "--tcti", f.tpm.tcti, "--reader", "none"] + args,
                             input: Array(input.utf8),
                             environment: abortAfter.map { ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\($0)"] } ?? [:])
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// PCR 7 as `Fixture.extendPCR(7)` will leave it: what an update's vendor publishes.
    func predictedPCR7(_ f: Fixture) throws -> [UInt8] {
        let now = try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7]))[0]
        return sha256(now, sha256(Array("keychain tests: boot changed".utf8)))
    }

    func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    // (a) An update approved before its reboot never locks anything.
    @Test func aPredictionApprovedBeforeTheUpdateOpensItemsAfterIt() async throws {
        let f = try Fixture()
        #expect(try cli(f, ["passcode", "set"], Self.passcode + "\n").status == 0)
        #expect(try cli(f, ["set", "tdo", "k", "--accessible", "afterFirstUnlockThisDeviceOnly"], "before").status == 0)
        let approve = try cli(f, ["boot-state", "approve", "--pcr", "7=" + hex(try predictedPCR7(f))], Self.passcode + "\n")
        #expect(approve.status == 0, "\(approve.stderr)")
        #expect(approve.stdout.contains("pcr 7 approved: " + hex(try predictedPCR7(f))))
        // Approving the new state revoked the old one at once: the state before the update opens nothing now.
        let before = try cli(f, ["get", "tdo", "k"])
        #expect(before.status == 3 && before.stderr.contains("DEVICE_STATE_CHANGED"), "\(before.stderr)")
        try f.extendPCR(7)  // the update
        let after = try cli(f, ["get", "tdo", "k"])
        #expect(after.status == 0 && after.stdout == "before", "\(after.stderr)")
        #expect(try cli(f, ["set", "tdo", "k2", "--accessible", "whenUnlockedThisDeviceOnly"], "new").status == 0)
        #expect(try cli(f, ["boot-state"]).stdout.contains("boot state: approved"))
    }

    // (b) No approval: DEVICE_STATE_CHANGED naming the PCR and the command; approve with the passcode: it reads.
    @Test func anUnapprovedStateNamesThePCRAndTheCommandAndOpensOnceApproved() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        let storage = try f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        try await storage.setItem("k", "v")
        try f.extendPCR(7)
        await f.device.dropCaches()
        do { _ = try await storage.getItem("k"); Issue.record("read in an unapproved state") } catch {
            #expect(error.code == .deviceStateChanged)
            #expect(error.message.contains("PCR 7") && error.message.contains("keychainctl boot-state approve"), "\(error.message)")
        }
        // A write is refused the same way, and nothing is stored.
        let fresh = try f.storage("fresh", accessible: .whenUnlockedThisDeviceOnly)
        do { try await fresh.setItem("k", "v"); Issue.record("sealed to an unapproved state") } catch {
            #expect(error.code == .deviceStateChanged && error.message.contains("PCR 7") && error.message.contains("boot-state approve"))
        }
        #expect(try Store(directory: f.configuration.storeDirectory).wrappingKeys(service: "fresh").isEmpty)
        let status = try cli(f, ["boot-state"])
        #expect(status.stdout.contains("NOT approved (PCR 7 differs)"), "\(status.stdout)")
        #expect(try cli(f, ["status"]).stdout.contains("boot state: NOT approved"))
        // A wrong passcode approves nothing (and the TPM counts it).
        #expect(await code { try await f.administration.approveBootState(passcode: bytes("1111")) } == .authenticationFailed)
        #expect(await code { try await storage.getItem("k") } == .deviceStateChanged)
        let approved = try await f.administration.approveBootState(passcode: bytes(Self.passcode))
        #expect(approved.matches && approved.differing.isEmpty)
        #expect(try await storage.getItem("k") == "v")
        try await fresh.setItem("k", "v")
        #expect(try await fresh.getItem("k") == "v")
    }

    @Test func theOwnerAuthorizationApprovesToo() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        let storage = try f.storage("tdo", accessible: .alwaysThisDeviceOnly)
        try await storage.setItem("k", "v")
        try f.extendPCR(7)
        await f.device.dropCaches()
        #expect(await code { try await storage.getItem("k") } == .deviceStateChanged)
        _ = try await f.administration.approveBootStateAsOwner()
        #expect(try await storage.getItem("k") == "v")
    }

    @Test func aPredictionForAPCROutsideTheSelectionIsRefused() async throws {
        let f = try Fixture()
        let result = try cli(f, ["boot-state", "approve", "--pcr", "0=" + String(repeating: "00", count: 32)])
        #expect(result.status == 2 && result.stderr.contains("INVALID_ARGUMENT") && result.stderr.contains("PCR selection"), "\(result.stderr)")
        let short = try cli(f, ["boot-state", "approve", "--pcr", "7=abcd"])
        #expect(short.status == 2 && short.stderr.contains("64 hex digits"), "\(short.stderr)")
    }

    // MARK: (d) Stores of earlier versions: keys sealed to literal PCR values

    /// Turns the service's wrapping key into what an earlier version sealed (PolicyPCR to the literal value,
    /// no approval index on the TPM, none in the store); returns that record, to put back again.
    func makeLiteral(_ f: Fixture, service: String, accessible: Accessible) throws -> WrappingKeyRecord {
        let store = try Store(directory: f.configuration.storeDirectory)
        let tag = try ItemProtection(accessible: accessible).storageTag
        var record = try #require(try store.wrappingKey(service: service, protection: tag))
        let keyring = try TPMKeyring(device: f.tpm.device, store: store, configuration: f.configuration)
        var policy = try #require(SealPolicy.decode(record.policy))
        let secret = try keyring.unseal(.init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), policy: policy)
        policy.bootApprovalName = nil
        policy.pcrDigest = sha256(try keyring.context.readPCRs(PCRSelection([7]))[0])
        let blob = try keyring.seal(secret, policy: policy)
        record.sealedPublic = blob.publicArea
        record.sealedPrivate = blob.privateArea
        record.policy = policy.encoded()
        try putBackLiteral(f, record, keyring: keyring)
        return record
    }

    func putBackLiteral(_ f: Fixture, _ record: WrappingKeyRecord, keyring: TPMKeyring? = nil) throws {
        let store = try Store(directory: f.configuration.storeDirectory)
        let context = try keyring?.context ?? TPMContext(device: f.tpm.device)
        if let index = try? context.resource(forPersistent: BootApprovalLayout.index) { try context.undefineNV(index) }
        try store.write { tx in
            try tx.putWrappingKey(record)
            _ = try tx.deleteMeta(StoreMeta.bootApprovalTR)
            _ = try tx.deleteMeta(StoreMeta.bootApproved)
        }
    }

    func policy(_ f: Fixture, service: String, accessible: Accessible) throws -> SealPolicy {
        let store = try Store(directory: f.configuration.storeDirectory)
        let record = try #require(try store.wrappingKey(service: service, protection: try ItemProtection(accessible: accessible).storageTag))
        return try #require(SealPolicy.decode(record.policy))
    }

    @Test func aLiteralPCRKeyIsSealedAgainToTheApprovedFormWhenOpened() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        let storage = try f.storage("old", accessible: .afterFirstUnlockThisDeviceOnly)
        try await storage.setItem("k", "v")
        _ = try makeLiteral(f, service: "old", accessible: .afterFirstUnlockThisDeviceOnly)
        #expect(try policy(f, service: "old", accessible: .afterFirstUnlockThisDeviceOnly).isLiteralBootBinding)
        await f.device.dropCaches()
        #expect(try await storage.getItem("k") == "v")
        let migrated = try policy(f, service: "old", accessible: .afterFirstUnlockThisDeviceOnly)
        #expect(!migrated.isLiteralBootBinding && migrated.bootApprovalName == BootApprovalLayout.name)
        // Now an update approved in advance keeps it readable (a literal key would be lost).
        _ = try await f.administration.approveBootState(predicted: [7: try predictedPCR7(f)], passcode: bytes(Self.passcode))
        try f.extendPCR(7)
        await f.device.dropCaches()
        #expect(try await storage.getItem("k") == "v")
    }

    /// A literal key is never moved to a state nobody approved: while the index approves another state
    /// (an update approved in advance), the key keeps its literal binding and still opens.
    @Test func aLiteralKeyIsNotMigratedWhileAnotherStateIsApproved() async throws {
        let f = try Fixture()
        let storage = try f.storage("old", accessible: .alwaysThisDeviceOnly)
        try await storage.setItem("k", "v")
        _ = try makeLiteral(f, service: "old", accessible: .alwaysThisDeviceOnly)
        _ = try await f.administration.approveBootStateAsOwner(predicted: [7: try predictedPCR7(f)])
        await f.device.dropCaches()
        #expect(try await storage.getItem("k") == "v")
        #expect(try policy(f, service: "old", accessible: .alwaysThisDeviceOnly).isLiteralBootBinding)
    }

    /// The migration killed after each of its TPM commands: every time, the item still reads (old blob or
    /// new), and a later open finishes the migration.
    @Test func theMigrationKilledAfterEachTPMCommandLosesNothing() async throws {
        let f = try Fixture()
        #expect(try cli(f, ["set", "old", "k", "--accessible", "alwaysThisDeviceOnly"], "v").status == 0)
        let literal = try makeLiteral(f, service: "old", accessible: .alwaysThisDeviceOnly)
        var completed = false
        var kills = 0
        for n in 1...60 {
            let killed = try cli(f, ["get", "old", "k"], abortAfter: n)
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let state = try policy(f, service: "old", accessible: .alwaysThisDeviceOnly)
            #expect(state.isLiteralBootBinding || state.bootApprovalName == BootApprovalLayout.name, "kill \(n)")
            let read = try cli(f, ["get", "old", "k"])
            #expect(read.status == 0 && read.stdout == "v", "kill \(n): \(read.stderr)")
            #expect(!(try policy(f, service: "old", accessible: .alwaysThisDeviceOnly).isLiteralBootBinding), "kill \(n): not migrated")
            if killed.status == 0 { completed = true; break }
            kills += 1
            try putBackLiteral(f, literal)
        }
        #expect(completed)
        #expect(kills >= 8, "the read and the migration send at least this many commands")
    }

    /// The cost: opening an approved key takes one TPM command more than a literal one (PolicyAuthorizeNV;
    /// the PCRs' digest is the TPM's own, no PCR_Read); a warm read takes none.
    @Test func anApprovedKeyCostsOneCommandMoreThanALiteralOneAndAWarmReadNone() async throws {
        let f = try Fixture()
        let storage = try f.storage("tdo", accessible: .alwaysThisDeviceOnly)
        try await storage.setItem("k", "v")
        let store = try Store(directory: f.configuration.storeDirectory)
        let tag = try ItemProtection(accessible: .alwaysThisDeviceOnly).storageTag
        let record = try #require(try store.wrappingKey(service: "tdo", protection: tag))
        let approved = try #require(SealPolicy.decode(record.policy))
        let keyring = try TPMKeyring(device: f.tpm.device, store: store, configuration: f.configuration)
        let blob = TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate)
        var start = keyring.context.commandCount
        let secret = try keyring.unseal(blob, policy: approved)
        let approvedCost = keyring.context.commandCount - start
        var literal = approved
        literal.bootApprovalName = nil
        literal.pcrDigest = sha256(try keyring.context.readPCRs(PCRSelection([7]))[0])
        let literalBlob = try keyring.seal(secret, policy: literal)
        start = keyring.context.commandCount
        _ = try keyring.unseal(literalBlob, policy: literal)
        let literalCost = keyring.context.commandCount - start
        #expect(approvedCost == literalCost + 1, "approved \(approvedCost), literal \(literalCost)")
        #expect(try await storage.getItem("k") == "v")  // cold
        _ = await f.device.takeTPMCommandCount()
        #expect(try await storage.getItem("k") == "v")
        #expect(await f.device.takeTPMCommandCount() == 0, "a warm read")
    }

    /// `boot-state approve` killed after each of its TPM commands: the TPM holds the old state or the new
    /// one, the item opens exactly in the state the TPM holds, and `boot-state` knows the values either way.
    @Test func anApprovalKilledAfterEachTPMCommandLeavesTheOldStateOrTheNew() async throws {
        let f = try Fixture()
        #expect(try cli(f, ["set", "tdo", "k", "--accessible", "alwaysThisDeviceOnly"], "v").status == 0)
        let old = hex(try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7]))[0])
        let new = hex(try predictedPCR7(f))
        var kills = 0
        for n in 1...40 {
            let killed = try cli(f, ["boot-state", "approve", "--pcr", "7=" + new], "\n", abortAfter: n)
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let status = try cli(f, ["boot-state"]).stdout
            let approvedNew = status.contains("pcr 7 approved: " + new)
            #expect(approvedNew || status.contains("pcr 7 approved: " + old), "kill \(n): \(status)")
            // In the old state (now), the item opens exactly when the old state is still approved.
            let read = try cli(f, ["get", "tdo", "k"])
            #expect((read.status == 0) == !approvedNew, "kill \(n): approved new \(approvedNew), read \(read.stderr)")
            if killed.status == 0 { #expect(approvedNew); break }
            kills += 1
            // Back to the old state for the next round (owner: the test TPM's is empty).
            if approvedNew { #expect(try cli(f, ["--owner-auth-file", "/dev/null", "boot-state", "approve"]).status == 0) }
        }
        #expect(kills >= 3)
    }

    // MARK: Bypass with tpm2-tools

    /// Nobody without the passcode or the owner authorization writes the approval index: not with the
    /// index's own (empty) authorization, not as an owner with a wrong authorization, not with a wrong
    /// passcode, not with a policy session that skips PolicySecret. The control (the right passcode, through
    /// the same tools) does write it, so each refusal is the TPM's.
    @Test func nobodyWithoutThePasscodeOrTheOwnerAuthorizationApprovesAState() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        let storage = try f.storage("tdo", accessible: .afterFirstUnlockThisDeviceOnly)
        try await storage.setItem("k", "v")
        let env = ["TPM2TOOLS_TCTI": f.tpm.tcti]
        let dir = f.tpm.directory
        #expect(try run("/usr/bin/tpm2_changeauth", ["-c", "o", "owner-secret"], environment: env).status == 0)
        try f.extendPCR(7)
        let now = try TPMContext(device: f.tpm.device).readPCRs(PCRSelection([7]))[0]
        let data = BootApprovalLayout.contents(BootApprovalLayout.approvedPolicy(BootState(values: [7: now])))
        try Data(data).write(to: URL(fileURLWithPath: "\(dir)/approve.bin"))
        let index = "0x01004B54"
        func tool(_ name: String, _ args: [String]) throws -> Int32 {
            try run("/usr/bin/" + name, args, environment: env).status
        }
        #expect(try tool("tpm2_nvwrite", [index, "-C", index, "-i", "\(dir)/approve.bin"]) != 0, "the index's own authorization")
        #expect(try tool("tpm2_nvwrite", [index, "-C", "o", "-i", "\(dir)/approve.bin"]) != 0, "the owner, empty authorization")
        #expect(try tool("tpm2_nvwrite", [index, "-C", "o", "-P", "guess", "-i", "\(dir)/approve.bin"]) != 0, "the owner, a guess")
        func withPolicy(_ pin: String?) throws -> Int32 {
            _ = try tool("tpm2_flushcontext", ["-s"])
            #expect(try tool("tpm2_startauthsession", ["--policy-session", "-S", "\(dir)/p.ctx"]) == 0)
            if let pin { _ = try tool("tpm2_policysecret", ["-S", "\(dir)/p.ctx", "-c", "0x01004B50", pin]) }
            _ = try tool("tpm2_policycommandcode", ["-S", "\(dir)/p.ctx", "TPM2_CC_NV_Write"])
            let status = try tool("tpm2_nvwrite", [index, "-C", index, "-P", "session:\(dir)/p.ctx", "-i", "\(dir)/approve.bin"])
            _ = try tool("tpm2_flushcontext", ["\(dir)/p.ctx"])
            return status
        }
        #expect(try withPolicy("1111") != 0, "a wrong passcode")
        #expect(try withPolicy(nil) != 0, "no PolicySecret")
        await f.device.dropCaches()
        #expect(await code { try await storage.getItem("k") } == .deviceStateChanged)
        #expect(try withPolicy(Self.passcode) == 0, "the control: the passcode writes it")
        #expect(try await storage.getItem("k") == "v")
    }

    /// A state approved before is revoked by the next approval: the stolen blob, loaded and run through
    /// PolicyPCR + PolicyAuthorizeNV with tpm2-tools, opens in the approved state only; back in the
    /// old state (after a reboot) it does not.
    @Test func aReplacedApprovalNoLongerUnsealsTheStolenBlob() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        try await f.storage("tdo", accessible: .alwaysThisDeviceOnly).setItem("k", "v")
        let store = try Store(directory: f.configuration.storeDirectory)
        let record = try #require(try store.wrappingKey(service: "tdo", protection: try ItemProtection(accessible: .alwaysThisDeviceOnly).storageTag))
        let dir = f.tpm.directory
        try Data(record.sealedPublic).write(to: URL(fileURLWithPath: "\(dir)/k.pub"))
        try Data(record.sealedPrivate).write(to: URL(fileURLWithPath: "\(dir)/k.priv"))
        let env = ["TPM2TOOLS_TCTI": f.tpm.tcti]
        func tool(_ name: String, _ args: [String]) throws -> Int32 { try run("/usr/bin/" + name, args, environment: env).status }
        func unsealWithTools() throws -> Bool {
            _ = try tool("tpm2_flushcontext", ["-t"]); _ = try tool("tpm2_flushcontext", ["-s"])
            #expect(try tool("tpm2_load", ["-C", "0x81000001", "-u", "\(dir)/k.pub", "-r", "\(dir)/k.priv", "-c", "\(dir)/k.ctx"]) == 0)
            #expect(try tool("tpm2_startauthsession", ["--policy-session", "-S", "\(dir)/p.ctx"]) == 0)
            _ = try tool("tpm2_policypcr", ["-S", "\(dir)/p.ctx", "-l", "sha256:7"])
            _ = try tool("tpm2_policyauthorizenv", ["-S", "\(dir)/p.ctx", "-C", "0x01004B54", "0x01004B54"])
            let status = try tool("tpm2_unseal", ["-c", "\(dir)/k.ctx", "-p", "session:\(dir)/p.ctx", "-o", "\(dir)/secret.bin"])
            _ = try tool("tpm2_flushcontext", ["-t"]); _ = try tool("tpm2_flushcontext", ["-s"])
            return status == 0
        }
        #expect(try unsealWithTools(), "the control: the approved state unseals")
        _ = try await f.administration.approveBootState(predicted: [7: try predictedPCR7(f)], passcode: bytes(Self.passcode))
        #expect(!(try unsealWithTools()), "the old state, approved before, was revoked")
        try f.extendPCR(7)
        #expect(try unsealWithTools(), "the newly approved state unseals")
        try f.tpm.reboot()  // PCR 7 back to the old state
        #expect(!(try unsealWithTools()), "the old approval does not come back with the old state")
    }

    // MARK: Known answers (the library's own layout, vectors from tpm2-tools 5.4 trial sessions on swtpm)

    /// tpm2_nvdefine 0x01004B50 (the PIN index, as in PolicyKnownAnswerTests), then
    /// tpm2_policysecret -S s.ctx -c 0x01004B50 kat-pin; tpm2_policycommandcode -S s.ctx -L approve.policy TPM2_CC_NV_Write;
    /// tpm2_nvdefine 0x01004B54 -C o -s 34 -a "policywrite|ownerwrite|authread|no_da" -L approve.policy;
    /// tpm2_nvreadpublic 0x01004B54 before and after tpm2_nvwrite 0x01004B54 -C o -i ha.bin
    @Test func theApprovalIndexMatchesTpm2NvReadPublic() {
        let pub = BootApprovalLayout.publicArea
        #expect(pub.attributes == 0x0204_000A)
        #expect(pub.authPolicy.hex == "7fa0815dd9e5198be0bace9010d364c54cacb250ec2a9fc3cfbcba14c2c7441a")
        #expect(pub.name(written: false).hex == "000b32fe9f2b47a4f55484ee9085f55256c352ed8eddd3194bb477a9054a9e5fa153")
        #expect(BootApprovalLayout.name.hex == "000b75df516405d066483254494ef30b37bb13a00722db04f274dfbc8f42f6576caa")
    }

    /// tpm2_policypcr -S s.ctx -l sha256:7 -L pcr.policy (PCR 7 zero) is what the index holds for that state.
    @Test func theApprovedPolicyOfAStateMatchesTpm2PolicyPCR() {
        let state = BootState(values: [7: [UInt8](repeating: 0, count: 32)])
        #expect(BootApprovalLayout.approvedPolicy(state).hex == "8b5682d81b29435d08d79278150611dc7e5923b2fefcce684a09577b40130a8b")
        #expect(BootApprovalLayout.contents(BootApprovalLayout.approvedPolicy(state)).prefix(2) == [0x00, 0x0B])
    }

    /// tpm2_policypcr -S s.ctx -l sha256:7; tpm2_policyauthorizenv -S s.ctx -C 0x01004B54 0x01004B54 -L anv.policy
    /// (the same with -l sha256:0,7: PolicyAuthorizeNV restarts the digest); then
    /// tpm2_policysecret -S s.ctx -c 0x01004B50 -L anvsecret.policy kat-pin for a key with the passcode branch.
    @Test func approvedKeyPoliciesMatchTpm2ToolsTrialSessions() {
        var policy = SealPolicy(availability: .always, stateName: [])
        policy.pcrs = [7]
        policy.bootApprovalName = BootApprovalLayout.name
        #expect(policy.digest.hex == "97f72420177b75df488f2455bfb37895d21a2f2f8f72b0fe1107144a015ff78a")
        policy.pcrs = [0, 7]
        #expect(policy.digest.hex == "97f72420177b75df488f2455bfb37895d21a2f2f8f72b0fe1107144a015ff78a")
        policy.passcode = true
        #expect(policy.digest.hex == "7f18c3eb591afe0c6b1e55f67f178fef8b04d890f0091234a325bb176fc86935")
    }
}

private extension Array where Element == UInt8 {
    var hex: String { map { String(format: "%02x", $0) }.joined() }
}
