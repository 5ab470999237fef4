import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// The software TPMs' transport: Unix sockets only their owner reaches, children that inherit nothing
/// and die with their parent, TCTI strings checked at the edge.
@Suite("software TPM transport", .offThePool)
struct TransportTests {
    static let asNobody = ["--reuid=65534", "--regid=65534", "--clear-groups"]

    /// Attack: another local user looks for the embedded TPM (a TCP port in `ps` or `ss`, a socket),
    /// and connects to its command and control channels.
    @Test func anotherUserCanNeitherFindNorReachTheEmbeddedTPM() async throws {
        let directory = try temporaryDirectory()
        let store = directory + "/store"
        defer {
            EmbeddedTPM.stop(storeDirectory: store)
            try? FileManager.default.removeItem(atPath: directory)
        }
        _ = try await KeychainDevice(configuration: KeychainConfiguration(storeDirectory: store, tpm: .embedded)).status()
        let pid = try #require(pid_t(try String(contentsOfFile: store + "/swtpm/swtpm.pid", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)))
        try expectOnlyTheOwnerReaches(pid: pid, socket: store + "/swtpm/tpm")
    }

    @Test func anotherUserCanNeitherFindNorReachATestTPM() throws {
        let tpm = try SoftwareTPM()
        #expect(tpm.tcti == "swtpm:path=\(tpm.directory)/tpm")
        // Behind a profile's proxy (KEYCHAIN_TEST_TPM_PROFILE), swtpm's own sockets are in directory/chip.
        try expectOnlyTheOwnerReaches(pid: tpm.processIdentifier, socket: tpm.swtpmSocket)
    }

    func expectOnlyTheOwnerReaches(pid: pid_t, socket: String) throws {
        // No TCP listener: none of swtpm's sockets is a TCP one.
        let inodes = Set(try links(pid).values.compactMap { $0.hasPrefix("socket:[") ? String($0.dropFirst(8).dropLast()) : nil })
        #expect(inodes.count >= 2, "swtpm's command and control sockets")
        let tcp = try ["/proc/net/tcp", "/proc/net/tcp6"].flatMap { try column(9, of: $0) }
        #expect(inodes.isDisjoint(with: tcp), "swtpm listens on TCP")
        // Its Unix sockets are the two in its directory, which only its owner may enter.
        let unix = try procText("/proc/net/unix").split(separator: "\n")
            .map { $0.split(separator: " ").map(String.init) }
            .filter { $0.count >= 8 && inodes.contains($0[6]) }.map { $0[7] }
        #expect(Set(unix) == [socket, socket + ".ctrl"])
        let directory = (socket as NSString).deletingLastPathComponent
        var info = stat()
        #expect(lstat(directory, &info) == 0 && info.st_mode & 0o7777 == 0o700 && info.st_uid == getuid())

        // Another user cannot list the directory, connect to the command socket or the control socket.
        #expect(try run("/usr/bin/setpriv", Self.asNobody + ["/bin/ls", directory]).status != 0)
        let command = try run("/usr/bin/setpriv", Self.asNobody + ["/usr/bin/tpm2_getrandom", "-T", "swtpm:path=\(socket)", "8"],
                              environment: ["TSS2_LOG": "tcti+warning"])
        #expect(command.status != 0 && command.stderr.contains("Failed to connect"))
        let control = try run("/usr/bin/setpriv", Self.asNobody + ["/usr/bin/swtpm_ioctl", "--unix", socket + ".ctrl", "-g"])
        #expect(control.status != 0 && control.stderr.contains("Permission denied"), "\(control.stderr)")
        // The owner can, through the same TCTI string.
        #expect(try run("/usr/bin/tpm2_getrandom", ["-T", "swtpm:path=\(socket)", "8"]).status == 0)
        #expect(try run("/usr/bin/swtpm_ioctl", ["--unix", socket + ".ctrl", "-g"]).status == 0)
    }

