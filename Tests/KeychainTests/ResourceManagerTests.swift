import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Synchronization
import Testing

/// The TPM shared as on a device (issue 39 item 4): the keychain reaches it through a resource manager
/// (tpm2-abrmd standing in for the kernel's `/dev/tpmrm0`, with the kernel's 3 objects and 3 sessions
/// per client) on a chip with the typical SPI part's times, while tpm2-tools and a second keychain
/// process use the same TPM. Every child has a deadline (`runChild`), so a hang is a failure.
@Suite("Sharing the TPM through a resource manager", .offThePool)
struct ResourceManagerTests {
    static let ctl = buildDirectory.appendingPathComponent("keychainctl").path
    static let passcode = "2468"

    /// keychainctl on its own store in this process's child, through the resource manager.
    static func cli(_ broker: ResourceManager, store: String, _ args: [String], input: String = "") throws -> ChildResult {
        try run(ctl, ["--store", store, "--tcti", broker.tcti, "--reader", "none"] + args, input: Array(input.utf8),
                environment: broker.environment)
    }

    /// A loop on a thread of its own until `stop()`: rounds it finished and what failed.
    final class Hammer: Sendable {
        private let state = Mutex((stopping: false, rounds: 0, failures: [String]()))
        private let done = DispatchSemaphore(value: 0)

        init(_ name: String, round: @escaping @Sendable (Int) throws -> [String]) {
            Thread.detachNewThread { [self] in
                var index = 0
                while !state.withLock({ $0.stopping }) {
                    let failed = (try? round(index)) ?? ["\(name) round \(index): a child could not start"]
                    state.withLock { $0.rounds += 1; $0.failures += failed.map { "\(name): \($0)" } }
                    index += 1
                }
                done.signal()
            }
        }

        /// Stops after the round under way (so a hammer that began before the test's work overlapped it).
        func stop() -> (rounds: Int, failures: [String]) {
            state.withLock { $0.stopping = true }
            done.wait()
            return state.withLock { ($0.rounds, $0.failures) }
        }
    }

    /// tpm2-tools as another program on the device would use them: random bytes, PCR reads, a primary
    /// key and a child key made and loaded (their contexts in files, flushed by the resource manager
    /// when each tool exits).
    static func tools(_ broker: ResourceManager) -> Hammer {
        let dir = broker.directory
        return Hammer("tpm2-tools") { round in
            let steps: [(String, [String])] = [
                ("tpm2_getrandom", ["--hex", "16"]),
                ("tpm2_pcrread", ["sha256:0,7"]),
                ("tpm2_createprimary", ["-Q", "-C", "o", "-G", "ecc", "-c", dir + "/primary.ctx"]),
                ("tpm2_create", ["-Q", "-C", dir + "/primary.ctx", "-G", "ecc", "-u", dir + "/key.pub", "-r", dir + "/key.priv"]),
                ("tpm2_load", ["-Q", "-C", dir + "/primary.ctx", "-u", dir + "/key.pub", "-r", dir + "/key.priv", "-c", dir + "/key.ctx"]),
            ]
            return try steps.compactMap { tool, args in
                let done = try run("/usr/bin/" + tool, args, environment: broker.environment)
                return done.status == 0 ? nil : "round \(round) \(tool): \(done.stderr)"
            }
        }
    }

    /// A second keychain: keychainctl processes on a store of their own, each read cold (a new process);
    /// every third round a read is killed part way, as a device's programs are.
    static func secondKeychain(_ broker: ResourceManager, store: String) -> Hammer {
        Hammer("second keychain") { round in
            let level = ["whenUnlockedThisDeviceOnly", "afterFirstUnlock", "afterFirstUnlockThisDeviceOnly"][round % 3]
            let value = "second \(round)"
            var failed: [String] = []
            let set = try cli(broker, store: store, ["set", "second.\(round % 3)", "k\(round)", "--accessible", level], input: value)
            if set.status != 0 { failed.append("round \(round) set: \(set.stderr)") }
            let got = try cli(broker, store: store, ["get", "second.\(round % 3)", "k\(round)"])
            if got.status != 0 || got.stdout != Array(value.utf8) { failed.append("round \(round) get: \(got.stderr)") }
            if round % 3 == 2 {
                guard let pid = Processes.spawn(ctl, [ctl, "--store", store, "--tcti", broker.tcti, "--reader", "none", "get", "second.0", "k0"],
                                                environment: ProcessInfo.processInfo.environment.merging(broker.environment) { $1 })
                else { return failed + ["round \(round): cannot start a get to kill"] }
                usleep(UInt32.random(in: 0...150_000))
                kill(pid, SIGKILL)
                _ = Processes.wait(pid)
            }
            return failed
        }
    }

    /// The TPM's own handles, asked without the resource manager: the sessions it keeps for its clients
    /// are loaded or saved sessions there (its clients' objects it keeps as contexts of its own).
    static func sessionsInTheTPM(_ tpm: SoftwareTPM) throws -> String {
        try ["handles-loaded-session", "handles-saved-session"].map { capability in
            let listed = try run("/usr/bin/tpm2_getcap", [capability], environment: ["TPM2TOOLS_TCTI": tpm.tcti])
            return String(decoding: listed.stdout, as: UTF8.self) + listed.stderr
        }.joined()
    }

