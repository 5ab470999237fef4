import Foundation
import Keychain
import KeychainWire
import KeychainTestSupport
import KeychainTestThreads
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

    init(pcrSelection: [Int]? = nil, throughDaemon: Bool = SimulatedDevice.throughDaemonByDefault, profile: TPMProfile? = nil) throws {
        tpm = try SoftwareTPM(profile: profile)
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

    /// What keychaind does not serve, on this fixture's store in this process.
    var administration: KeychainAdministration { get throws(KeychainError) { try KeychainAdministration(configuration: configuration) } }

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

/// A store directory not made yet under the temporary directory, whose keychain uses the embedded
/// software TPM (started by the first call that needs it); `remove()` stops that TPM and deletes the
/// directory.
struct EmbeddedStore {
    let directory: String
    var configuration: KeychainConfiguration { KeychainConfiguration(storeDirectory: directory, tpm: .embedded) }

    init(_ prefix: String) {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)").path
    }

    func remove() {
        EmbeddedTPM.stop(storeDirectory: directory)
        try? FileManager.default.removeItem(atPath: directory)
    }
}

func bytes(_ text: String) -> SecureBytes { SecureBytes(copying: Array(text.utf8)) }

/// A field of a process's /proc/PID/status in KiB: `VmRSS` (resident memory), `RssAnon` (its anonymous part).
func processStatusKiB(_ pid: pid_t, _ field: String) throws -> Int {
    let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
    let line = try #require(status.split(separator: "\n").first { $0.hasPrefix(field + ":") })
    return try #require(Int(line.split(whereSeparator: \.isWhitespace)[1]))
}

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

/// Runs a program with `input` on stdin; its exit status, stdout and stderr (`runChild`: killed
/// after `childDeadlineSeconds`). It blocks its thread until the child ends: a suite that calls it
/// is `.offThePool`.
@discardableResult
func run(_ path: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:]) throws -> ChildResult {
    try runChild(path, args, input: input, environment: environment, deadline: childDeadlineSeconds)
}

/// For a test that needs a process of its own (it changes the process's environment or OpenSSL's
/// global context): in the test process it runs `test` again, alone, in a child test process and
/// expects it to pass, and returns false; in that child (`variable` set) it returns true, and the
/// test's body runs there.
func isTheChildRun(of test: String, variable: String) throws -> Bool {
    if ProcessInfo.processInfo.environment[variable] != nil { return true }
    let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().path
    let child = try run(me, ["--testing-library", "swift-testing", "--filter", test], environment: [variable: "1"])
    let output = String(decoding: child.stdout, as: UTF8.self) + child.stderr
    #expect(child.status == 0 && output.contains("1 test"), "\(output)")
    return false
}

/// How long a child of a test may run: `KEYCHAIN_TEST_CHILD_DEADLINE` seconds when set (scripts/sanitize.sh's
/// instrumented children run several times slower), else 120.
let childDeadlineSeconds = ProcessInfo.processInfo.environment["KEYCHAIN_TEST_CHILD_DEADLINE"].flatMap { Int($0) } ?? 120

/// SIGPIPE ignored in the test process, once (children still start with the default).
var ignoreBrokenPipes: Void { ignoreBrokenPipesInTests }

/// Starts `keychain-bench --quick` (it makes a `SoftwareTPM`) and reads its stderr until it says
/// where its store is; returns its pid and what it said. The caller ends it.
func startBenchUntilItNamesItsStore(environment: [String: String]? = nil) throws -> (pid: pid_t, said: String) {
    let bench = buildDirectory.appendingPathComponent("keychain-bench").path
    let stderr = Pipe()
    let pid = try #require(Processes.spawn(bench, [bench, "--quick"], environment: environment,
                                           stderr: stderr.fileHandleForWriting.fileDescriptor))
    try stderr.fileHandleForWriting.close()
    do {
        let said = try read(stderr.fileHandleForReading, until: "keychain-bench to name its store") {
            String(decoding: $0, as: UTF8.self).contains("store in")
        }
        return (pid, String(decoding: said, as: UTF8.self))
    } catch {
        kill(pid, SIGKILL)
        _ = Processes.wait(pid)
        throw error
    }
}

/// The start of a python3 script that speaks keychaind's wire by hand, as a client we did not write:
/// `field(tag, data)` makes one field, `read(s, n)` reads exactly n bytes (exits with "closed" when
/// the daemon closes first), `frame(body)` prefixes a request's length, `request(s, body)` sends one
/// and returns the reply's body, and `fields(reply)` maps a reply's tags (as strings) to text.
/// `V` is the protocol's version (a message's first byte), `options(service)` a storage's options
/// field naming only its service. A test's script is this followed by its own lines.
let rawWireClient = """
    import json, os, socket, struct, sys, threading, time
    V = \(Wire.version)
    def field(tag, data): return bytes([tag]) + struct.pack('>I', len(data)) + data
    def options(service): return bytes([V, 0]) + field(1, service.encode())
    def read(s, n):
        out = b''
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk: raise SystemExit('closed')
            out += chunk
        return out
    def frame(body): return struct.pack('>I', len(body)) + body
    def request(s, body):
        s.sendall(frame(body))
        return read(s, struct.unpack('>I', read(s, 4))[0])
    def fields(reply):
        out, at = {}, 2
        while at < len(reply):
            tag, n = reply[at], struct.unpack('>I', reply[at + 1:at + 5])[0]
            out[str(tag)] = reply[at + 5:at + 5 + n].decode('utf-8', 'replace'); at += 5 + n
        return out

    """

/// `count` connections to a daemon's socket opened by another uid (python3 through setpriv) and
/// held open without a byte sent, as an idle client we did not write holds them, until `release()`.
/// `held` is how many the daemon kept: a refused connection reads the daemon's refusal, then EOF (a
/// kept one reads nothing), so the count is taken once no refusal came for 3 s.
final class IdleConnections {
    let held: Int?
    private let process = Process()
    private let stdin = Pipe()

    init(socket: String, count: Int, uid: UInt32) throws {
        let script = """
            import select, socket, sys
            socks = []
            for i in range(\(count)):
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); socks.append(s)
            pending, closed = set(socks), 0
            while pending:
                ready, _, _ = select.select(list(pending), [], [], 3)
                if not ready: break
                for s in ready:
                    s.recv(65536); closed += 1; pending.discard(s)
            print(len(socks) - closed, flush=True)
            sys.stdin.read()
            """
        let stdout = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", script, socket]
        process.standardInput = stdin
        process.standardOutput = stdout
        try process.run()
        held = Int(String(decoding: stdout.fileHandleForReading.availableData, as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Closes every connection and waits for the holder to end.
    func release() {
        try? stdin.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}
