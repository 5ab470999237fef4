import Foundation
import Keychain

/// The wrapping scheme a bench token is restricted to, by the mechanisms SoftHSM2 offers it.
enum TokenScheme: String, CaseIterable, Codable {
    case aesGCM = "AES-GCM"
    case rsaOAEP = "RSA-OAEP"
    case ecdh = "ECDH-P256"

    /// `slots.mechanisms`: nothing withheld for AES-GCM (the library's first choice), else only the scheme's two.
    var mechanisms: String? {
        switch self {
        case .aesGCM: nil
        case .rsaOAEP: "CKM_RSA_PKCS_KEY_PAIR_GEN,CKM_RSA_PKCS_OAEP"
        case .ecdh: "CKM_EC_KEY_PAIR_GEN,CKM_ECDH1_DERIVE"
        }
    }
}

/// A private SoftHSM2 token in the bench's directory: its own configuration, token directory and PIN file.
struct SoftHSMToken {
    static let modulePath = "/usr/lib/softhsm/libsofthsm2.so"
    static let label = "bench"
    static let userPIN = "1234"
    static let soPIN = "12345678"

    let directory: String
    var configurationFile: String { directory + "/softhsm2.conf" }
    var pinFile: String { directory + "/pin" }
    /// What every process on this token needs (pkcs11-tool, keychainctl).
    var environment: [String: String] { ["SOFTHSM2_CONF": configurationFile] }
    /// The storage's URI: SoftHSM2 through p11-kit, the PIN from a file.
    var uri: String { "pkcs11:token=\(Self.label)?module-path=\(Self.modulePath)&pin-source=file:\(pinFile)" }

    /// Makes the token and points this process's SOFTHSM2_CONF at it; nil when SoftHSM2 is not installed.
    static func make(in directory: String, scheme: TokenScheme) throws -> SoftHSMToken? {
        guard FileManager.default.isReadableFile(atPath: modulePath), Subprocess.isInstalled("softhsm2-util") else {
            return nil
        }
        let token = SoftHSMToken(directory: directory)
        try FileManager.default.createDirectory(atPath: directory + "/tokens", withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let restriction = scheme.mechanisms.map { "slots.mechanisms = \($0)\n" } ?? ""
        let files = [(token.configurationFile, "directories.tokendir = \(directory)/tokens\nlog.level = ERROR\n" + restriction),
                     (token.pinFile, userPIN + "\n")]
        for (path, text) in files {
            guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8),
                                                 attributes: [.posixPermissions: 0o600]) else {
                throw BenchFailure("cannot write \(path)")
            }
        }
        setenv("SOFTHSM2_CONF", token.configurationFile, 1)
        try Subprocess(directory: directory, extraEnvironment: token.environment)
            .check(["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", soPIN, "--pin", userPIN])
        return token
    }
}

/// The token storage (`keyStorage: 'strongbox'`) and the pkcs11-tool reference.
struct TokenResult: Codable {
    static let service = "bench.token"
    var scheme = TokenScheme.aesGCM
    /// The first call of the process on the token (a setItem): p11-kit loads the module,
    /// C_Initialize, a session is opened and logged in, the service's AES key is generated. One sample.
    var firstUse = Samples()
    /// First writes of further services: each generates its AES key on the token.
    var firstWrite = Samples()
    /// Reads after `dropCaches()`: the token opens its part of the key and, at the default level
    /// (`afterFirstUnlock`, split with the TPM), the TPM unseals its part. The logged-in session
    /// stays open for the process: "cold" is the first read of a fresh engine state, not of a new
    /// process (keychainctl below is that).
    var coldGet = Samples()
    var warmGet = Samples()
    var set = Samples()
    /// `pkcs11-tool --read-object` of the same 32 bytes as a data object, a process per read.
    var pkcs11Tool: Samples?
    /// `keychainctl get --key-storage strongbox`, a process per read.
    var keychainctl: Samples?
    /// Wrapping keys on the token during the reads (one per service): SoftHSM2's file store checks
    /// every object's file when it searches, so a read costs more with more of them.
    var keysOnToken = 0
}

