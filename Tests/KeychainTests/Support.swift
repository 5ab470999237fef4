import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory
import Synchronization
import Testing
import TPM2

/// One private swtpm and a fresh store on it, per test; with `KEYCHAIN_TEST_THROUGH_DAEMON=1`, the
/// store is keychaind's and every call goes through its socket (`ContractThroughDaemonTests`).
struct Fixture {
    let tpm: SoftwareTPM
    let daemon: KeychainDaemon?
    let configuration: KeychainConfiguration
    let device: KeychainDevice

    init(pcrSelection: [Int]? = nil, throughDaemon: Bool = SimulatedDevice.throughDaemonByDefault) throws {
        tpm = try SoftwareTPM()
        if throughDaemon {
            let daemon = try KeychainDaemon(tpm: tpm, arguments: pcrSelection.map { ["--pcrs", $0.map(String.init).joined(separator: ",")] } ?? [])
            self.daemon = daemon
            configuration = daemon.configuration()
        } else {
            daemon = nil
            configuration = tpm.configuration(pcrSelection: pcrSelection)
        }
        device = KeychainDevice(configuration: configuration)
    }

    func storage(_ service: String = "tests", accessible: Accessible = .afterFirstUnlock) throws -> Keychain {
        try createKeychain(.init(service: service, accessible: accessible), configuration: configuration)
    }

    /// A TPM reset, and a new "process": the engine forgets the keys it unsealed.
    func reboot() async throws {
        try tpm.reboot()
        await device.dropCaches()
    }

    func extendPCR(_ index: Int) throws {
        let context = try TPMContext(device: tpm.device)
        try context.extendPCR(index, digest: sha256(Array("keychain tests: boot changed".utf8)))
    }
}

func bytes(_ text: String) -> SecureBytes { SecureBytes(copying: Array(text.utf8)) }

/// The code of the KeychainError `body` throws, or nil when it does not throw.
func code<T>(_ body: () async throws -> T) async -> KeychainError.Code? {
    do { _ = try await body(); return nil } catch let error as KeychainError { return error.code } catch {
        Issue.record("unexpected error \(error)")
        return nil
    }
}

/// The build directory holding the test bundle and the executables (`.build/debug`).
var buildDirectory: URL {
    var url = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    while url.pathComponents.count > 1 && !FileManager.default.fileExists(atPath: url.appendingPathComponent("keychainctl").path) {
        url.deleteLastPathComponent()
    }
    return url
}

/// Runs a program with `input` on stdin; returns its exit status, stdout and stderr.
/// Through `Processes.spawn`, so the child holds no descriptor of another test (a pipe's write end, a
/// TPM connection) that would keep that test waiting.
@discardableResult
func run(_ path: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:]) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { $1 }
    let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
    guard let pid = Processes.spawn(path, [path] + args, environment: env,
                                    stdin: stdin.fileHandleForReading.fileDescriptor,
                                    stdout: stdout.fileHandleForWriting.fileDescriptor,
                                    stderr: stderr.fileHandleForWriting.fileDescriptor) else {
        throw SoftwareTPMError("cannot start \(path): errno \(errno)")
    }
    try stdin.fileHandleForReading.close()
    try stdout.fileHandleForWriting.close()
    try stderr.fileHandleForWriting.close()
    // A child may exit without reading all its input (a refused `set`): that is EPIPE for this write,
    // not a SIGPIPE that ends the whole test process.
    _ = ignoreBrokenPipes
    // A child that never ends (a TPM client queued behind another forever) fails its test after two
    // minutes instead of holding the whole run until CI's cap.
    let finished = Mutex(false)
    DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(childDeadlineSeconds)) {
        finished.withLock { done in if !done { kill(pid, SIGKILL) } }
    }
    try? stdin.fileHandleForWriting.write(contentsOf: Data(input))
    try stdin.fileHandleForWriting.close()
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let err = stderr.fileHandleForReading.readDataToEndOfFile()
    let status = Processes.wait(pid)
    let timedOut = finished.withLock { done in defer { done = true }; return status == -1 }
    return (status, Array(out), String(decoding: err, as: UTF8.self) + (timedOut ? "\n[killed: a signal ended it, or it ran past \(childDeadlineSeconds) s]" : ""))
}

/// How long a child of a test may run.
let childDeadlineSeconds = 120

/// SIGPIPE ignored in the test process, once (children still start with the default).
let ignoreBrokenPipes: Void = { signal(SIGPIPE, SIG_IGN) }()

/// Starts `keychain-bench --quick` (it makes a `SoftwareTPM`) and reads its stderr until it says
/// where its store is; returns its pid and what it said. The caller ends it.
func startBenchUntilItNamesItsStore(environment: [String: String]? = nil) throws -> (pid: pid_t, said: String) {
    let bench = buildDirectory.appendingPathComponent("keychain-bench").path
    let stderr = Pipe()
    let pid = try #require(Processes.spawn(bench, [bench, "--quick"], environment: environment,
                                           stderr: stderr.fileHandleForWriting.fileDescriptor))
    try stderr.fileHandleForWriting.close()
    var said = ""
    while !said.contains("store in") {
        let chunk = stderr.fileHandleForReading.availableData
        if chunk.isEmpty { break }
        said += String(decoding: chunk, as: UTF8.self)
    }
    return (pid, said)
}
