import BiometricsVault
import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory

/// `--vault-state N [in-process|keychaind] [ready|available|signed-in]`: N reads of a
/// BiometricsVault's `state` with nothing stored (`ready`: each read asks the device whether
/// biometrics can be used), of `biometricsAvailable`, and of `state` once signed in
/// (`keychainSecured`: from memory), in-process and through keychaind, on a private swtpm with a
/// passcode and a finger enrolled. The prompt is the system's (`SystemAuthenticator`) with the
/// password agents' directory made for the run, so a prompt can reach someone as on a headless
/// device; with `DISPLAY` and `DBUS_SESSION_BUS_ADDRESS` set, the desktop prompter is asked first,
/// as on a desktop. For `valgrind --tool=callgrind`: one mode and one kind of read, two runs with
/// different N; the difference of their instruction counts over the difference of N is one read.
func vaultStateBench(reads: Int, modes: [String], kinds: [String]) async throws -> String {
    struct Credentials: Codable, Sendable { var user: String }
    var lines: [String] = []
    for mode in modes {
        let device = try await SimulatedDevice(passcode: SecureBytes(copying: Array("2468".utf8)), fingers: ["thumb"],
                                               throughDaemon: mode == "keychaind")
        let agents = device.tpm.directory + "/ask-password"
        try FileManager.default.createDirectory(atPath: agents, withIntermediateDirectories: false)
        var configuration = device.configuration
        configuration.authenticator = SystemAuthenticator(prompters: [
            TerminalAuthenticator(), SystemPrompterAuthenticator(), AskPasswordAuthenticator(directory: agents),
        ])
        let vault = BiometricsVault<Credentials>(key: "bench", configuration: configuration)
        guard vault.state.kind == .ready else { throw BenchFailure("the vault starts \(vault.state), not ready") }
        let daemon = device.daemon?.processIdentifier
        func measure(_ kind: String, _ read: () -> Bool) throws {
            guard kinds.contains(kind) else { return }
            let before = (wall: monotonicNanoseconds(), cpu: ProcessCost.now(), daemon: daemon.map(ProcessCost.of))
            for _ in 0..<reads {
                guard read() else { throw BenchFailure("\(kind): a read gave another answer") }
            }
            let wall = Double(monotonicNanoseconds() - before.wall)
            let cost = ProcessCost.now() - before.cpu
            var line = "\(mode), \(kind): \(reads) reads, \(Int(Double(reads) / (wall / 1e9))) reads/s (wall), "
                + "CPU \(String(format: "%.1f", cost.cpuMicroseconds / Double(reads))) µs/read in this process, "
                + "\(String(format: "%.2f", Double(cost.switches) / Double(reads))) context switches/read"
            if let daemon, let started = before.daemon {
                line += ", keychaind CPU \(String(format: "%.1f", (ProcessCost.of(daemon) - started).cpuMicroseconds / Double(reads))) µs/read"
            }
            lines.append(line)
        }
        try measure("ready") { vault.state.kind == .ready }
        try measure("available") { vault.biometricsAvailable }
        try vault.enableKeychainVault(saving: Credentials(user: "alice"))
        try measure("signed-in") { vault.state.kind == .keychainSecured }
        vault.resetEverything()
    }
    return lines.joined(separator: "\n")
}

/// CPU time (every thread) and context switches of a process: what a read costs whatever else the
/// machine runs, where wall-clock figures follow the load.
struct ProcessCost {
    var cpuMicroseconds: Double
    var switches: Int

    /// This process: CLOCK_PROCESS_CPUTIME_ID, and getrusage's voluntary and involuntary switches.
    static func now() -> ProcessCost {
        var cpu = timespec()
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu)
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return ProcessCost(cpuMicroseconds: Double(cpu.tv_sec) * 1e6 + Double(cpu.tv_nsec) / 1e3,
                           switches: usage.ru_nvcsw + usage.ru_nivcsw)
    }

    /// Another process: utime + stime of /proc/PID/stat (clock ticks); no switch count.
    static func of(_ pid: pid_t) -> ProcessCost {
        let stat = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)) ?? ""
        let fields = stat.split(separator: ")").last?.split(separator: " ") ?? []
        let ticks = fields.count > 12 ? (Double(fields[11]) ?? 0) + (Double(fields[12]) ?? 0) : 0
        return ProcessCost(cpuMicroseconds: ticks * 1e6 / Double(sysconf(Int32(_SC_CLK_TCK))), switches: 0)
    }

    static func - (a: ProcessCost, b: ProcessCost) -> ProcessCost {
        ProcessCost(cpuMicroseconds: a.cpuMicroseconds - b.cpuMicroseconds, switches: a.switches - b.switches)
    }
}

/// `--prompter-reach N`: N `reachability()` calls of the desktop prompter (gcr's, on the session bus
/// of `DBUS_SESSION_BUS_ADDRESS`, with `DISPLAY` set), as `canUseAccessControl` and each protected
/// read ask it: the CPU and context switches of one call in this process.
func prompterReachBench(calls: Int) async throws -> String {
    let prompter = SystemPrompterAuthenticator()
    guard case .reachable = await prompter.reachability() else {
        throw BenchFailure("the desktop prompter is not reachable: set DISPLAY and DBUS_SESSION_BUS_ADDRESS to a bus where "
                           + "\(SystemPrompterAuthenticator.busName) is owned or can be started")
    }
    let before = (wall: monotonicNanoseconds(), cost: ProcessCost.now())
    for _ in 0..<calls {
        guard case .reachable = await prompter.reachability() else { throw BenchFailure("the prompter went away") }
    }
    let wall = Double(monotonicNanoseconds() - before.wall)
    let cost = ProcessCost.now() - before.cost
    return "desktop prompter reachability: \(calls) calls, \(Int(Double(calls) / (wall / 1e9))) calls/s (wall), "
        + "CPU \(String(format: "%.1f", cost.cpuMicroseconds / Double(calls))) µs/call, "
        + "\(String(format: "%.2f", Double(cost.switches) / Double(calls))) context switches/call"
}
