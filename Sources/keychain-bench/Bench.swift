import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory
import TPM2

/// How many samples each measurement takes.
struct BenchOptions {
    /// Warm reads, hasItem and getAllKeys calls per level; warm reads of the token storage and
    /// reads inside the authValidity window.
    var warm = 20_000
    /// Cold reads per level (each after `dropCaches()`); reads per access-control row; first reads
    /// and ticket reads of the authValidity row; cold reads of the token storage.
    var cold = 50
    /// setItem calls on an existing service per level and on the token (each one commits with fsync).
    var writes = 200
    /// First writes of a new service per level and on the token (each makes a wrapping key).
    var firstWrites = 5
    /// Process runs of each reference (tpm2-tools, keychainctl, pkcs11-tool).
    var runs = 20
    /// Set in the child process that measures one token scheme (`--token-scheme`, not for users):
    /// SoftHSM2 reads its mechanism restriction once per process.
    var tokenScheme: TokenScheme?
    /// `--provisioning`: only the seal-for, import and backup figures (ProvisioningBench.swift).
    var provisioning = false
    /// `--daemon`: only keychaind's figures (DaemonBench.swift): --runs processes, 16 clients × --cold×20 reads.
    var daemon = false
    /// `--attestation`: only attestation's TPM commands and the server's rates (AttestationBench.swift), --writes×5 rounds.
    var attestation = false

    static let usage = """
        usage: keychain-bench [--quick] [--warm N] [--cold N] [--writes N] [--first-writes N] [--runs N]
          --quick   a tenth of the default samples, for a check that everything runs
          --warm N (20000) warm reads, hasItem, getAllKeys; token warm reads; reads in the authValidity window
          --cold N (50)    cold reads; reads per access-control row; authValidity first and ticket reads
          --writes N (200) overwrites per level and on the token; --first-writes N (5) new services
          --runs N (20)    runs of each process reference
          --provisioning   only seal-for throughput, import TPM commands, backup/restore of --writes×5 items
          --daemon         only keychaind: keychainctl get through it vs tpm2-tools, 16 clients × --cold×20 reads
          --attestation    only attestation: TPM commands of init, respond, key; the server's calls/s, --writes×5 rounds
        keychain-bench --warm-reads N: N warm in-process getItem calls (for callgrind)
        keychain-bench --cold-reads N: N in-process getItem calls, each after dropCaches (for callgrind)
        keychain-bench --vault-state N [in-process|keychaind] [ready|available|signed-in]: N reads of a
          BiometricsVault's state and biometricsAvailable (for callgrind: one mode and one kind)
        keychain-bench --prompter-reach N: N reachability checks of gcr's desktop prompter (DISPLAY and
          DBUS_SESSION_BUS_ADDRESS of a bus where it is owned or activatable)
        """

    /// The sample counts as arguments, for a child process.
    var sampleArguments: [String] {
        ["--warm", "\(warm)", "--cold", "\(cold)", "--writes", "\(writes)", "--first-writes", "\(firstWrites)", "--runs", "\(runs)"]
    }

    /// A bad argument; no message for `--help`.
    struct UsageError: Error { let message: String? }

    init(_ arguments: some Collection<String>) throws(UsageError) {
        var arguments = Array(arguments)[...]
        while let flag = arguments.popFirst() {
            if flag == "--help" || flag == "-h" { throw UsageError(message: nil) }
            if flag == "--quick" {
                (warm, cold, writes, firstWrites, runs) = (2_000, 10, 20, 2, 5)
                continue
            }
            if flag == "--provisioning" {
                provisioning = true
                continue
            }
            if flag == "--daemon" {
                daemon = true
                continue
            }
            if flag == "--attestation" {
                attestation = true
                continue
            }
            if flag == "--token-scheme" {
                guard let scheme = arguments.popFirst().flatMap(TokenScheme.init(rawValue:)) else {
                    throw UsageError(message: "--token-scheme needs one of \(TokenScheme.allCases.map(\.rawValue))")
                }
                tokenScheme = scheme
                continue
            }
            let field: WritableKeyPath<BenchOptions, Int>
            switch flag {
            case "--warm": field = \.warm
            case "--cold": field = \.cold
            case "--writes": field = \.writes
            case "--first-writes": field = \.firstWrites
            case "--runs": field = \.runs
            default: throw UsageError(message: "unknown option \(flag)")
            }
            guard let value = arguments.popFirst().flatMap(Int.init), value > 0 else {
                throw UsageError(message: "\(flag) needs a positive whole number")
            }
            self[keyPath: field] = value
        }
    }
}

