import Foundation
import KeychainTestSupport
import Testing

extension TokenBackendTests {
    /// A token item replaced by a TPM write, then the service cleared: the service's object on the
    /// token goes too, though no token key of the service is left in the store to say it is there.
    @Test func clearAfterATokenItemWasReplacedLeavesNoObjectOnTheToken() throws {
        let t = try Token()
        #expect(try t.cli(["set", "svc", "k", "--key-storage", "strongbox"], input: Array("on the token".utf8)).status == 0)
        #expect(try t.objects().contains("keychain:svc"))
        #expect(try t.cli(["set", "svc", "k"], input: Array("in the TPM".utf8)).status == 0)
        #expect(try t.cli(["clear", "svc"]).status == 0)
        #expect(!(try t.objects()).contains("keychain:svc"), "an orphaned token object")
    }
}
