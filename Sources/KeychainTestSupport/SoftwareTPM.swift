import Foundation
import Keychain
import Synchronization
import TPM2

/// A private software TPM for one test or suite: swtpm on Unix sockets in a 0700 folder
/// `$TMPDIR/keychain-swtpm-<UUID>` (`/tmp` without `TMPDIR`), small dictionary-attack limits, stopped
/// and removed when released (with the lock files of the turns taken at it), and killed with the
/// process that made it (however that process ends). A folder left by a run that was killed is
/// removed, with its lock files, by the next `SoftwareTPM()` of the same user.
///
/// ```swift
/// let tpm = try SoftwareTPM()
/// let keychain = try createKeychain(.init(service: "tests"), configuration: tpm.configuration())
/// ```
///
/// With a `profile`, the TPM behaves like a chip a device has (its times, the commands it lacks, the
/// warnings it answers): swtpm then runs in `directory/chip` behind a proxy on the same sockets.
public final class SoftwareTPM: @unchecked Sendable {
    /// `$TMPDIR/keychain-swtpm-<UUID>`: the sockets, `state/` (the TPM's), `store/`, `reader/`, `owner`.
    public let directory: String
    private let swtpm: Swtpm
    /// The swtpm process while it runs, and the profile's proxy in front of it (nil for plain swtpm).
    private struct Running {
        var child: Swtpm.Child?
        var proxy: ChipProxy?
    }
    private let running = Mutex(Running())
    /// The profile this TPM behaves as; nil for swtpm as it is.
    public let profile: TPMProfile?

    /// The TCTI string of this TPM (`swtpm:path=…/tpm`).
    public var tcti: String { device.tctiConfiguration }
    public let device: TPMDevice
    /// The command codes the profile's proxy was sent, in order; empty without a profile.
    public var commandsSeen: [UInt32] { running.withLock { $0.proxy?.commandsSeen ?? [] } }
    /// The commands swtpm answered behind the profile's proxy, with their answers' codes; empty without a profile.
    public var exchangesSeen: [TPMExchange] { running.withLock { $0.proxy?.exchangesSeen ?? [] } }
    /// The socket swtpm itself listens on: the `tcti`'s, or `directory/chip/tpm` behind a profile's proxy.
    public var swtpmSocket: String { swtpm.socket }
    /// The swtpm process (to stop it with SIGSTOP, say); 0 when it is not running.
    public var processIdentifier: pid_t { running.withLock { $0.child?.pid ?? 0 } }

    /// - Parameter profile: the chip to behave as; by default the one `KEYCHAIN_TEST_TPM_PROFILE` names
    ///   (`fast`, `typical`, `slow`, `old`: scripts/tpm-profiles.sh runs suites on each), else plain swtpm.
    public init(profile: TPMProfile? = nil) throws {
        let profile = try profile ?? TPMProfile.fromEnvironment(ProcessInfo.processInfo.environment)
        self.profile = profile
        let temporary = FileManager.default.temporaryDirectory.path
        Self.removeStaleDirectories(in: temporary)
        directory = temporary + "/keychain-swtpm-\(UUID().uuidString)"
        for dir in [directory, directory + "/state"] + (profile == nil ? [] : [directory + "/chip"]) where mkdir(dir, 0o700) != 0 {
            throw SoftwareTPMError("cannot create \(dir): errno \(errno)")
        }
        try Self.recordOwner(in: directory)
        let front = try Swtpm(directory: directory)
        device = front.device
        swtpm = profile == nil ? front : try Swtpm(directory: directory + "/chip")
        if let profile {
            let proxy = try ChipProxy(profile: profile, socket: front.socket, upstream: swtpm.socket)
            running.withLock { $0.proxy = proxy }
        }
        try start()
        // Low DA limits, so a test that fails authorizations never waits minutes (our own objects are noDA).
        let context = try TPMContext(device: device)
        try context.setDictionaryAttackParameters(maxTries: 1000, recoveryTime: 1, lockoutRecovery: 1)
    }

