import Foundation
import KeychainTestSupport
import Testing

extension TokenBackendTests {
    /// A token item read through another token (its key is not there): the message names the
    /// service as the caller wrote it, never the store's internal token namespace ("svc@strongbox").
    @Test func aTokenItemsErrorsNameItsServiceWithoutTheInternalNamespace() throws {
        let t = try Token()
        let made = try run("/usr/bin/softhsm2-util", ["--init-token", "--free", "--label", "other", "--so-pin", "12345678", "--pin", "1234"],
                           environment: t.env)
        #expect(made.status == 0, "softhsm2-util: \(made.stderr)")
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("v".utf8)).status == 0)
        let read = try t.cli(["--json", "get", "svc", "k"], uri: t.uri(label: "other"))
        #expect(read.status != 0)
        let message = t.errorMessage(read)
        #expect(message.contains("'svc'") && !message.contains("@strongbox"), "\(message)")
    }
}
