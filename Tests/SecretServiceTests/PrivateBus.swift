import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Synchronization
import Testing

/// A real dbus-daemon on a private session bus whose only activatable service is our provider (its
/// own `<servicedir>`: gnome-keyring or any other installed provider can never answer), over a
/// private swtpm. Clients run against it with `DBUS_SESSION_BUS_ADDRESS`; `deinit` stops the bus,
/// and the provider, which the bus started, exits when its connection closes.
final class PrivateBus: @unchecked Sendable {
    let directory: String
    let tpm: SoftwareTPM
    let address: String
    let store: String
    /// The uid the bus, its provider and its clients run as (through `setpriv`); nil for this process's.
    let user: uid_t?
    /// The provider's arguments, as its activation file gives them.
    let providerArguments: [String]
    private let daemon: pid_t

    /// - Parameters:
    ///   - tpm: the software TPM under the store (a new one when nil); a keychaind's, for `--socket`.
    ///   - user: another uid for the bus, its provider and its clients (a bus of its own in /tmp, owned by it).
    ///   - providerArguments: the provider's arguments in the activation file from the TPM's TCTI
    ///     and the store directory; `--store STORE --tcti TCTI` when nil.
    ///   - display: a desktop for the provider's prompts: the bus activates gcr's prompter too, and
    ///     both run on this display.
    ///   - environment: more of the bus's environment, which the provider is started with.
    ///   - standardServiceDirectories: activate from the session's directories (`XDG_DATA_HOME`,
    ///     `XDG_DATA_DIRS` in `environment`: gnome-keyring's installed file among them), not our file's.
    ///   - answers: the provider's scripted prompter (`--prompter scripted:FILE`), one answer a line; the
    ///     file lives in the bus's directory and goes with it.
    init(tpm given: SoftwareTPM? = nil, user: uid_t? = nil, providerArguments: ((_ tcti: String, _ store: String) -> [String])? = nil,
         display: TestDisplay? = nil, environment: [String: String] = [:], answers: String? = nil,
         standardServiceDirectories: Bool = false) throws {
        _ = ignoreBrokenPipes
        tpm = try given ?? SoftwareTPM()
        self.user = user
        if let user {
            directory = "/tmp/keychain-ss-bus-" + String(UUID().uuidString.prefix(13))
            guard mkdir(directory, 0o700) == 0, chown(directory, user, user) == 0 else {
                throw SoftwareTPMError("cannot make \(directory) for uid \(user): errno \(errno)")
            }
        } else {
            directory = tpm.directory + "/bus"
        }
        store = tpm.directory + "/store"
        try FileManager.default.createDirectory(atPath: directory + "/services", withIntermediateDirectories: true)
        let socket = directory + "/socket"
        address = "unix:path=" + socket
        let config = privateSessionBusConfiguration(listen: address, serviceDirectory: standardServiceDirectories ? nil : directory + "/services",
                                                    standardServiceDirectories: standardServiceDirectories, maxMessageSize: 67_108_864)
        try config.write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        var arguments = providerArguments?(tpm.tcti, store) ?? ["--store", store, "--tcti", tpm.tcti]
        var owned = [directory + "/services", directory + "/bus.conf", directory + "/services/org.freedesktop.secrets.service"]
        if let answers {
            let file = directory + "/answers"
            try answers.write(toFile: file, atomically: true, encoding: .utf8)
            arguments += ["--prompter", "scripted:" + file]
            owned.append(file)
        }
        self.providerArguments = arguments
        let exec = ([Self.provider] + arguments).map { $0.contains(" ") ? "\"\($0)\"" : $0 }.joined(separator: " ")
        try "[D-BUS Service]\nName=org.freedesktop.secrets\nExec=\(exec)\n"
            .write(toFile: directory + "/services/org.freedesktop.secrets.service", atomically: true, encoding: .utf8)
        if display != nil { try TestDisplay.writePrompterService(into: directory + "/services") }
        if let user {
            for path in owned {
                guard chown(path, user, user) == 0 else { throw SoftwareTPMError("chown \(path): errno \(errno)") }
            }
        }
        let daemonPath = try #require(Processes.findExecutable("dbus-daemon"), "dbus-daemon is not installed (apt-get install dbus-daemon)")
        let command = [daemonPath, "--config-file=\(directory)/bus.conf", "--nofork", "--nopidfile"]
        // setpriv execs the bus: its pid is the bus's.
        var busEnvironment = ProcessInfo.processInfo.environment
        busEnvironment.merge(display?.prompterEnvironment ?? [:]) { $1 }
        busEnvironment.merge(environment) { $1 }
        // The bus's and its services' stderr (the provider's, gcr-prompter's), for a failing test to show.
        let log = open(directory + "/bus.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        defer { close(log) }
        if let user { _ = fchown(log, user, user) }
        guard let pid = user.map({ Processes.spawn(Self.setpriv, Self.asUser($0) + command, environment: busEnvironment, stderr: log) })
                ?? Processes.spawn(daemonPath, command, environment: busEnvironment, stderr: log) else {
            throw SoftwareTPMError("cannot start dbus-daemon: errno \(errno)")
        }
        daemon = pid
        try waitUntil("dbus-daemon to listen at \(socket)") { FileManager.default.fileExists(atPath: socket) }
    }

    /// Sets the device passcode of the store with keychainctl-full, before the provider starts (the
    /// software TPM takes one connection at a time).
    func setPasscode(_ passcode: String) throws {
        let full = buildDirectory.appendingPathComponent("keychainctl-full").path
        let set = try SecretServiceTests.run(full, ["--store", store, "--tcti", tpm.tcti, "passcode", "set"], input: Array((passcode + "\n").utf8))
        try #require(set.status == 0, "passcode set: \(set.stderr)")
    }

    /// Everything that crossed the bus while `body` ran (`dbus-monitor --pcap`, stopped before it is read).
    func captured(_ body: () throws -> Void) throws -> Data {
        let capture = directory + "/capture.pcap"
        let file = open(capture, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let monitor = try #require(Processes.spawn("/usr/bin/dbus-monitor", ["/usr/bin/dbus-monitor", "--address", address, "--pcap"], stdout: file))
        close(file)
        var running = true
        func stop() {
            guard running else { return }
            kill(monitor, SIGTERM)
            _ = Processes.wait(monitor)
            running = false
        }
        defer { stop() }
        try body()
        stop()
        return try #require(FileManager.default.contents(atPath: capture))
    }

    /// What the bus and the services it started wrote on stderr so far.
    var log: String { (try? String(contentsOfFile: directory + "/bus.log", encoding: .utf8)) ?? "" }

    static let setpriv = "/usr/bin/setpriv"
    /// `setpriv`'s argv up to the command: the uid and gid `user`, no supplementary groups.
    static func asUser(_ user: uid_t) -> [String] { [setpriv, "--reuid=\(user)", "--regid=\(user)", "--clear-groups"] }

    deinit {
        kill(daemon, SIGTERM)
        _ = Processes.wait(daemon)
        // The provider exits when the bus goes; give it the time to close its store before the TPM stops.
        for _ in 0..<300 where providerPIDs().count > 0 { usleep(10_000) }
        for pid in providerPIDs() { kill(pid, SIGKILL) }
        if user != nil { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// The provider processes of this bus: this bus's provider arguments, run by the bus's uid.
    func providerPIDs() -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        let wanted = ([Self.provider] + providerArguments).joined(separator: "\0") + "\0"
        return entries.compactMap { entry -> pid_t? in
            var info = stat()
            guard let pid = pid_t(entry), stat("/proc/\(entry)", &info) == 0, info.st_uid == (user ?? getuid()),
                  let cmdline = FileManager.default.contents(atPath: "/proc/\(entry)/cmdline") else { return nil }
            return String(decoding: cmdline, as: UTF8.self).hasPrefix(wanted) ? pid : nil
        }
    }

    static let provider = buildDirectory.appendingPathComponent("keychain-secret-service").path

    /// A client on this bus (as the bus's uid): its status, stdout and stderr.
    @discardableResult
    func run(_ path: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:]) throws
        -> (status: Int32, stdout: [UInt8], stderr: String) {
        var env = environment
        env["DBUS_SESSION_BUS_ADDRESS"] = address
        guard let user else { return try SecretServiceTests.run(path, args, input: input, environment: env) }
        let command = Self.asUser(user) + [path] + args
        return try SecretServiceTests.run(Self.setpriv, Array(command.dropFirst()), input: input, environment: env)
    }

    /// `/usr/bin/python3` running `script` on this bus, the secret given on stdin; fails the test with its stderr.
    func python(_ script: String, input: [UInt8] = [], _ args: [String] = [], environment: [String: String] = [:]) throws -> String {
        let result = try run(Self.python3, ["-c", script] + args, input: input, environment: environment)
        #expect(result.status == 0, "python failed: \(result.stderr)")
        return String(decoding: result.stdout, as: UTF8.self)
    }

    static let python3 = "/usr/bin/python3"
    static let secretTool = "/usr/bin/secret-tool"

    /// A missing client fails the test with what to install (it is not skipped).
    static func require(_ path: String, _ package: String) throws {
        try #require(FileManager.default.isExecutableFile(atPath: path), "\(path) is missing: apt-get install \(package) (scripts/setup-debian.sh)")
    }

    static func requirePython(module: String, package: String) throws {
        try require(python3, "python3")
        let result = try SecretServiceTests.run(python3, ["-c", "import \(module)"])
        try #require(result.status == 0, "python module \(module) is missing: apt-get install \(package) (scripts/setup-debian.sh): \(result.stderr)")
    }
}

/// The build directory holding the test bundle and the executables (`.build/debug`).
var buildDirectory: URL {
    var url = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    while url.pathComponents.count > 1 && !FileManager.default.fileExists(atPath: url.appendingPathComponent("keychain-secret-service").path) {
        url.deleteLastPathComponent()
    }
    return url
}

/// SIGPIPE ignored in the test process, once.
var ignoreBrokenPipes: Void { ignoreBrokenPipesInTests }

/// Runs a program with `input` on stdin (never a secret in argv); its exit status, stdout and stderr.
/// Killed after two minutes, so a hung client fails its test instead of holding the run.
@discardableResult
func run(_ path: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:]) throws -> ChildResult {
    try runChild(path, args, input: input, environment: environment)
}