    deinit { remove() }

    /// Stops swtpm and removes what this TPM leaves behind: its folder and the lock files of the
    /// turns taken at it (in `/tmp/keychain-<uid>` or `$XDG_RUNTIME_DIR/keychain`). A released
    /// `SoftwareTPM` does it itself; a program that ends with `exit` (no deinit runs) calls it first.
    /// The TPM cannot be started again after it.
    public func remove() {
        stop()
        running.withLock { $0.proxy?.stop() }
        TPMTurn.removeLocks(of: device)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A keychain configuration on this TPM with its store in `directory/store` (or `store`).
    public func configuration(store: String? = nil, pcrSelection: [Int]? = nil) -> KeychainConfiguration {
        Self.noteInProcess("configuration()")
        var configuration = KeychainConfiguration(storeDirectory: store ?? directory + "/store", tpm: .tcti(tcti), pcrSelection: pcrSelection)
        configuration.applicationIdentifier = configuration.applicationIdentifier ?? Self.testApplicationIdentifier
        return configuration
    }

    /// The default service of a test's storages (`keychain`, `createKeychain()` without a service)
    /// when the test process has no application identifier of its own (no `KEYCHAIN_APP_ID`, no unit).
    public static let testApplicationIdentifier = "keychain-tests"

    /// The environment that points a child process's default configuration (`keychain`,
    /// `createKeychain()`, `keychainctl`) at this TPM and `directory/store`, with no fingerprint reader.
    public var environment: [String: String] {
        Self.noteInProcess("environment")
        return ["KEYCHAIN_TCTI": tcti, "KEYCHAIN_STORE": directory + "/store", "KEYCHAIN_READER": "none"]
    }

    /// Said on stderr when a test of a run through keychaind (`KEYCHAIN_TEST_THROUGH_DAEMON=1`) reaches
    /// the keychain in-process anyway, so the run can fail instead of passing without the daemon.
    public static let inProcessNotice = "keychain tests: in-process use in a run through keychaind: SoftwareTPM."

    private static func noteInProcess(_ door: String) {
        guard SimulatedDevice.throughDaemonByDefault else { return }
        FileHandle.standardError.write(Data((inProcessNotice + door + "\n").utf8))
    }

    /// Replaces the TPM's state with one `swtpm_setup --create-ek-cert` manufactured: EKs and their
    /// certificates in NV, signed by a local CA kept in `directory/ca`; then starts it.
    /// - Returns: the path of the CA chain (root, then issuer) a verifier's `--ek-ca` takes.
    @discardableResult
    public func manufacture() throws -> String {
        let ca = directory + "/ca"
        try FileManager.default.createDirectory(atPath: ca, withIntermediateDirectories: true)
        try "statedir = \(ca)\nsigningkey = \(ca)/signkey.pem\nissuercert = \(ca)/issuercert.pem\ncertserial = \(ca)/certserial\n"
            .write(toFile: directory + "/localca.conf", atomically: true, encoding: .utf8)
        try "create_certs_tool = /usr/bin/swtpm_localca\ncreate_certs_tool_config = \(directory)/localca.conf\ncreate_certs_tool_options = /etc/swtpm-localca.options\nactive_pcr_banks = sha256\n"
            .write(toFile: directory + "/setup.conf", atomically: true, encoding: .utf8)
        stop()
        let made = try runChild("/usr/bin/swtpm_setup", ["--tpm2", "--tpmstate", directory + "/state", "--create-ek-cert",
                                                        "--config", directory + "/setup.conf", "--overwrite"])
        guard made.status == 0 else { throw SoftwareTPMError("swtpm_setup --create-ek-cert failed (\(made.status)): \(made.stderr)") }
        try reboot()
        let chain = directory + "/fleet-ca.pem"
        try (Data(contentsOf: URL(fileURLWithPath: ca + "/swtpm-localca-rootca-cert.pem"))
             + Data(contentsOf: URL(fileURLWithPath: ca + "/issuercert.pem"))).write(to: URL(fileURLWithPath: chain))
        return chain
    }

    /// A TPM reset: the process stops and starts again on the same state.
    public func reboot() throws {
        stop()
        try start()
    }

    public func stop() {
        running.withLock { running in
            running.child?.stop()
            running.child = nil
        }
    }

    private func start() throws {
        let (swtpm, state) = (swtpm, directory + "/state")
        try running.withLock { $0.child = try swtpm.start(state: state) }
    }

    // MARK: Folders of dead runs

    /// Removes the `keychain-swtpm-*` folders in `temporary` whose owner process is gone (killed, so
    /// no deinit ran; its swtpm died with it). Only folders of this user that name their owner are
    /// considered, and a folder whose owner still runs is kept. `SoftwareTPM()` calls it.
    public static func removeStaleDirectories(in temporary: String) {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: temporary) else { return }
        for entry in entries where entry.hasPrefix("keychain-swtpm-") {
            let path = temporary + "/" + entry
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR, info.st_uid == getuid(),
                  let owner = readOwner(in: path), !isRunning(owner) else { continue }
            if let swtpm = try? Swtpm(directory: path) { TPMTurn.removeLocks(of: swtpm.device) }
            try? FileManager.default.removeItem(atPath: path)
        }
    }

