import Foundation
import Keychain
import Testing

/// The contract suites, run again through keychaind: the same tests (not a copy), in a child run of
/// this test bundle with `KEYCHAIN_TEST_THROUGH_DAEMON=1`, where every `Fixture` and `SimulatedDevice`
/// serves its store with keychaind and calls it through the socket.
@Suite("The contract through keychaind")
struct ContractThroughDaemonTests {
    static let suites = ["AccessibleLevelTests", "AccessControlTests", "OptionsTests", "VaultIntegrationTests", "SignInFlowTests"]

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
    }
}