/// What one accessibility level measured.
struct LevelResult {
    let accessible: Accessible
    var firstWrite = Samples()
    var coldGet = Samples()
    var warmGet = Samples()
    var set = Samples()
    var has = Samples()
    var keys = Samples()
}

/// The TPM connection alone, without the keychain.
struct Transport {
    var connect = Samples()
    var command = Samples()
}

struct BenchFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// The benchmark: a private swtpm, store, fingerprint reader and SoftHSM2 token; every accessibility
/// level, every access control, the token storage, then the process references.
final class Bench {
    let options: BenchOptions
    let tpm: SoftwareTPM
    /// The device: a passcode and an enrolled finger (the seed's vault needs both), the scripted prompt.
    let configuration: KeychainConfiguration
    let device: KeychainDevice
    /// Answers every prompt: the bench pushes one answer before each prompted read, untimed.
    let authenticator = ScriptedAuthenticator()
    /// The secret every item holds: 32 bytes of ASCII, so it reads back through `getItem` as text
    /// and is byte for byte what tpm2-tools seals and pkcs11-tool stores in the references.
    let secret: String
    /// The private SoftHSM2 token; nil when SoftHSM2 is not installed.
    let softHSM: SoftHSMToken?

    static let passcode = "246813"
    static let finger = "thumb"

    init(options: BenchOptions) throws {
        self.options = options
        tpm = try SoftwareTPM()
        var configuration = tpm.configuration()
        configuration.readerDirectory = configuration.storeDirectory + ".reader"  // where keychainctl looks
        configuration.authenticator = authenticator
        // SoftHSM2 reads SOFTHSM2_CONF once, at the process's first C_Initialize: set before any token use.
        softHSM = try SoftHSMToken.make(in: tpm.directory + "/softhsm", scheme: options.tokenScheme ?? .aesGCM)
        configuration.pkcs11URI = softHSM?.uri
        self.configuration = configuration
        device = KeychainDevice(configuration: configuration)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
        secret = String(Sodium.randomBytes(32).map { alphabet[Int($0) % alphabet.count] })
    }

    static func passcodeBytes() -> SecureBytes { SecureBytes(copying: Array(passcode.utf8)) }

    /// Stops swtpm and removes its directory (stores, tpm2-tools files) and its lock files now, not
    /// whenever the last reference to the `SoftwareTPM` goes: `exit` runs no deinit.
    func cleanUp() { tpm.remove() }

    /// Cleans up on Ctrl-C or SIGTERM too.
    func cleanUpOnSignals() -> [DispatchSourceSignal] {
        [SIGINT, SIGTERM].map { number in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { [tpm] in
                tpm.remove()
                exit(128 + number)
            }
            source.resume()
            return source
        }
    }

