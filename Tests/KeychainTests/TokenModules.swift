import Foundation
import Keychain
import KeychainTestSupport

/// The PKCS#11 modules `TokenBackendTests.Token` runs on: SoftHSM2, and openCryptoki's software
/// token, each a real stack started for one test (`TokenModuleStack`).
enum TokenModule: Sendable {
    /// `mechanisms`: SoftHSM2's `slots.mechanisms`, what the token offers (see PKCS11Tests' SoftHSM).
    case softHSM(mechanisms: String?)
    /// openCryptoki's software token (slot 3), served by pkcsslotd.
    case openCryptoki

    var path: String {
        switch self {
        case .softHSM: TokenBackendTests.module
        case .openCryptoki: "/usr/lib/x86_64-linux-gnu/opencryptoki/libopencryptoki.so.0"
        }
    }
}

/// The processes behind a token (pkcsslotd, when this test started it), ended when the fixture is released.
final class TokenModuleStack: @unchecked Sendable {  // mutated only while it is set up, then read by deinit

    deinit {
        for pid in daemonized { kill(pid, SIGTERM) }
    }

    /// openCryptoki's software token (slot 3) initialized afresh as `kc`, user PIN 1234; pkcsslotd
    /// started when it is not running (and then stopped with this fixture).
    func startOpenCryptoki() throws {
        // The pid in pkcsslotd's pid file, when that process is alive (the file outlives it).
        func runningSlotDaemon() -> pid_t? {
            (try? String(contentsOfFile: "/var/run/pkcsslotd.pid", encoding: .utf8))
                .flatMap { Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }.flatMap { kill($0, 0) == 0 ? $0 : nil }
        }
        if runningSlotDaemon() == nil {
            let started = try run("/usr/sbin/pkcsslotd", [])
            guard started.status == 0 else { throw SoftwareTPMError("pkcsslotd: \(started.stderr)") }
            try waitUntil("pkcsslotd") { runningSlotDaemon() != nil }
            daemonized.append(runningSlotDaemon()!)
        }
        let module = TokenModule.openCryptoki.path
        for args in [["--init-token", "--so-pin", "87654321", "--label", "kc"],
                     ["--init-pin", "--login", "--login-type", "so", "--so-pin", "87654321", "--pin", "1234"]] {
            let made = try run("/usr/bin/pkcs11-tool", ["--module", module, "--slot", "3"] + args)
            guard made.status == 0 else { throw SoftwareTPMError("pkcs11-tool \(args[0]): \(made.stderr)") }
        }
    }
    /// pkcsslotd forks into the background: ours to end, though not our child.
    private var daemonized: [pid_t] = []

    private func waitUntil(_ what: String, _ ready: () -> Bool) throws {
        for _ in 0..<100 {
            if ready() { return }
            usleep(50_000)
        }
        throw SoftwareTPMError("\(what) did not start within 5 s")
    }
}
