import Foundation
import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Lock-state levels on a token item (issue 9, item 3): the key is split between a part the token
/// seals and a part the TPM seals under the level's policy, so the token alone does not open it.
@Suite("The token enforces the lock-state levels with the TPM", .offThePool)
struct TokenLockStateTests {
    typealias Token = TokenBackendTests.Token

    @Test func aWhenUnlockedTokenItemIsUnreadableWhileTheDeviceIsLocked() throws {
        let t = try Token()
        #expect(try t.cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox", "--accessible", "whenUnlocked"],
                          input: Array("locked away".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "a", "--key-storage", "strongbox", "--accessible", "always"], input: Array("any time".utf8)).status == 0)
        let store = try Store(directory: t.store)
        let key = try #require(try store.wrappingKey(service: "svc", protection: "whenUnlocked/none@strongbox"))
        #expect(key.backend == .token && key.tokenFormat == 2 && !key.sealedPrivate.isEmpty && !key.tokenSealed.isEmpty)
        #expect(try store.wrappingKey(service: "svc", protection: "always/none@strongbox")?.tokenFormat == 1)
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("locked away".utf8))
        #expect(try t.cli(["lock"]).status == 0)
        let locked = try t.cli(["--json", "get", "svc", "k"])
        #expect(t.errorCode(locked) == "INTERACTION_NOT_ALLOWED", "\(t.errorMessage(locked))")
        #expect(!String(decoding: locked.stdout, as: UTF8.self).contains("locked away"))
        // `always` needs only the token.
        #expect(try t.cli(["get", "svc", "a"]).stdout == Array("any time".utf8))
        #expect(try t.cli(["unlock"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("locked away".utf8))
    }

    /// The attacker has the token and its PIN and the store files, and the device is locked: the
    /// record is edited to say the token's part is the whole key (format 1), so the token opens its
    /// part for them. That part does not open the item.
    @Test func theTokensPartAloneDoesNotOpenALockStateItem() throws {
        let t = try Token()
        #expect(try t.cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox", "--accessible", "whenUnlocked"],
                          input: Array("locked away".utf8)).status == 0)
        #expect(try t.cli(["lock"]).status == 0)
        try FirstFormatMigrationTests.sql(t.store, "UPDATE wrapping_keys SET token_format = 1, sealed_public = x'', sealed_private = x'', "
                                          + "policy = x'' WHERE protection = 'whenUnlocked/none@strongbox';")
        let attack = try t.cli(["--json", "get", "svc", "k"])
        #expect(t.errorCode(attack) == "DATA_CORRUPTED", "\(t.errorMessage(attack))")
        #expect(!String(decoding: attack.stdout, as: UTF8.self).contains("locked away"))
    }

    /// The store is edited so that a split key's TPM policy names a user (a passcode branch the key was
    /// not sealed with): the read is refused as corrupted (the stored policy does not match the sealed
    /// object's) before any prompt or policy session.
    @Test func aSplitKeyWhosePolicyNamesAUserIsRefusedAsCorrupted() throws {
        let t = try Token()
        #expect(try t.cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox", "--accessible", "whenUnlocked"],
                          input: Array("locked away".utf8)).status == 0)
        let store = try Store(directory: t.store)
        var key = try #require(try store.wrappingKey(service: "svc", protection: "whenUnlocked/none@strongbox"))
        var policy = try #require(SealPolicy.decode(key.policy))
        #expect(policy.branches.isEmpty)
        policy.passcode = true
        key.policy = policy.encoded()
        try store.write { tx in try tx.putWrappingKey(key) }
        let read = try t.cli(["--json", "get", "svc", "k", "--passcode-stdin"], input: Array("2468\n".utf8))
        #expect(t.errorCode(read) == "DATA_CORRUPTED", "\(t.errorMessage(read))")
        #expect(!String(decoding: read.stdout, as: UTF8.self).contains("locked away"))
    }

    /// A write that moves an item from the TPM to a split token key, killed after each of its TPM
    /// commands: the item reads its old value, until the run that completes writes the new one.
    @Test func aKilledTokenWriteLeavesTheOldItemOrTheNew() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "k", "--accessible", "whenUnlocked"], input: Array("old".utf8)).status == 0)
        for n in 1...40 {
            let result = try run(buildDirectory.appendingPathComponent("keychainctl").path,
                                 ["--store", t.store, "--tcti", t.tpm.tcti, "--pkcs11-uri", t.uri(),
                                  "set", "svc", "k", "--key-storage", "strongbox", "--accessible", "whenUnlocked"],
                                 input: Array("new".utf8), environment: t.env.merging(["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"]) { $1 })
            #expect(result.status == 134 || result.status == 0, "kill \(n): \(result.stderr)")
            let got = String(decoding: try t.cli(["get", "svc", "k"]).stdout, as: UTF8.self)
            #expect(got == (result.status == 0 ? "new" : "old"), "kill \(n)")
            if result.status == 0 {
                #expect(n > 2, "the write was killed at \(n - 1) TPM commands")
                print("token write: completed at kill point \(n)")
                #expect(try Store(directory: t.store).wrappingKey(service: "svc", protection: "whenUnlocked/none@strongbox")?.tokenFormat == 2)
                return
            }
        }
        Issue.record("the write never completed")
    }

    /// Without a TPM's part a token's levels would be less than asked; `afterFirstUnlock` (the
    /// default) and `whenPasscodeSetThisDeviceOnly` are split too, and the latter dies with the passcode.
    @Test func aWhenPasscodeSetTokenItemGoesWithThePasscode() throws {
        let t = try Token()
        let refused = try t.cli(["--json", "set", "svc", "p", "--key-storage", "strongbox", "--accessible", "whenPasscodeSetThisDeviceOnly"],
                                input: [1])
        #expect(t.errorCode(refused) == "PASSCODE_NOT_SET", "\(t.errorMessage(refused))")
        #expect(try t.cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "p", "--key-storage", "strongbox", "--accessible", "whenPasscodeSetThisDeviceOnly"],
                          input: Array("with the passcode".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "d", "--key-storage", "strongbox"], input: Array("default".utf8)).status == 0)
        #expect(try Store(directory: t.store).wrappingKey(service: "svc", protection: "afterFirstUnlock/none@strongbox")?.tokenFormat == 2)
        #expect(try t.cli(["get", "svc", "p"]).stdout == Array("with the passcode".utf8))
        #expect(try t.cli(["passcode", "remove"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "p"]).stdout.isEmpty)
        #expect(try t.cli(["get", "svc", "d"]).stdout == Array("default".utf8))
    }
}