    func run() async throws -> Report {
        let otherWork = OtherWork(swtpmDirectory: tpm.directory)
        progress("swtpm on \(tpm.tcti), store in \(configuration.storeDirectory)")
        // As a device is provisioned: the store bound to its rollback counter, so writes pay for it.
        try await KeychainAdministration(configuration: configuration).initialize(takingOwnership: Ownership(allowEmpty: true))
        try await device.setPasscode(Self.passcodeBytes())
        try await device.enrollFinger(Self.finger, passcode: Self.passcodeBytes())
        _ = await device.takeTPMCommandCount()

        var levels: [LevelResult] = []
        for accessible in Accessible.allCases {
            progress("measuring \(accessible.rawValue)")
            levels.append(try await measure(accessible))
        }
        var prompted: [PromptedRead] = []
        for row in PromptedRead.rows {
            progress("measuring \(row.accessControl.rawValue) (\(row.accessible.rawValue)), answered with \(row.answer)")
            prompted.append(try await measure(row, levels: levels))
        }
        progress("measuring authValidity (biometryAny, 300 s)")
        let window = try await measureAuthValidity()
        var token: TokenResult?
        if let softHSM {
            progress("measuring the token storage (SoftHSM2, AES-GCM)")
            token = try await measureToken(softHSM)
        }
        var otherSchemes: [TokenResult] = []
        if softHSM != nil {
            for scheme in [TokenScheme.rsaOAEP, .ecdh] {
                progress("measuring the token storage (SoftHSM2 offering \(scheme.rawValue) only, in a process of its own)")
                otherSchemes.append(try measureTokenInChild(scheme))
            }
        }
        progress("measuring the TPM transport")
        let transport = try measureTransport()
        progress("measuring tpm2-tools load + unseal")
        let tools = try tpm2ToolsPipeline()
        progress("measuring keychainctl get")
        let cli = try keychainctlGet(service: Self.service(.afterFirstUnlock))
        if let softHSM, token != nil {
            progress("measuring pkcs11-tool --read-object and keychainctl get --key-storage strongbox")
            token?.pkcs11Tool = try pkcs11ToolRead(softHSM)
            token?.keychainctl = try keychainctlGet(service: TokenResult.service, token: softHSM)
        }
        var environment = EnvironmentInfo.current(scratch: tpm.directory)
        environment.otherWork = otherWork.percentage()
        return Report(options: options, environment: environment, levels: levels, prompted: prompted,
                      authValidity: window, token: token, otherSchemes: otherSchemes, transport: transport,
                      tpm2Tools: tools, keychainctl: cli)
    }

    static func service(_ accessible: Accessible) -> String { "bench.\(accessible.rawValue)" }

    func progress(_ message: String) {
        FileHandle.standardError.write(Data("keychain-bench: \(message)\n".utf8))
    }

    // MARK: The library, in process

    /// Times `op` `count` times (`before` runs untimed before each) and counts the TPM commands of all.
    func sample(_ count: Int, before: () async -> Void = {},
                _ op: () async throws -> Void) async throws -> Samples {
        _ = await device.takeTPMCommandCount()
        var samples = Samples(capacity: count)
        for _ in 0..<count {
            await before()
            let start = monotonicNanoseconds()
            try await op()
            samples.record(monotonicNanoseconds() - start)
        }
        samples.tpmCommands = await device.takeTPMCommandCount()
        return samples
    }

    private func measure(_ accessible: Accessible) async throws -> LevelResult {
        var result = LevelResult(accessible: accessible)
        let keychains = try (0..<options.firstWrites).map { i in
            try createKeychain(.init(service: Self.service(accessible) + (i == 0 ? "" : ".\(i)"), accessible: accessible),
                               configuration: configuration)
        }
        let keychain = keychains[0]
        let secret = self.secret
        func read() async throws {
            guard try await keychain.getItem("k0") == secret else { throw BenchFailure("getItem returned another value") }
        }

        // Each write is the first of its service: it generates and seals the service's wrapping key.
        var next = 0
        result.firstWrite = try await sample(options.firstWrites) {
            try await keychains[next].setItem("k0", secret)
            next += 1
        }
        result.coldGet = try await sample(options.cold, before: { await device.dropCaches() }, read)
        try await read()
        result.warmGet = try await sample(options.warm, read)
        result.has = try await sample(options.warm) {
            guard try await keychain.hasItem("k0") else { throw BenchFailure("hasItem returned false") }
        }
        result.keys = try await sample(options.warm) {
            guard try await keychain.getAllKeys() == ["k0"] else { throw BenchFailure("getAllKeys returned other keys") }
        }
        try await keychain.setItem("k0", secret)  // untimed: this process's writer key for the service is made
        result.set = try await sample(options.writes) { try await keychain.setItem("k0", secret) }
        try await read()
        return result
    }

    // MARK: References

