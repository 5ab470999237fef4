import Foundation
import KeychainTestSupport
import Testing

extension DaemonUserTests {
    /// Through the daemon a message names the service as the caller wrote it, as in-process: never
    /// the daemon's namespace before it ("uid:0/mail"). The store is edited (a flipped ciphertext
    /// byte) so the read's DATA_CORRUPTED message names the item's service.
    @Test func messagesNameTheCallersServiceWithoutTheDaemonsNamespace() throws {
        #expect(try ctl(["set", "mail", "token"], input: "root's").status == 0)
        let edit = try run("/usr/bin/python3", ["-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                                                + "c.execute(\"UPDATE items SET ciphertext = zeroblob(length(ciphertext))\"); c.commit()",
                                                daemon.store + "/keychain.db"])
        #expect(edit.status == 0, "\(edit.stderr)")
        let read = try ctl(["--json", "get", "mail", "token"])
        #expect(read.out.contains("DATA_CORRUPTED"), "\(read.out) \(read.err)")
        #expect(read.out.contains("'mail'") && !read.out.contains("uid:"), "\(read.out)")
    }
}
