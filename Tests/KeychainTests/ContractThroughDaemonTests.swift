import Foundation
import Keychain
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// The contract suites, run again through keychaind: the same tests (not a copy), in a child run of
/// this test bundle with `KEYCHAIN_TEST_THROUGH_DAEMON=1`, where every `Fixture` and `SimulatedDevice`
/// serves its store with keychaind and calls it through the socket.
@Suite("The contract through keychaind", .offThePool)
struct ContractThroughDaemonTests {
    static let suites = ["SeedContractTests", "AccessibleLevelTests", "AccessControlTests", "OptionsTests", "VaultIntegrationTests",
                         "SeedLibraryTests", "SignInFlowTests"]

    @Test(arguments: suites)
    func suitePassesThroughTheDaemon(_ suite: String) throws {
        // Not inside the child run itself.
        guard ProcessInfo.processInfo.environment["KEYCHAIN_TEST_THROUGH_DAEMON"] != "1" else { return }
        let bundle = buildDirectory.appendingPathComponent("KeychainPackageTests.xctest").path
        let result = try run(bundle, ["--testing-library", "swift-testing", "--filter", suite],
                             environment: ["KEYCHAIN_TEST_THROUGH_DAEMON": "1"])
        let output = String(decoding: result.stdout, as: UTF8.self) + result.stderr
        #expect(result.status == 0, "\(suite) through keychaind:\n\(output.suffix(6000))")
        // A filter that matched nothing would pass without testing anything.
        #expect(output.contains("passed") && !output.contains("with 0 tests"), "\(suite): \(output.suffix(2000))")
        // A test that made its own in-process configuration passed without the daemon.
        let inProcess = output.split(separator: "\n").filter { $0.contains(SoftwareTPM.inProcessNotice) }
        #expect(inProcess.isEmpty, "\(suite) reached the keychain in-process in its run through keychaind: \(inProcess.prefix(5))")
    }

    /// The fixtures' daemon mode goes through the socket and nowhere else: the item lands under the
    /// caller's uid in the daemon's store (an in-process write would not name the uid), and with the
    /// socket gone every call fails as "not running" instead of reaching the store or the TPM itself.
    @Test(arguments: ["SimulatedDevice", "Fixture"])
    func theDaemonModeCallsOnlyThroughTheSocket(_ fixture: String) async throws {
        let configuration: KeychainConfiguration
        let daemon: KeychainDaemon
        let keep: Any
        if fixture == "Fixture" {
            let f = try Fixture(throughDaemon: true)
            (configuration, daemon, keep) = (f.configuration, try #require(f.daemon), f)
        } else {
            let d = try await SimulatedDevice(passcode: bytes("2468"), fingers: ["thumb"], throughDaemon: true)
            (configuration, daemon, keep) = (d.configuration, try #require(d.daemon), d)
            #expect(d.storeService("svc") == KeychainDaemon.storeService("svc"))
        }
        defer { withExtendedLifetime(keep) {} }
        #expect(configuration.daemonSocket == daemon.socket)
        let storage = try createKeychain(.init(service: "svc", accessible: .always), configuration: configuration)
        let device = KeychainDevice(configuration: configuration)
        try await storage.setItem("k", "v")
        let store = try Store(directory: daemon.store)
        #expect(try store.hasItem(service: KeychainDaemon.storeService("svc"), key: "k"))
        #expect(try !store.hasItem(service: "svc", key: "k"))

        daemon.kill()
        // The harness keeps the listening socket for a restart (a caller would wait for the next
        // daemon): without its name nothing answers.
        #expect(unlink(daemon.socket) == 0)
        let calls: [(String, () async throws -> Void)] = [
            ("setItem", { try await storage.setItem("k", "w") }), ("getItem", { _ = try await storage.getItem("k") }),
            ("hasItem", { _ = try await storage.hasItem("k") }), ("removeItem", { try await storage.removeItem("k") }),
            ("getAllKeys", { _ = try await storage.getAllKeys() }), ("getItemInfo", { _ = try await storage.getItemInfo("k") }),
            ("clear", { try await storage.clear() }), ("status", { _ = try await device.status() }),
            ("lock", { try await device.lock() }), ("unlock", { try await device.unlock(passcode: bytes("2468")) }),
            ("enrolledFingers", { _ = try await device.enrolledFingers() }),
            ("setPasscode", { try await device.setPasscode(bytes("1357")) }),
            ("enrollFinger", { try await device.enrollFinger("index", passcode: bytes("2468")) }),
        ]
        for (name, call) in calls {
            do {
                try await call()
                Issue.record("\(name) succeeded without the daemon")
            } catch let error as KeychainError {
                #expect(error.code == .hardwareUnavailable && error.message.contains("not running"), "\(name): \(error)")
            }
        }
        #expect(try store.item(service: KeychainDaemon.storeService("svc"), key: "k") != nil, "the item is untouched")
    }
}