    /// What the TPM connection costs by itself: opening and closing one (TCTI loader, `Esys_Initialize`),
    /// as the engine does around every TPM operation, and the round trip of a command that needs no
    /// session and no client-side cryptography (GetCapability).
    private func measureTransport() throws -> Transport {
        var transport = Transport()
        transport.connect = Samples(capacity: options.cold)
        for _ in 0..<options.cold {
            let start = monotonicNanoseconds()
            withExtendedLifetime(try TPMContext(device: tpm.device)) {}
            transport.connect.record(monotonicNanoseconds() - start)
        }
        let context = try TPMContext(device: tpm.device)
        let count = options.cold * 10
        transport.command = Samples(capacity: count)
        for _ in 0..<count {
            let start = monotonicNanoseconds()
            _ = try context.property(TPMContext.propertyManufacturer)
            transport.command.record(monotonicNanoseconds() - start)
        }
        transport.command.tpmCommands = context.commandCount
        return transport
    }

    // MARK: References: other processes on the same swtpm

    /// `tpm2_load … && tpm2_unseal …` of the same 32-byte secret under the keychain's SRK (`TPM2ToolsRead`).
    private func tpm2ToolsPipeline() throws -> Samples? {
        guard let tools = try TPM2ToolsRead(tpm: tpm, secret: secret, directory: tpm.directory + "/tpm2-tools") else { return nil }
        var samples = Samples(capacity: options.runs)
        for run in 0...options.runs {  // run 0 warms the page cache and is not kept
            let took = try tools.read()
            if run > 0 { samples.record(took) }
        }
        return samples
    }

    /// The whole `keychainctl get` process, built next to this binary, on the warm store; with a
    /// token, `get --key-storage strongbox` of the token storage's item.
    func keychainctlGet(service: String, token: SoftHSMToken? = nil) throws -> Samples? {
        let binary = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe"))
            .map { URL(fileURLWithPath: $0).deletingLastPathComponent().appendingPathComponent("keychainctl").path }
        guard let binary, FileManager.default.isExecutableFile(atPath: binary) else { return nil }
        let directory = tpm.directory + "/keychainctl"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let shell = Subprocess(directory: directory, extraEnvironment: token?.environment ?? [:])
        var argv = [binary, "--store", configuration.storeDirectory, "--tcti", tpm.tcti]
        if let token { argv += ["--pkcs11-uri", token.uri] }
        argv += ["get", service, "k0"] + (token == nil ? [] : ["--key-storage", "strongbox"])
        var samples = Samples(capacity: options.runs)
        for run in 0...options.runs {
            let get = try shell.check(argv)
            guard get.output == Array(secret.utf8) else { throw BenchFailure("keychainctl get returned another value") }
            if run > 0 { samples.record(get.nanoseconds) }
        }
        return samples
    }
}

/// Where the figures were measured.
struct EnvironmentInfo {
    var cores: Int
    var kernel: String
    var swtpm: String
    var tpm2Tools: String
    var softHSM: String
    var openSC: String
    var optimized: Bool
    /// The share of the machine's CPU time that other processes used during the run.
    var otherWork = 0.0

    /// - Parameter scratch: a private directory for the version commands' output.
    static func current(scratch: String) -> EnvironmentInfo {
        var name = utsname()
        uname(&name)
        let kernel = withUnsafeBytes(of: name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let shell = Subprocess(directory: scratch)
        /// The first line's word after `prefix`, or the whole first line without one.
        func version(_ argv: [String], _ prefix: String? = nil) -> String {
            guard let result = try? shell.run(argv), result.status == 0 else { return "not installed" }
            let text = String(decoding: result.output, as: UTF8.self)
            return text.split(separator: "\n").first.map { String($0) }.map { line in
                guard let prefix else { return line }
                return line.components(separatedBy: prefix).dropFirst().first?.split(separator: " ").first
                    .map { $0.trimmingCharacters(in: CharacterSet(charactersIn: ",\"")) } ?? line
            } ?? "unknown"
        }
        #if DEBUG
        let optimized = false
        #else
        let optimized = true
        #endif
        return EnvironmentInfo(cores: ProcessInfo.processInfo.activeProcessorCount, kernel: kernel,
                               swtpm: version(["swtpm", "--version"], "version "),
                               tpm2Tools: version(["tpm2_unseal", "--version"], "version=\""),
                               softHSM: version(["softhsm2-util", "--version"]),
                               openSC: version(["dpkg-query", "-W", "-f=${Version}", "opensc"]),
                               optimized: optimized)
    }
}