extension Bench {
    /// The token storage, pkcs11-tool and keychainctl on a token offering only `scheme`'s mechanisms:
    /// this program again with `--token-scheme`, its result as JSON on stdout.
    func measureTokenInChild(_ scheme: TokenScheme) throws -> TokenResult {
        let directory = tpm.directory + "/child-\(scheme.rawValue)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
        let run = try Subprocess(directory: directory).check([me, "--token-scheme", scheme.rawValue] + options.sampleArguments)
        return try JSONDecoder().decode(TokenResult.self, from: Data(run.output))
    }

    /// The child's work: the token rows of one scheme, as JSON.
    func measureTokenScheme(_ scheme: TokenScheme) async throws -> String {
        guard let softHSM else { throw BenchFailure("SoftHSM2 is not installed") }
        try await device.initialize()
        var result = try await measureToken(softHSM)
        result.scheme = scheme
        result.pkcs11Tool = try pkcs11ToolRead(softHSM)
        result.keychainctl = try keychainctlGet(service: TokenResult.service, token: softHSM)
        return String(decoding: try JSONEncoder().encode(result), as: UTF8.self)
    }
}

extension Bench {
    func measureToken(_ token: SoftHSMToken) async throws -> TokenResult {
        var result = TokenResult()
        func storage(_ service: String) throws -> Keychain {
            try createKeychain(.init(service: service, android: .init(keyStorage: .strongbox)), configuration: configuration)
        }
        let keychain = try storage(TokenResult.service)
        let secret = self.secret
        func read() async throws {
            guard try await keychain.getItem("k0") == secret else { throw BenchFailure("token getItem returned another value") }
        }
        result.firstUse = try await sample(1) { try await keychain.setItem("k0", secret) }
        let others = try (1...options.firstWrites).map { try storage(TokenResult.service + ".\($0)") }
        var next = 0
        result.firstWrite = try await sample(options.firstWrites) {
            try await others[next].setItem("k0", secret)
            next += 1
        }
        result.keysOnToken = 1 + others.count
        result.coldGet = try await sample(options.cold, before: { await device.dropCaches() }, read)
        try await read()
        result.warmGet = try await sample(options.warm, read)
        result.set = try await sample(options.writes) { try await keychain.setItem("k0", secret) }
        try await read()
        return result
    }

    /// The same 32 bytes as a private data object, stored once with pkcs11-tool and read back with it:
    /// one process per read (module load, C_Initialize, session, login, find, read), output checked.
    func pkcs11ToolRead(_ token: SoftHSMToken) throws -> Samples? {
        guard Subprocess.isInstalled("pkcs11-tool") else { return nil }
        let directory = token.directory + "/pkcs11-tool"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let secretFile = directory + "/secret.bin"
        guard FileManager.default.createFile(atPath: secretFile, contents: Data(secret.utf8),
                                             attributes: [.posixPermissions: 0o600]) else {
            throw BenchFailure("cannot write \(secretFile)")
        }
        let shell = Subprocess(directory: directory, extraEnvironment: token.environment)
        let common = ["pkcs11-tool", "--module", SoftHSMToken.modulePath, "--token-label", SoftHSMToken.label,
                      "--login", "--pin", SoftHSMToken.userPIN]
        try shell.check(common + ["--write-object", secretFile, "--type", "data", "--label", "bench-secret", "--private"])
        try? FileManager.default.removeItem(atPath: secretFile)
        var samples = Samples(capacity: options.runs)
        for run in 0...options.runs {  // run 0 warms the page cache and is not kept
            let read = try shell.check(common + ["--read-object", "--type", "data", "--label", "bench-secret"])
            guard read.output == Array(secret.utf8) else { throw BenchFailure("pkcs11-tool returned another value") }
            if run > 0 { samples.record(read.nanoseconds) }
        }
        return samples
    }
}
