import Foundation
import Keychain
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// `keyStorage: 'strongbox'` on a real SoftHSM2 token through p11-kit. Each test runs keychainctl in
/// its own processes with a private SOFTHSM2_CONF (SoftHSM reads it once per process).
@Suite("The PKCS#11 token backend", .offThePool)
struct TokenBackendTests {
    static let module = "/usr/lib/softhsm/libsofthsm2.so"

    /// A token `kc` (user PIN 1234) and a keychain store on a swtpm beside it, for keychainctl.
    struct Token {
        let tpm: SoftwareTPM
        let dir: String
        let env: [String: String]
        /// The module's path: the one module its URIs load (loading all of p11-kit's would start tpm2-pkcs11 too).
        let module: String
        /// The module `objects()` lists the token's objects with.
        let listingModule: String
        /// What runs behind the token (pkcsslotd), ended with it.
        let stack: TokenModuleStack
        var store: String { tpm.directory + "/store" }
        func uri(label: String = "kc", pinFile: String? = nil, module: String? = nil) -> String {
            "pkcs11:token=\(label)?module-path=\(module ?? self.module)&pin-source=file:\(pinFile ?? dir + "/pin")"
        }

        /// `mechanisms`: SoftHSM2's `slots.mechanisms`, what the token offers (see PKCS11Tests' SoftHSM).
        init(mechanisms: String? = nil) throws {
            try self.init(.softHSM(mechanisms: mechanisms))
        }

        init(_ kind: TokenModule) throws {
            tpm = try SoftwareTPM()
            dir = tpm.directory + "/token"
            module = kind.path
            listingModule = kind.listingPath
            stack = TokenModuleStack()
            try FileManager.default.createDirectory(atPath: dir + "/tokens", withIntermediateDirectories: true)
            try "1234\n".write(toFile: dir + "/pin", atomically: true, encoding: .utf8)
            try "9999\n".write(toFile: dir + "/wrong-pin", atomically: true, encoding: .utf8)
            switch kind {
            case .softHSM(let mechanisms), .refusingSoftHSM(let mechanisms, _, _, _):
                try ("directories.tokendir = \(dir)/tokens\n" + (mechanisms.map { "slots.mechanisms = \($0)\n" } ?? ""))
                    .write(toFile: dir + "/softhsm2.conf", atomically: true, encoding: .utf8)
                env = kind.environment.merging(["SOFTHSM2_CONF": dir + "/softhsm2.conf"]) { $1 }
                let made = try run("/usr/bin/softhsm2-util", ["--init-token", "--free", "--label", "kc", "--so-pin", "12345678", "--pin", "1234"],
                                   environment: env)
                #expect(made.status == 0, "softhsm2-util: \(made.stderr)")
            case .openCryptoki:
                try stack.startOpenCryptoki()
                env = [:]
            case .tpm2PKCS11:
                env = try stack.startTPM2PKCS11(in: dir)
            }
        }

        /// The token in this test process (SoftHSM2 takes one configuration per process: a child test's), and
        /// its device initialized.
        func inThisProcess() async throws -> (KeychainConfiguration, KeychainDevice) {
            setenv("SOFTHSM2_CONF", env["SOFTHSM2_CONF"]!, 1)
            var configuration = tpm.configuration(store: store)
            configuration.pkcs11URI = uri()
            let device = KeychainDevice(configuration: configuration)
            try await device.initialize()
            return (configuration, device)
        }

        func cli(_ args: [String], input: [UInt8] = [], uri: String? = nil) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(buildDirectory.appendingPathComponent("keychainctl").path,
                    ["--store", store, "--tcti", tpm.tcti, "--pkcs11-uri", uri ?? self.uri()] + args, input: input, environment: env)
        }

