import Foundation
import Keychain
import KeychainTestThreads
import Testing

/// Who owns org.freedesktop.secrets: a second provider says who and exits 3; with `--replace` it takes
/// the name and the first one exits saying so.
@Suite(.serialized, .offThePool) struct NameOwnershipTests {
    let bus: PrivateBus

    init() throws {
        try PrivateBus.require(PrivateBus.secretTool, "libsecret-tools")
        bus = try PrivateBus()
    }

    @Test func aSecondProviderNamesTheOwnerAndExitsUnlessItReplacesIt() throws {
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=o", "owner", "first"], input: Array("one".utf8)).status == 0)
        let first = try #require(bus.providerPIDs().first)
        // Its own store on the embedded TPM: the private swtpm serves one connection, the first provider's.
        let other = bus.directory + "/other-store"
        defer {
            if let pid = (try? String(contentsOfFile: other + "/swtpm/swtpm.pid", encoding: .utf8)).flatMap({ pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
                kill(pid, SIGTERM)
            }
        }
        let refused = try bus.run(PrivateBus.provider, ["--store", other])
        #expect(refused.status == 3)
        #expect(refused.stderr.contains("org.freedesktop.secrets is owned by pid \(first)"), "\(refused.stderr)")
        #expect(refused.stderr.contains("--replace"))

        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address
        let replacement = try #require(Processes.spawn(PrivateBus.provider, [PrivateBus.provider, "--store", other, "--replace"], environment: environment))
        var replacementRuns = true
        defer {
            if replacementRuns {
                kill(replacement, SIGTERM)
                _ = Processes.wait(replacement)
            }
        }
        try waitUntil("the first provider to exit when the name was taken") { kill(first, 0) != 0 }
        #expect(kill(first, 0) != 0, "the first provider exited when the name was taken")
        // The replacement serves its own (empty) store.
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "owner", "first"]).status != 0)
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=o", "owner", "second"], input: Array("two".utf8)).status == 0)
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "owner", "second"]).stdout == Array("two".utf8))
        // SIGTERM ends it cleanly, its store closed (a handler isolated to the main actor died of SIGILL: 132).
        kill(replacement, SIGTERM)
        replacementRuns = false
        #expect(Processes.wait(replacement) == 0)
    }

    /// gnome-keyring asks for the name without ALLOW_REPLACEMENT: `--replace` cannot take it, and says so.
    @Test func replaceNamesAnOwnerThatDoesNotAllowReplacementAndExits3() throws {
        let keyring = try GnomeKeyring(on: bus, password: "gk-login")
        let other = bus.directory + "/other-store"
        defer {
            if let pid = (try? String(contentsOfFile: other + "/swtpm/swtpm.pid", encoding: .utf8)).flatMap({ pid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
                kill(pid, SIGTERM)
            }
        }
        let refused = try bus.run(PrivateBus.provider, ["--store", other, "--replace"])
        #expect(refused.status == 3)
        #expect(refused.stderr.contains("org.freedesktop.secrets is owned by pid \(keyring.pid) (gnome-keyring-d)"), "\(refused.stderr)")
        #expect(refused.stderr.contains("does not allow another provider to replace it"), "\(refused.stderr)")
        #expect(!refused.stderr.contains("pass --replace"), "\(refused.stderr)")
        #expect(try bus.ownerPID() == keyring.pid, "gnome-keyring still owns the name")
    }
}