    @Test func keychaindThroughTheResourceManagerServesEveryLevelWhileToolsAndAnotherKeychainUseTheTPM() async throws {
        let tpm = try SoftwareTPM(profile: .typicalSPI)
        let broker = try ResourceManager(tpm: tpm)
        let (store, second) = (tpm.directory + "/store", tpm.directory + "/second")
        for dir in [store, second] {
            let made = try Self.cli(broker, store: dir, ["init", "--allow-empty-owner-auth"])
            #expect(made.status == 0, "\(made.stderr)")
        }
        let daemon = try KeychainDaemon(tpm: tpm, store: store, environment: broker.environment, tcti: broker.tcti)
        let answers = ScriptedAuthenticator()
        let configuration = daemon.configuration(authenticator: answers)
        let device = KeychainDevice(configuration: configuration)
        try await device.setPasscode(bytes(Self.passcode))

        let hammers = [Self.tools(broker), Self.secondKeychain(broker, store: second)]
        let levels: [Accessible] = [.afterFirstUnlock, .whenUnlocked, .afterFirstUnlockThisDeviceOnly,
                                    .whenUnlockedThisDeviceOnly, .whenPasscodeSetThisDeviceOnly]
        func storage(_ level: Accessible, _ control: AccessControl = .none) throws -> Keychain {
            try createKeychain(.init(service: "rm.\(level.rawValue).\(control.rawValue)", accessible: level, accessControl: control),
                               configuration: configuration)
        }
        for round in 0..<2 {
            for level in levels { try await storage(level).setItem("k\(round)", "\(level.rawValue) \(round)") }
            try await storage(.whenUnlockedThisDeviceOnly, .passcode).setItem("k\(round)", "behind the passcode \(round)")
            await device.dropCaches()  // each read unseals in the TPM again
            for level in levels {
                #expect(try await storage(level).getItem("k\(round)") == "\(level.rawValue) \(round)")
            }
            answers.push(.passcode(bytes(Self.passcode)))
            #expect(try await storage(.whenUnlockedThisDeviceOnly, .passcode).getItem("k\(round)") == "behind the passcode \(round)")
        }
        let results = hammers.map { $0.stop() }
        for result in results {
            #expect(result.rounds > 0)
            #expect(result.failures == [])
        }
        // keychaind still runs with its connection kept: between operations it holds no session but, on
        // a chip (this profile), the salted one it keeps for the Unseals (docs/daemon.md, "On a chip").
        // (What a killed client's command had loaded, the resource manager flushes once that command's answer came.)
        let kept = daemon.logLines(containing: "a salted session is kept") > 0
        #expect(kept, "keychaind took the typical profile for a chip")
        var left = ""
        #expect(throws: Never.self) {
            try waitUntil("keychaind to hold no session in the TPM but its kept one", seconds: 30) {
                left = try Self.sessionsInTheTPM(tpm)
                return left.split(separator: "\n").count <= (kept ? 1 : 0)
            }
        }
        #expect(left.split(separator: "\n").count <= (kept ? 1 : 0), "\(left)")
    }

    @Test func readsKilledMidCommandThroughTheResourceManagerLeaveNothingBehind() throws {
        let tpm = try SoftwareTPM(profile: .typicalSPI)
        let broker = try ResourceManager(tpm: tpm)
        let store = tpm.directory + "/store"
        #expect(try Self.cli(broker, store: store, ["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try Self.cli(broker, store: store, ["set", "svc", "k", "--accessible", "whenUnlockedThisDeviceOnly"], input: "v").status == 0)
        for round in 0..<20 {
            guard let pid = Processes.spawn(Self.ctl, [Self.ctl, "--store", store, "--tcti", broker.tcti, "--reader", "none", "get", "svc", "k"],
                                            environment: ProcessInfo.processInfo.environment.merging(broker.environment) { $1 })
            else { throw SoftwareTPMError("cannot start get") }
            usleep(UInt32(round) * 15_000)
            kill(pid, SIGKILL)
            _ = Processes.wait(pid)
        }
        // What a killed client's command had loaded, the resource manager flushes once that command's answer came.
        var left = ""
        #expect(throws: Never.self) {
            try waitUntil("the resource manager to flush what killed clients left", seconds: 30) {
                left = try Self.sessionsInTheTPM(tpm)
                return left == ""
            }
        }
        #expect(left == "", "\(left)")
        let got = try Self.cli(broker, store: store, ["get", "svc", "k"])
        #expect(got.status == 0 && got.stdout == Array("v".utf8), "\(got.stderr)")
    }

    /// A resource manager that allows a client fewer sessions than the keychain holds at once (init's
    /// rollback counter takes two) is named as such; it used to read "Lost the connection to the TPM".
    @Test func aResourceManagerThatAllowsTooFewSessionsIsNamedNotTakenForALostConnection() throws {
        let tpm = try SoftwareTPM()
        let broker = try ResourceManager(tpm: tpm, maxSessions: 1)
        let made = try Self.cli(broker, store: tpm.directory + "/store", ["init", "--allow-empty-owner-auth"])
        #expect(made.status != 0)
        #expect(made.stderr.contains("HARDWARE_UNAVAILABLE: The TPM's resource manager allows this process fewer sessions at once"), "\(made.stderr)")
        #expect(made.stderr.contains("--max-sessions") && !made.stderr.contains("Lost the connection"), "\(made.stderr)")
    }
}