    /// The hang of issue 8: a swtpm that inherited another test's TPM connection or a pipe's write
    /// end. Our own descriptor that is not close-on-exec (as tpm2-tss's sockets are not) must not reach
    /// a software TPM or a program a test runs.
    @Test func childrenInheritNoDescriptorOfTheTestProcess() throws {
        var leak: [Int32] = [0, 0]
        #expect(pipe(&leak) == 0)
        defer { close(leak[0]); close(leak[1]) }
        let ours = Set(try links(getpid()).values).subtracting(["/dev/null"])
        #expect(ours.contains { $0.hasPrefix("pipe:[") })

        let tpm = try SoftwareTPM()
        let swtpm = try links(tpm.processIdentifier)
        #expect(Set(swtpm.values).isDisjoint(with: ours), "swtpm holds \(Set(swtpm.values).intersection(ours))")

        let child = try run("/bin/sh", ["-c", "ls -l /proc/$$/fd"])
        let inherited = child.stdout.split(separator: UInt8(ascii: "\n")).map { String(decoding: $0, as: UTF8.self) }
            .compactMap { line -> String? in
                let fields = line.split(separator: " ")
                guard fields.count >= 3, fields[fields.count - 2] == "->", let fd = Int(fields[fields.count - 3]), fd > 2 else { return nil }
                return String(fields[fields.count - 1])
            }
        #expect(Set(inherited).isDisjoint(with: ours), "a child holds \(inherited)")
    }

    /// A plain `kill` (SIGTERM) stops the embedded TPM, even when the process that started it runs
    /// with SIGTERM blocked, as the cooperative pool's threads (and so `keychainctl`'s) do.
    @Test func aPlainKillStopsTheEmbeddedTPM() throws {
        let directory = try temporaryDirectory()
        let store = directory + "/store"
        defer {
            EmbeddedTPM.stop(storeDirectory: store)
            try? FileManager.default.removeItem(atPath: directory)
        }
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let status = try run(ctl, ["status"], environment: ["KEYCHAIN_STORE": store, "KEYCHAIN_TCTI": "", "TPM2TCTI": ""])
        #expect(status.status == 0, "\(status.stderr)")
        let pid = try #require(pid_t(try String(contentsOfFile: store + "/swtpm/swtpm.pid", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)))
        let blocked = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8).split(separator: "\n")
            .first { $0.hasPrefix("SigBlk:") }
        #expect(blocked == "SigBlk:\t0000000000000000")
        #expect(kill(pid, SIGTERM) == 0)
        #expect(waitUntilGone(pid), "swtpm \(pid) survived SIGTERM")
    }

    /// Fault: the TPM stops answering (swtpm stopped with SIGSTOP). The call returns, with
    /// `HARDWARE_UNAVAILABLE` saying so, and once the TPM answers again the keychain works again.
    @Test func aStoppedTPMGivesHardwareUnavailableInsteadOfAHang() async throws {
        let tpm = try SoftwareTPM()
        var configuration = tpm.configuration()
        configuration.tpmTimeout = .seconds(1)
        let device = KeychainDevice(configuration: configuration)
        let storage = try createKeychain(.init(service: "stopped"), configuration: configuration)
        try await storage.setItem("k", "v")
        await device.dropCaches()

        let pid = tpm.processIdentifier
        #expect(kill(pid, SIGSTOP) == 0)
        let error = await #expect(throws: KeychainError.self) { try await storage.getItem("k") }
        let status = await #expect(throws: KeychainError.self) { try await device.status() }
        #expect(kill(pid, SIGCONT) == 0)
        for error in [error, status] {
            #expect(error?.code == .hardwareUnavailable)
            #expect(error?.message.contains("did not answer within 1.0 seconds") == true, "\(String(describing: error))")
        }
        #expect(try await storage.getItem("k") == "v")
    }

    /// The watchdog of a test's TPM: the process that made it killed with SIGKILL (no deinit runs)
    /// takes its swtpm along. keychain-bench makes a `SoftwareTPM` and says where.
    @Test func aTestTPMDiesWithItsProcessEvenOnKill9() throws {
        let (pid, said) = try startBenchUntilItNamesItsStore()
        let marker = try #require(said.range(of: "swtpm on swtpm:path="), "keychain-bench said: \(said)")
        let socket = String(said[marker.upperBound...].prefix { $0 != "," })
        // The socket's directory: behind a profile's proxy swtpm's own socket is in its `chip` folder.
        let directory = (socket as NSString).deletingLastPathComponent + "/"
        let swtpm = try #require(try processes(mentioning: directory).first, "no swtpm in \(directory)")
        #expect(kill(pid, SIGKILL) == 0)
        _ = Processes.wait(pid)
        #expect(waitUntilGone(swtpm), "swtpm \(swtpm) outlived the process that started it")
        try? FileManager.default.removeItem(atPath: (socket as NSString).deletingLastPathComponent)
    }

    /// The attack of issue 8, item 10: a malformed string used to fall back to port 2321, which any
    /// local user may listen on.
    @Test func aMalformedTCTIIsRefusedBeforeAnyConnection() async throws {
        let directory = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A store per string: one store has one TPM in a process (the engine of the first would answer).
        for (n, tcti) in ["swtpm:host=,port=abc", "swtpm:port=99999", "swtpm:path=", "swtpm:path=/x,port=2321", "swtpm:bogus=1"].enumerated() {
            let device = KeychainDevice(configuration: KeychainConfiguration(storeDirectory: directory + "/store\(n)", tpm: .tcti(tcti)))
            let error = await #expect(throws: KeychainError.self) { try await device.status() }
            #expect(error?.code == .invalidArgument)
            #expect(error?.message.contains("swtpm:path=SOCKET") == true, "\(String(describing: error))")
        }
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let cli = try run(ctl, ["--store", directory + "/store", "--tcti", "swtpm:host=,port=abc", "status"])
        #expect(cli.status == 2 && cli.stderr.contains("INVALID_ARGUMENT: Invalid TCTI 'swtpm:host=,port=abc'"), "\(cli.stderr)")
    }
}