    /// `owner` holds "<pid> <start time>": the start time tells a reused pid from the owner.
    private static func recordOwner(in directory: String) throws {
        let pid = getpid()
        guard let started = startTime(of: pid) else { throw SoftwareTPMError("cannot read /proc/\(pid)/stat") }
        let fd = open(directory + "/owner", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SoftwareTPMError("cannot create \(directory)/owner: errno \(errno)") }
        defer { close(fd) }
        let text = Array("\(pid) \(started)\n".utf8)
        guard write(fd, text, text.count) == text.count else {
            throw SoftwareTPMError("cannot write \(directory)/owner: errno \(errno)")
        }
    }

    private static func readOwner(in directory: String) -> (pid: pid_t, started: UInt64)? {
        let fd = open(directory + "/owner", O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { return nil }  // being made right now, or not ours to judge
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = read(fd, &buffer, buffer.count)
        guard count > 0 else { return nil }
        let fields = String(decoding: buffer[..<count], as: UTF8.self).split(whereSeparator: \.isWhitespace)
        guard fields.count == 2, let pid = pid_t(fields[0]), pid > 0, let started = UInt64(fields[1]) else { return nil }
        return (pid, started)
    }

    /// Gone only when the kernel says so (ESRCH); a pid that exists with another start time was reused.
    /// Anything unsure (an unreadable /proc entry, a zombie, a leader whose main thread exited and
    /// shows as `Z`) counts as running: a live test's folder is never removed.
    private static func isRunning(_ owner: (pid: pid_t, started: UInt64)) -> Bool {
        if kill(owner.pid, 0) != 0 && errno == ESRCH { return false }
        guard let started = startTime(of: owner.pid) else { return true }
        return started == owner.started
    }

    /// Field 22 of /proc/<pid>/stat: the start time, in clock ticks since boot.
    private static func startTime(of pid: pid_t) -> UInt64? {
        guard let handle = FileHandle(forReadingAtPath: "/proc/\(pid)/stat") else { return nil }
        defer { try? handle.close() }
        let text = String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
        // The command name (field 2) may hold spaces and parentheses: count from its last ')'.
        guard let end = text.lastIndex(of: ")") else { return nil }
        let fields = text[text.index(after: end)...].split(separator: " ")
        return fields.count > 19 ? UInt64(fields[19]) : nil
    }
}

public struct SoftwareTPMError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