        func errorCode(_ result: (status: Int32, stdout: [UInt8], stderr: String)) -> String? {
            (try? JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: [String: String]])?["error"]?["code"]
        }

        func errorMessage(_ result: (status: Int32, stdout: [UInt8], stderr: String)) -> String {
            (try? JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: [String: String]])?["error"]?["message"] ?? ""
        }

        /// pkcs11-tool's listing of the token's objects, logged in (another process: token objects only).
        func objects() throws -> String {
            String(decoding: try run("/usr/bin/pkcs11-tool", ["--module", listingModule, "--login", "--pin", "1234", "-O"],
                                     environment: env).stdout, as: UTF8.self)
        }

        /// The token's mechanisms as `pkcs11-tool -M` lists them.
        func mechanisms() throws -> String {
            String(decoding: try run("/usr/bin/pkcs11-tool", ["--module", module, "-M"], environment: env).stdout,
                   as: UTF8.self)
        }
    }

    /// One namespace: a token storage's items are its service's items, seen by every storage of the
    /// service; a write with either keyStorage replaces the item wherever it was, and the key it was
    /// under goes when no item uses it any more.
    @Test func aTokenItemIsItsServicesItemAndAWriteReplacesItWhereverItWas() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("on the token".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("on the token".utf8))
        #expect(try t.cli(["has", "svc", "k"]).status == 0)
        #expect(String(decoding: try t.cli(["ls", "svc"]).stdout, as: UTF8.self) == "k\n")
        let tokenInfo = String(decoding: try t.cli(["--json", "info", "svc", "k"]).stdout, as: UTF8.self)
        #expect(tokenInfo.contains("\"securityLevel\":\"pkcs11Token\"") && tokenInfo.contains("\"service\":\"svc\"")
                && tokenInfo.contains("\"token\":\"kc\""), "\(tokenInfo)")
        let store = try Store(directory: t.store)
        #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/none@strongbox")?.backend == .token)
        // A TPM write replaces it; the token-held key no item uses is destroyed.
        #expect(try t.cli(["set", "svc", "k"], input: Array("in the TPM".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("in the TPM".utf8))
        #expect(String(decoding: try t.cli(["--json", "info", "svc", "k"]).stdout, as: UTF8.self).contains("\"securityLevel\":\"softwareTPM\""))
        #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/none@strongbox") == nil)
        // And back: a token write replaces the TPM item, and its TPM key goes.
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("token again".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k"]).stdout == Array("token again".utf8))
        #expect(try store.wrappingKey(service: "svc", protection: "afterFirstUnlock/none") == nil)
        #expect(try store.services() == ["svc"])
        // rm from a TPM storage removes it; clear from a TPM storage destroys the token objects too.
        #expect(try t.cli(["rm", "svc", "k"]).status == 0)
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).status != 0)
        #expect(try t.cli(["set", "svc", "k2", "--key-storage", "strongbox"], input: [1]).status == 0)
        #expect(try t.objects().contains("keychain:svc"))
        // No message names an internal service, not even the token's when its key is gone.
        #expect(try run("/usr/bin/pkcs11-tool", ["--module", Self.module, "--login", "--pin", "1234", "--delete-object",
                                                 "--type", "secrkey", "--label", "keychain:svc@strongbox"], environment: t.env).status == 0)
        let keyGone = try t.cli(["--json", "get", "svc", "k2"])
        #expect(t.errorCode(keyGone) == "DATA_CORRUPTED" && t.errorMessage(keyGone).contains("'svc'")
                && !t.errorMessage(keyGone).contains("@"), "\(t.errorMessage(keyGone))")
        #expect(try t.cli(["clear", "svc"]).status == 0)
        #expect(!(try t.objects()).contains("keychain:svc"))
        #expect(try t.cli(["ls", "svc", "--key-storage", "strongbox"]).stdout.isEmpty)
        // No message names an internal service.
        let missing = try t.cli(["--json", "get", "svc", "gone", "--key-storage", "strongbox"])
        #expect(!t.errorMessage(missing).contains("@"))
        let db = try Data(contentsOf: URL(fileURLWithPath: t.store + "/keychain.db"))
            + ((try? Data(contentsOf: URL(fileURLWithPath: t.store + "/keychain.db-wal"))) ?? Data())
        #expect(db.range(of: Data("on the token".utf8)) == nil && db.range(of: Data("token again".utf8)) == nil)
    }

    @Test func theWrappingKeyOnTheTokenIsSensitiveAndNeverExtractable() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: [1, 2, 3]).status == 0)
        let listing = try run("/usr/bin/pkcs11-tool", ["--module", Self.module, "--login", "--pin", "1234", "--list-objects"],
                              environment: t.env)
        let text = String(decoding: listing.stdout, as: UTF8.self)
        #expect(text.contains("label:      keychain:svc@strongbox"))
        #expect(text.contains("Access:     sensitive, always sensitive, never extractable"))
        #expect(text.contains("Usage:      encrypt, decrypt"))
        #expect(!text.contains("sign") && !text.contains("wrap"))
        // clear removes the service's token objects too.
        #expect(try t.cli(["clear", "svc", "--key-storage", "strongbox"]).status == 0)
        let after = String(decoding: try run("/usr/bin/pkcs11-tool", ["--module", Self.module, "--login", "--pin", "1234", "--list-objects"],
                                             environment: t.env).stdout, as: UTF8.self)
        #expect(!after.contains("keychain:svc"))
    }

    @Test func aWrongPINAnAbsentTokenAndAWrongModuleAreClearCodesAndNothingIsLost() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("kept".utf8)).status == 0)
        // Each write makes its service's key on the token (a service that has one needs only its public half).
        let wrongPIN = try t.cli(["--json", "set", "svc2", "k2", "--key-storage", "strongbox"], input: [1],
                                 uri: t.uri(pinFile: t.dir + "/wrong-pin"))
        #expect(wrongPIN.status == 3 && t.errorCode(wrongPIN) == "AUTHENTICATION_FAILED")
        let noToken = try t.cli(["--json", "set", "svc2", "k2", "--key-storage", "strongbox"], input: [1], uri: t.uri(label: "absent"))
        #expect(noToken.status == 3 && t.errorCode(noToken) == "HARDWARE_UNAVAILABLE")
        let noModule = try t.cli(["--json", "set", "svc2", "k2", "--key-storage", "strongbox"], input: [1], uri: t.uri(module: "/nonexistent/lib.so"))
        #expect(noModule.status == 3 && t.errorCode(noModule) == "HARDWARE_UNAVAILABLE")
        // Nothing was lost: the token item reads with the right PIN.
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("kept".utf8))
        let store = try Store(directory: t.store)
        #expect(try store.item(service: "svc", key: "k") != nil)
        #expect(try store.item(service: "svc2", key: "k2") == nil)
    }

    /// `passcode` on a token: the token's user PIN, asked at read and checked by the token (C_Login);
    /// SoftHSM2 has no retry limit, so this library keeps one (5).
    @Test func thePasscodeOnATokenIsItsUserPINWithARetryLimit() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "p", "--key-storage", "strongbox", "--access-control", "passcode"],
                          input: Array("pin-guarded".utf8)).status == 0)
        let noAnswer = try t.cli(["--json", "get", "svc", "p", "--key-storage", "strongbox"])
        #expect(noAnswer.status == 3 && t.errorCode(noAnswer) == "INTERACTION_NOT_ALLOWED")
        #expect(try t.cli(["get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout
                == Array("pin-guarded".utf8))
        for _ in 0..<4 {
            let wrong = try t.cli(["--json", "get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("0000\n".utf8))
            #expect(t.errorCode(wrong) == "AUTHENTICATION_FAILED")
        }
        _ = try t.cli(["get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("0000\n".utf8))
        let locked = try t.cli(["--json", "get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("1234\n".utf8))
        #expect(t.errorCode(locked) == "LOCKOUT_PERMANENT", "five wrong PINs lock even the right one out")
        #expect(try t.cli(["token", "reset-tries"]).status == 0)
        #expect(try t.cli(["get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout
                == Array("pin-guarded".utf8))
        // A token has no fingerprint reader: refused, never stored with less.
        let biometric = try t.cli(["--json", "set", "svc", "b", "--key-storage", "strongbox", "--access-control", "biometryAny"], input: [1])
        #expect(t.errorCode(biometric) == "UNSUPPORTED")
        let canUse = String(decoding: try t.cli(["--json", "can-use", "biometryAny", "--key-storage", "strongbox"]).stdout, as: UTF8.self)
        #expect(canUse.contains("\"available\":false"))
    }

    @Test func aTamperedSealedDataKeyIsDataCorrupted() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "a", "--key-storage", "strongbox"], input: Array("A".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "b", "--key-storage", "strongbox"], input: Array("B".utf8)).status == 0)
        let store = try Store(directory: t.store)
        var record = try #require(try store.item(service: "svc", key: "a"))
        record.writerPublic[20] ^= 1
        try store.write { try $0.putItem(record) }
        let tampered = try t.cli(["--json", "get", "svc", "a", "--key-storage", "strongbox"])
        #expect(tampered.status == 3 && t.errorCode(tampered) == "DATA_CORRUPTED")
        #expect(try t.cli(["get", "svc", "b", "--key-storage", "strongbox"]).stdout == Array("B".utf8))
    }

    // MARK: Any conforming token

    /// A full SoftHSM2 token, and two restricted to what RSA-only and EC-only secure elements offer.
    enum Kind: String, CaseIterable, Sendable {
        case full, rsaOnly, ecOnly
        var mechanisms: String? {
            switch self {
            case .full: nil
            case .rsaOnly: "CKM_RSA_PKCS_KEY_PAIR_GEN,CKM_RSA_PKCS_OAEP"
            case .ecOnly: "CKM_EC_KEY_PAIR_GEN,CKM_ECDH1_DERIVE"
            }
        }
        /// The format byte of its sealed data keys: AES-GCM 1, RSA-OAEP 2 (SHA-256) or 3 (SHA-1), ECDH 4.
        var formats: Set<UInt8> {
            switch self {
            case .full: [1]
            case .rsaOnly: [2, 3]
            case .ecOnly: [4]
            }
        }
    }

    @Test(arguments: Kind.allCases)
    func anRSAOnlyAndAnECOnlyTokenBehaveLikeTheFullOne(_ kind: Kind) throws {
        let t = try Token(mechanisms: kind.mechanisms)
        let listed = try t.mechanisms()
        #expect(listed.contains("AES-GCM") == (kind == .full) && listed.contains("RSA-PKCS-OAEP") == (kind != .ecOnly)
                && listed.contains("ECDH1-DERIVE") == (kind != .rsaOnly), "SoftHSM2 applies the restriction: \(listed)")
        let canUse = String(decoding: try t.cli(["--json", "can-use", "none", "--key-storage", "strongbox"]).stdout, as: UTF8.self)
        #expect(canUse.contains("\"available\":true"))
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("first".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("first".utf8))
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("second".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "k", "--key-storage", "strongbox"]).stdout == Array("second".utf8))
        let wrapping = try #require(try Store(directory: t.store).wrappingKey(service: "svc", protection: "afterFirstUnlock/none@strongbox"))
        #expect(kind.formats.contains(wrapping.tokenSealed[0]), "format byte \(wrapping.tokenSealed[0])")
        // The passcode (the token's PIN, asked at read) works the same on every kind.
        #expect(try t.cli(["set", "svc", "p", "--key-storage", "strongbox", "--access-control", "passcode"],
                          input: Array("pin-guarded".utf8)).status == 0)
        #expect(try t.cli(["get", "svc", "p", "--key-storage", "strongbox", "--passcode-stdin"], input: Array("1234\n".utf8)).stdout
                == Array("pin-guarded".utf8))
        let objects = try t.objects()
        #expect(objects.contains("label:      keychain:svc@strongbox"))
        #expect(objects.contains("Access:     sensitive, always sensitive, never extractable"), "\(objects)")
        // clear destroys every object of the service: the AES key, or both halves of the pair.
        #expect(try t.cli(["clear", "svc", "--key-storage", "strongbox"]).status == 0)
        #expect(!(try t.objects()).contains("keychain:svc"))
        #expect(try t.cli(["ls", "svc", "--key-storage", "strongbox"]).stdout.isEmpty)
    }

    @Test func aTokenWithNoneOfTheThreeIsUnsupportedAndKeepsNothing() throws {
        let t = try Token(mechanisms: "-,CKM_AES_GCM,CKM_RSA_PKCS_OAEP,CKM_ECDH1_DERIVE")
        let listed = try t.mechanisms()
        #expect(!listed.contains("AES-GCM") && !listed.contains("RSA-PKCS-OAEP") && !listed.contains("ECDH1-DERIVE") && listed.contains("AES-CBC"))
        let write = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1])
        #expect(write.status == 3 && t.errorCode(write) == "UNSUPPORTED")
        let message = t.errorMessage(write)
        #expect(["CKM_AES_GCM", "CKM_RSA_PKCS_OAEP", "CKM_ECDH1_DERIVE"].allSatisfy(message.contains), "\(message)")
        #expect(!(try t.objects()).contains("Object;"))
        #expect(try Store(directory: t.store).item(service: "svc", key: "k") == nil)
        let canUse = String(decoding: try t.cli(["--json", "can-use", "none", "--key-storage", "strongbox"]).stdout, as: UTF8.self)
        #expect(canUse.contains("\"available\":false") && canUse.contains("\"reason\":\"unsupported\""), "\(canUse)")
    }

    @Test func canUseOpensTheTokenAndAnAbsentModuleOrTokenIsNotAvailable() throws {
        let t = try Token()
        for uri in [t.uri(module: "/nonexistent/lib.so"), t.uri(label: "absent")] {
            let canUse = String(decoding: try t.cli(["--json", "can-use", "none", "--key-storage", "strongbox"], uri: uri).stdout,
                                as: UTF8.self)
            #expect(canUse.contains("\"available\":false") && canUse.contains("notAvailable"), "\(uri): \(canUse)")
        }
    }

    @Test func anAbsentTokenOrModuleIsNamedAndAnUnreadablePINSourceToo() throws {
        let t = try Token()
        let noToken = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1], uri: t.uri(label: "absent"))
        #expect(t.errorCode(noToken) == "HARDWARE_UNAVAILABLE")
        #expect(t.errorMessage(noToken).contains("token 'absent'") && t.errorMessage(noToken).contains(Self.module)
                && t.errorMessage(noToken).contains("'kc'"), "\(t.errorMessage(noToken))")
        let noModule = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1], uri: t.uri(module: "/nonexistent/lib.so"))
        #expect(t.errorCode(noModule) == "HARDWARE_UNAVAILABLE")
        #expect(t.errorMessage(noModule).contains("/nonexistent/lib.so") && t.errorMessage(noModule).contains("token 'kc'"))
        let noPIN = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1], uri: t.uri(pinFile: t.dir + "/no-such-pin"))
        #expect(t.errorCode(noPIN) == "INVALID_ARGUMENT")
        #expect(t.errorMessage(noPIN).contains(t.dir + "/no-such-pin") && !t.errorMessage(noPIN).contains("add pin-source"),
                "\(t.errorMessage(noPIN))")
    }

    // MARK: p11-kit

    /// `module-name=` loads the registered modules but initializes only the one named. A second
    /// registered module, opensc's pkcs11-spy (which logs every call it gets), sees no C_Initialize.
    @Test func moduleNameInitializesOnlyTheNamedModule() throws {
        let t = try Token()
        let name = "keychain-test-spy-" + UUID().uuidString.prefix(8).lowercased()
        let file = "/etc/pkcs11/modules/\(name).module"
        try FileManager.default.createDirectory(atPath: "/etc/pkcs11/modules", withIntermediateDirectories: true)
        // enable-in: only keychainctl processes load it, so no other program on the machine sees it.
        try "module: /usr/lib/x86_64-linux-gnu/pkcs11-spy.so\nenable-in: keychainctl\n".write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let log = t.dir + "/spy.log"
        let env = t.env.merging(["PKCS11SPY": Self.module, "PKCS11SPY_OUTPUT": log]) { $1 }
        func set(_ key: String, module: String) throws -> Int32 {
            try run(buildDirectory.appendingPathComponent("keychainctl").path,
                    ["--store", t.store, "--tcti", t.tpm.tcti, "--pkcs11-uri",
                     "pkcs11:token=kc?module-name=\(module)&pin-source=file:\(t.dir)/pin", "set", key, "k", "--key-storage", "strongbox"],
                    input: [1], environment: env).status
        }
        #expect(try set("svc", module: "softhsm2") == 0)
        #expect(!((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("C_Initialize"))
        // The control: named, the spy is initialized (and passes the calls on to SoftHSM2).
        #expect(try set("svc2", module: name) == 0)  // a new service: its key is made on the token
        #expect(((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").contains("C_Initialize"))
    }

    @Test func p11KitsProxyAndAURIWithoutAModuleAreRefusedSayingWhatToWrite() throws {
        let t = try Token()
        let proxy = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1],
                              uri: t.uri(module: "/usr/lib/x86_64-linux-gnu/libp11-kit.so.0"))
        #expect(t.errorCode(proxy) == "INVALID_ARGUMENT" && t.errorMessage(proxy).contains("proxy"), "\(t.errorMessage(proxy))")
        let noModule = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1], uri: "pkcs11:token=kc")
        #expect(t.errorCode(noModule) == "INVALID_ARGUMENT" && t.errorMessage(noModule).contains("module-name=NAME"))
        // A path attribute in the query would have matched every token: refused.
        let misplaced = try t.cli(["--json", "set", "svc", "k", "--key-storage", "strongbox"], input: [1],
                                  uri: "pkcs11:?token=kc&module-path=\(Self.module)&pin-source=file:\(t.dir)/pin")
        #expect(t.errorCode(misplaced) == "INVALID_ARGUMENT" && t.errorMessage(misplaced).contains("path attribute"))
        #expect(try Store(directory: t.store).item(service: "svc", key: "k") == nil)
    }
}

