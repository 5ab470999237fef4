import Foundation
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// keychaind makes a storage per request; its engine (the store's thread, database and the keys it
/// opened) must live for the daemon, not for one request (issue 9, item 6: engines end with their
/// last storage or device).
@Suite(.offThePool) struct DaemonEngineTests {
    @Test func theDaemonKeepsAKeyItOpenedBetweenRequests() throws {
        let tpm = try SoftwareTPM()
        let daemon = try KeychainDaemon(tpm: tpm, reader: tpm.directory + "/reader")
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        func ctl(_ args: [String], input: String = "") throws -> (status: Int32, out: String) {
            let result = try run(keychainctl, args, input: Array(input.utf8), environment: daemon.environment)
            return (result.status, String(decoding: result.stdout, as: UTF8.self))
        }
        #expect(try ctl(["set", "mail", "token"], input: "kept").status == 0)
        #expect(try ctl(["get", "mail", "token"]).out == "kept")
        // The sealed key in the store is spoilt: only the key the daemon opened before still opens it.
        let spoil = try run("/usr/bin/python3", ["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                                                 + "c.execute(\"UPDATE wrapping_keys SET sealed_private = x'00'\"); c.commit()",
                                                 daemon.store + "/keychain.db"])
        #expect(spoil.status == 0, "\(spoil.stderr)")
        #expect(try ctl(["get", "mail", "token"]).out == "kept", "a second request reads with the daemon's kept key")
    }
}
