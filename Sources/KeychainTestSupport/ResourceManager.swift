import Foundation
import Keychain
import KeychainTestThreads
import Synchronization

/// tpm2-abrmd in front of a `SoftwareTPM`, as the kernel's `/dev/tpmrm0` stands in front of a device's
/// TPM: it serves many clients at once, swaps their objects and sessions in and out of the TPM's slots
/// per command, and flushes what a client that went away left.
///
/// It runs on a dbus-daemon of its own (a session bus at `directory/bus`) under a bus name of its own,
/// so tests in parallel never reach each other's; both are children of this process, killed when it
/// is released and when the process ends, however it ends (`Swtpm.Child`'s watchdog). By default a
/// client holds at most 3 transient objects and 3 sessions at once, as through the kernel's resource
/// manager (`TPM2_MAX_CONTEXT_SIZE`'s tables in drivers/char/tpm/tpm2-space.c); tpm2-abrmd's own
/// defaults are 27 and 4.
///
/// ```swift
/// let tpm = try SoftwareTPM(profile: .typicalSPI)
/// let broker = try ResourceManager(tpm: tpm)
/// let daemon = try KeychainDaemon(tpm: tpm, environment: broker.environment, tcti: broker.tcti)
/// ```
///
/// - Important: the tabrmd TCTI finds the bus in `DBUS_SESSION_BUS_ADDRESS` and GLib keeps one session
///   bus per process, so the clients are child processes given `environment` (keychainctl, keychaind,
///   tpm2-tools), not an engine in the test process.
public final class ResourceManager: @unchecked Sendable {  // its children are set in init, ended once in stop()
    public let tpm: SoftwareTPM
    /// `tpm.directory/abrmd`: the bus socket and configuration, the logs.
    public let directory: String
    /// The name tpm2-abrmd owns on its bus, unique per instance.
    public let busName: String
    /// The TCTI configuration of clients: `tabrmd:bus_type=session,bus_name=…`.
    public var tcti: String { "tabrmd:bus_type=session,bus_name=\(busName)" }
    /// Its bus, for `DBUS_SESSION_BUS_ADDRESS`.
    public var busAddress: String { "unix:path=" + directory + "/bus" }
    /// What points a child at this resource manager: its bus, tpm2-tools' TCTI, and a keychain's
    /// default configuration (`KEYCHAIN_TCTI`, `KEYCHAIN_STORE` = `tpm.directory/store`, no reader).
    public var environment: [String: String] {
        ["DBUS_SESSION_BUS_ADDRESS": busAddress, "TPM2TOOLS_TCTI": tcti,
         "KEYCHAIN_TCTI": tcti, "KEYCHAIN_STORE": tpm.directory + "/store", "KEYCHAIN_READER": "none"]
    }
    private let children = Mutex<[Swtpm.Child]>([])

    /// Starts the bus and tpm2-abrmd, and returns once a client's command reaches the TPM through it.
    /// - Parameters:
    ///   - maxTransients: transient objects one client may hold at once (tpm2-abrmd's `--max-transients`).
    ///   - maxSessions: sessions one client may hold at once (`--max-sessions`).
    public init(tpm: SoftwareTPM, maxTransients: Int = 3, maxSessions: Int = 3) throws {
        self.tpm = tpm
        directory = tpm.directory + "/abrmd"
        busName = "com.intel.tss2.Tabrmd.t" + UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(12)
        guard mkdir(directory, 0o700) == 0 else { throw SoftwareTPMError("cannot create \(directory): errno \(errno)") }
        try privateSessionBusConfiguration(listen: busAddress)
            .write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
        do {
            try start("/usr/bin/dbus-daemon", ["--nofork", "--config-file=" + directory + "/bus.conf"], log: "dbus.log")
            try waitUntil("the resource manager's bus to listen at \(directory)/bus") { access(directory + "/bus", F_OK) == 0 }
            try start("/usr/sbin/tpm2-abrmd", ["--session", "--allow-root", "--dbus-name=" + busName, "--tcti=" + tpm.tcti,
                                               "--flush-all", "--max-transients=\(maxTransients)", "--max-sessions=\(maxSessions)"],
                      log: "abrmd.log")
            try waitUntil("tpm2-abrmd to answer as \(busName)") {
                (try? runChild("/usr/bin/tpm2_getrandom", ["--hex", "1"], environment: environment, deadline: 30).status) == 0
            }
        } catch {
            stop()
            throw error
        }
    }

    deinit { stop() }

    /// Kills tpm2-abrmd, then its bus. Clients see their TPM connection fail.
    public func stop() {
        children.withLock { children in
            for child in children.reversed() { child.stop() }
            children.removeAll()
        }
    }

    /// What tpm2-abrmd logged (its warnings about clients' handles, say).
    public var log: String { (try? String(contentsOfFile: directory + "/abrmd.log", encoding: .utf8)) ?? "" }

    private func start(_ path: String, _ args: [String], log: String) throws {
        let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
        let out = open(directory + "/" + log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        defer { close(null); close(out) }
        let env = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        guard let pid = Processes.spawn(path, [path] + args, environment: env, stdin: null, stdout: out, stderr: out) else {
            throw SoftwareTPMError("cannot start \(path): errno \(errno)")
        }
        let child: Swtpm.Child
        do { child = try Swtpm.Child(pid: pid) } catch { throw SoftwareTPMError("\(error)") }
        children.withLock { $0.append(child) }
    }
}