/// The token storage keeps a data key it read, like the TPM path's agreed secrets, and `dropCaches()`
/// and `lock()` forget it; another process (pkcs11-tool) destroys the key on the token between the
/// reads. It runs in a child test process: an engine keeps its token module initialized for good,
/// and SoftHSM2 takes one configuration per process.
@Suite("The token storage keeps read data keys until dropCaches and lock", .offThePool)
struct TokenDataKeyCacheTests {
    static let childVariable = "KEYCHAIN_TEST_TOKEN_CACHE_CHILD"

    @Test func aReadDataKeyIsForgottenByDropCachesAndByLock() async throws {
        guard try isTheChildRun(of: "aReadDataKeyIsForgottenByDropCachesAndByLock", variable: Self.childVariable) else { return }
        let t = try TokenBackendTests.Token()
        let (configuration, device) = try await t.inThisProcess()
        for forget in ["dropCaches", "lock"] {
            let storage = try createKeychain(.init(service: "svc-\(forget)", android: .init(keyStorage: .strongbox)),
                                             configuration: configuration)
            try await storage.setItem("k", "kept")
            #expect(try await storage.getItem("k") == "kept")
            let deleted = try run("/usr/bin/pkcs11-tool", ["--module", TokenBackendTests.module, "--login", "--pin", "1234",
                                                           "--delete-object", "--type", "secrkey", "--label", "keychain:svc-\(forget)@strongbox"],
                                  environment: t.env)
            #expect(deleted.status == 0, "\(deleted.stderr)")
            #expect(try await storage.getItem("k") == "kept", "the data key read before is kept")
            if forget == "lock" { try await device.lock() } else { await device.dropCaches() }
            await #expect(throws: KeychainError.self) { try await storage.getItem("k") }
        }
    }