/// A read of a token item under a lock-state level costs the TPM commands of the same TPM item, no
/// more. In a child test process: SoftHSM2 takes one configuration per process.
@Suite("A token item's lock state costs no more TPM commands than a TPM item's", .offThePool)
struct TokenLockStateCostTests {
    static let childVariable = "KEYCHAIN_TEST_TOKEN_COST_CHILD"

    @Test func aColdTokenReadCostsTheTPMCommandsOfATPMRead() async throws {
        guard try isTheChildRun(of: "aColdTokenReadCostsTheTPMCommandsOfATPMRead", variable: Self.childVariable) else { return }
        let t = try TokenBackendTests.Token()
        let (configuration, device) = try await t.inThisProcess()
        try await device.setPasscode(SecureBytes(copying: Array("2468".utf8)))
        for accessible in [Accessible.whenUnlocked, .afterFirstUnlock, .whenPasscodeSetThisDeviceOnly] {
            let tpm = try createKeychain(.init(service: "tpm", accessible: accessible), configuration: configuration)
            let token = try createKeychain(.init(service: "token", accessible: accessible, android: .init(keyStorage: .strongbox)),
                                           configuration: configuration)
            try await tpm.setItem("k", "v")
            try await token.setItem("k", "v")
            var counts: [Int] = []
            for storage in [tpm, token] {
                await device.dropCaches()
                _ = await device.takeTPMCommandCount()
                #expect(try await storage.getItem("k") == "v")
                counts.append(await device.takeTPMCommandCount())
            }
            #expect(counts[1] <= counts[0] && counts[1] > 0, "\(accessible): TPM item \(counts[0]), token item \(counts[1]) commands")
            print("cold read, \(accessible.rawValue): TPM item \(counts[0]) TPM commands, token item \(counts[1])")
        }
    }
}