/// A fresh 0700 directory under the temporary directory.
func temporaryDirectory() throws -> String {
    var template = Array((FileManager.default.temporaryDirectory.path + "/keychain-test-XXXXXX").utf8CString)
    guard let made = mkdtemp(&template) else { throw SoftwareTPMError("mkdtemp: errno \(errno)") }
    return String(cString: made)
}

/// What each descriptor of `pid` points to (`/dev/null`, `pipe:[…]`, `socket:[…]`, a path).
func links(_ pid: pid_t) throws -> [Int32: String] {
    let dir = "/proc/\(pid)/fd"
    var result: [Int32: String] = [:]
    for entry in try FileManager.default.contentsOfDirectory(atPath: dir) {
        if let fd = Int32(entry), let target = try? FileManager.default.destinationOfSymbolicLink(atPath: dir + "/" + entry) {
            result[fd] = target
        }
    }
    return result
}

/// A /proc file, read to its end (its size says 0, and Foundation's `contentsOfFile` stops early).
func procText(_ path: String) throws -> String {
    guard let handle = FileHandle(forReadingAtPath: path) else { throw SoftwareTPMError("cannot open \(path)") }
    defer { try? handle.close() }
    return String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
}

/// The processes whose command line mentions `text`.
func processes(mentioning text: String) throws -> [pid_t] {
    try FileManager.default.contentsOfDirectory(atPath: "/proc").compactMap(pid_t.init).filter { pid in
        guard let handle = FileHandle(forReadingAtPath: "/proc/\(pid)/cmdline") else { return false }
        defer { try? handle.close() }
        return String(decoding: handle.readDataToEndOfFile(), as: UTF8.self).contains(text)
    }
}

/// Column `index` (0-based) of a /proc/net table.
private func column(_ index: Int, of table: String) throws -> [String] {
    try procText(table).split(separator: "\n").dropFirst()
        .map { $0.split(separator: " ") }.filter { $0.count > index }.map { String($0[index]) }
}

/// Whether `pid` ends (or is a zombie) within a generous bound; never an assertion on time.
func waitUntilGone(_ pid: pid_t) -> Bool {
    for _ in 0..<1000 {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return true }
        if stat.split(separator: ")").last?.split(separator: " ").first == "Z" { return true }
        usleep(10_000)
    }
    return false
}
