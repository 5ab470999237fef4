import Foundation
import Keychain
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 22 item 12: the token backend on the PKCS#11 tokens Linux devices have beside SoftHSM2:
/// openCryptoki's software token and tpm2-pkcs11 (through tpm2-abrmd on a private bus, on a swtpm of
/// its own), through keychainctl in its own processes, the objects counted by pkcs11-tool.
@Suite("Tokens people have: openCryptoki and tpm2-pkcs11", .serialized, .offThePool)
struct TokenModuleTests {
    @Test func openCryptokiSetGetClearTheLockStateLevelsAndCanUseWorkAndLeaveNoObjects() throws {
        try setGetClearTheLockStateLevelsAndCanUseWorkAndLeaveNoObjects(on: .openCryptoki)
    }

    /// Before, tpm2-pkcs11 refused the RSA pair's template (`User specified and TPM specified attr
    /// mismatch: 0x10a`: it gives an RSA key the TPM's sign-and-decrypt), and with the template retried,
    /// its C_Encrypt said the ciphertext was as long as the buffer given (512 bytes, not the modulus's
    /// 256), so the sealed key never opened.
    @Test func tpm2PKCS11SetGetClearTheLockStateLevelsAndCanUseWorkAndLeaveNoObjects() throws {
        try setGetClearTheLockStateLevelsAndCanUseWorkAndLeaveNoObjects(on: .tpm2PKCS11)
    }

    func setGetClearTheLockStateLevelsAndCanUseWorkAndLeaveNoObjects(on module: TokenModule) throws {
        let t = try TokenBackendTests.Token(module)
        let canUse = String(decoding: try t.cli(["--json", "can-use", "none", "--key-storage", "strongbox"]).stdout, as: UTF8.self)
        #expect(canUse.contains("\"available\":true"), "\(canUse)")
        let first = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: Array("first".utf8))
        #expect(first.status == 0, "\(t.errorCode(first) ?? ""): \(t.errorMessage(first)) \(first.stderr)")
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("first".utf8))
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("second".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("second".utf8))
        // The token's PIN as the item's passcode.
        #expect(try t.cli(["set", "svc", "p", "--key-storage", "strongbox", "--access-control", "passcode"],
                          input: Array("pin-guarded".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "p", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout == Array("pin-guarded".utf8))
        // A lock-state level: the key split with the TPM, unreadable while the device is locked.
        #expect(try t.cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "w", "--key-storage", "strongbox", "--accessible", "whenUnlocked"],
                          input: Array("locked away".utf8)).status == 0)
        #expect(try t.cli(["lock"]).status == 0)
        #expect(t.errorCode(try t.cli(["--json", "get", "svc", "w"])) == "INTERACTION_NOT_ALLOWED")
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("second".utf8), "always needs only the token")
        #expect(try t.cli(["unlock"], input: Array("2468\n".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "w"]).stdout == Array("locked away".utf8))
        // On the token: the service's keys, their secret halves sensitive and never extractable.
        let objects = try t.objects()
        #expect(objects.contains("keychain:svc@strongbox"), "\(objects)")
        #expect(objects.contains("sensitive, always sensitive, never extractable"), "\(objects)")
        // clear destroys every object of the service: none is left behind.
        #expect(try t.cli(["clear", "svc"]).status == 0)
        let after = try t.objects()
        #expect(!after.contains("keychain:svc"), "\(after)")
        #expect(try Store(directory: t.store).wrappingKeys(service: "svc").isEmpty)
        #expect(try t.cli(["ls", "svc"]).stdout.isEmpty)
    }
}
