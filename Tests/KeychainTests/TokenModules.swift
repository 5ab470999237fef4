import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads

/// The PKCS#11 modules `TokenBackendTests.Token` runs on: SoftHSM2, and the two a Linux device is
/// likely to have (tpm2-pkcs11, openCryptoki's software token), each a real stack started for one
/// test (`TokenModuleStack`).
enum TokenModule: Sendable {
    /// `mechanisms`: SoftHSM2's `slots.mechanisms`, what the token offers (see PKCS11Tests' SoftHSM).
    case softHSM(mechanisms: String?)
    /// openCryptoki's software token (slot 3), served by pkcsslotd.
    case openCryptoki
    /// tpm2-pkcs11 (Debian's libtpm2-pkcs11-1) on a swtpm of its own, through tpm2-abrmd on a private bus.
    case tpm2PKCS11
    /// SoftHSM2 behind this package's test module (Sources/KeychainTestRefusingToken): a key generation
    /// whose template carries an attribute of `refusing` ("CKA_WRAP") is refused with `with` (a CKR name),
    /// and those of `ignoring` are taken out of the template unsaid (the token makes the key without them).
    case refusingSoftHSM(mechanisms: String?, refusing: [String], with: String = "CKR_ATTRIBUTE_TYPE_INVALID", ignoring: [String] = [])

    var path: String {
        switch self {
        case .softHSM: TokenBackendTests.module
        case .openCryptoki: "/usr/lib/x86_64-linux-gnu/opencryptoki/libopencryptoki.so.0"
        case .tpm2PKCS11: "/usr/lib/x86_64-linux-gnu/pkcs11/libtpm2_pkcs11.so"
        case .refusingSoftHSM: buildDirectory.appendingPathComponent("libKeychainTestRefusingToken.so").path
        }
    }

    /// The module that lists the token's objects: SoftHSM2's own under the test module, so the count does
    /// not go through the module under test.
    var listingPath: String {
        if case .refusingSoftHSM = self { return TokenBackendTests.module }
        return path
    }

    /// What the test module reads (nothing for the others).
    var environment: [String: String] {
        guard case .refusingSoftHSM(_, let refusing, let with, let ignoring) = self else { return [:] }
        return ["KEYCHAIN_TEST_TOKEN_REFUSES": refusing.joined(separator: ","), "KEYCHAIN_TEST_TOKEN_REFUSES_WITH": with,
                "KEYCHAIN_TEST_TOKEN_IGNORES": ignoring.joined(separator: ",")]
    }
}

/// The processes behind a token (pkcsslotd, when this test started it; tpm2-pkcs11's swtpm, dbus-daemon
/// and tpm2-abrmd), ended when the fixture is released.
final class TokenModuleStack: @unchecked Sendable {  // mutated only while it is set up, then read by deinit
    private var tokenBroker: ResourceManager?

    deinit {
        for pid in daemonized { kill(pid, SIGTERM) }
    }

    /// tpm2-pkcs11's token `kc` (user PIN 1234) in `directory`, on a swtpm of its own behind tpm2-abrmd
    /// (`ResourceManager`, with tpm2-abrmd's own limits of 27 objects and 4 sessions per client, as before).
    /// Returns the environment the module's users need.
    func startTPM2PKCS11(in directory: String) throws -> [String: String] {
        let broker = try ResourceManager(tpm: try SoftwareTPM(), maxTransients: 27, maxSessions: 4)
        tokenBroker = broker
        try FileManager.default.createDirectory(atPath: directory + "/store", withIntermediateDirectories: true)
        let env = ["DBUS_SESSION_BUS_ADDRESS": broker.busAddress, "TPM2_PKCS11_TCTI": broker.tcti, "TPM2TOOLS_TCTI": broker.tcti,
                   "TPM2_PKCS11_STORE": directory + "/store"]
        for args in [["init"], ["addtoken", "--pid=1", "--sopin=12345678", "--userpin=1234", "--label=kc"]] {
            let made = try run("/usr/bin/tpm2_ptool", args, environment: env)
            guard made.status == 0 else { throw SoftwareTPMError("tpm2_ptool \(args[0]): \(made.stderr)") }
        }
        return env
    }

    /// openCryptoki's software token (slot 3) initialized afresh as `kc`, user PIN 1234; pkcsslotd
    /// started when none answers (and then stopped with this fixture).
    ///
    /// A pkcsslotd answers when the library's C_Initialize succeeds (`pkcs11-tool -L`): its pid file
    /// proves nothing, as it outlives the daemon and its pid may be reused or a zombie's. Without a
    /// daemon, C_Initialize says CKR_HOST_MEMORY (no shared memory to attach to).
    func startOpenCryptoki() throws {
        let module = TokenModule.openCryptoki.path
        func slotDaemonAnswers() -> Bool {
            (try? run("/usr/bin/pkcs11-tool", ["--module", module, "-L"]).status) == 0
        }
        if !slotDaemonAnswers() {
            let started = try run("/usr/sbin/pkcsslotd", [])
            guard started.status == 0 else { throw SoftwareTPMError("pkcsslotd: \(started.stderr)") }
            try waitUntil("pkcsslotd to answer", slotDaemonAnswers)
            if let pid = (try? String(contentsOfFile: "/var/run/pkcsslotd.pid", encoding: .utf8))
                .flatMap({ Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
                daemonized.append(pid)
            }
        }
        for args in [["--init-token", "--so-pin", "87654321", "--label", "kc"],
                     ["--init-pin", "--login", "--login-type", "so", "--so-pin", "87654321", "--pin", "1234"]] {
            let made = try run("/usr/bin/pkcs11-tool", ["--module", module, "--slot", "3"] + args)
            guard made.status == 0 else { throw SoftwareTPMError("pkcs11-tool \(args[0]): \(made.stderr)") }
        }
    }
    /// pkcsslotd forks into the background: ours to end, though not our child.
    private var daemonized: [pid_t] = []

}