    /// A `whenUnlocked` token key this process opened (its TPM part and the token's, combined and kept)
    /// is not served from what it keeps once another process locks the device: the store's lock
    /// generation moved, so the read goes to the TPM, which refuses the TPM part while locked.
    @Test func aKeptWhenUnlockedTokenKeyIsRefusedAfterAnotherProcessLocks() async throws {
        guard try isTheChildRun(of: "aKeptWhenUnlockedTokenKeyIsRefusedAfterAnotherProcessLocks", variable: Self.childVariable) else { return }
        let t = try TokenBackendTests.Token()
        let (configuration, device) = try await t.inThisProcess()
        try await device.setPasscode(SecureBytes(copying: Array("2468".utf8)))
        let storage = try createKeychain(.init(service: "svc", accessible: .whenUnlocked, android: .init(keyStorage: .strongbox)),
                                         configuration: configuration)
        try await storage.setItem("k", "locked away")
        #expect(try await storage.getItem("k") == "locked away")
        #expect(try await storage.getItem("k") == "locked away", "kept: read again without the TPM")
        #expect(try t.cli(["lock"]).status == 0)
        var code: KeychainError.Code?
        do { _ = try await storage.getItem("k") } catch { code = error.code }
        #expect(code == .interactionNotAllowed, "another process locked the device: the kept key must not answer")
    }
}
