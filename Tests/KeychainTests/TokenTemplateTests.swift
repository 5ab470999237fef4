import Foundation
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// Issue 22 item 12's last part: a key template a token refuses is retried with what the token accepts,
/// or refused as `UNSUPPORTED` naming the attribute, with nothing left on the token; a token that takes
/// the template and makes the key without what keeps its secret in is caught on the key made. The token
/// is SoftHSM2 behind the package's test module (Sources/KeychainTestRefusingToken), which refuses or
/// drops the attributes a test names, through keychainctl in its own processes; the objects are listed
/// by pkcs11-tool on SoftHSM2's own module.
@Suite("Templates a token refuses", .offThePool)
struct TokenTemplateTests {
    typealias Token = TokenBackendTests.Token
    typealias Kind = TokenBackendTests.Kind

    /// An attribute that only narrows the key, refused by a token: the AES key's CKA_WRAP=false, the RSA
    /// public key's CKA_VERIFY=false, the EC private key's CKA_SIGN=false (each is in that template alone).
    static let narrowings: [(Kind, String)] = [(.full, "CKA_WRAP"), (.rsaOnly, "CKA_VERIFY"), (.ecOnly, "CKA_SIGN")]

    @Test(arguments: narrowings)
    func aNarrowingTheTokenRefusesIsLeftOutAndTheKeyStillKeepsItsSecret(_ kind: Kind, _ refused: String) throws {
        let t = try Token(.refusingSoftHSM(mechanisms: kind.mechanisms, refusing: [refused]))
        let set = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: Array("first".utf8))
        #expect(set.status == 0, "\(t.errorCode(set) ?? ""): \(t.errorMessage(set)) \(set.stderr)")
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("first".utf8))
        let wrapping = try #require(try Store(directory: t.store).wrappingKey(service: "svc", protection: "afterFirstUnlock/none@strongbox"))
        #expect(kind.formats.contains(wrapping.tokenSealed[0]), "the scheme of a \(kind) token: format byte \(wrapping.tokenSealed[0])")
        let objects = try t.objects()
        #expect(objects.contains("keychain:svc@strongbox") && objects.contains("sensitive, always sensitive, never extractable"), "\(objects)")
        #expect(try t.cli(["clear", "svc"]).status == 0)
        #expect(!(try t.objects()).contains("keychain:svc"))
    }

    /// What keeps the secret in, refused by a token (with each code a real token gives for it), in each
    /// scheme's template: the key cannot be made, the write says which attribute, nothing is stored.
    static let secretKeepers: [(Kind, String, String)] = [
        (.full, "CKA_SENSITIVE", "CKR_TEMPLATE_INCONSISTENT"), (.rsaOnly, "CKA_EXTRACTABLE", "CKR_ATTRIBUTE_TYPE_INVALID"),
        (.ecOnly, "CKA_PRIVATE", "CKR_GENERAL_ERROR"),
    ]

    @Test(arguments: secretKeepers)
    func aTokenThatRefusesWhatKeepsTheSecretInIsUnsupportedNamingTheAttribute(_ kind: Kind, _ refused: String, _ code: String) throws {
        let t = try Token(.refusingSoftHSM(mechanisms: kind.mechanisms, refusing: [refused], with: code))
        let set = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: Array("never stored".utf8))
        #expect(set.status == 3 && t.errorCode(set) == "UNSUPPORTED", "\(t.errorCode(set) ?? ""): \(t.errorMessage(set)) \(set.stderr)")
        #expect(t.errorMessage(set).contains("refuses \(refused)=") && t.errorMessage(set).contains(code), "\(t.errorMessage(set))")
        #expect(try Store(directory: t.store).item(service: "svc", key: "k") == nil)
        #expect(try Store(directory: t.store).wrappingKeys(service: "svc").isEmpty)
        #expect(!(try t.objects()).contains("keychain:svc"), "an orphaned token object")
    }

    /// A token that takes the template and makes the key without CKA_SENSITIVE, saying nothing: the key
    /// made is read back and destroyed, the write is `UNSUPPORTED` naming the attribute, and no object of
    /// the service is left on the token.
    @Test(arguments: Kind.allCases)
    func aKeyMadeWithoutWhatKeepsItsSecretInIsDestroyedAndLeavesNoObject(_ kind: Kind) throws {
        let t = try Token(.refusingSoftHSM(mechanisms: kind.mechanisms, refusing: [], ignoring: ["CKA_SENSITIVE"]))
        let set = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: Array("never stored".utf8))
        #expect(set.status == 3 && t.errorCode(set) == "UNSUPPORTED" && t.errorMessage(set).contains("without CKA_SENSITIVE=true"),
                "\(t.errorCode(set) ?? ""): \(t.errorMessage(set)) \(set.stderr)")
        let objects = try t.objects()
        #expect(!objects.contains("keychain:svc"), "an orphaned token object: \(objects)")
        #expect(try Store(directory: t.store).item(service: "svc", key: "k") == nil)
    }
}
