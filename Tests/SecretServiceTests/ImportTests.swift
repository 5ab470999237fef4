import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// `keychain-secret-service --import` from a real gnome-keyring-daemon that owns the name on a
/// private bus: its locked `login` collection is unlocked through its own prompt (gcr's prompter on
/// an Xvfb display, the password typed with xdotool), every item comes over, and a second run writes
/// nothing again. Secrets reach the scripts on stdin, never in argv.
@Suite(.serialized, .offThePool) struct ImportTests {
    @Test func importBringsEveryItemOfALockedGnomeKeyringCollectionThroughItsPromptAndOnlyOnce() throws {
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        let screen = try TestDisplay()
        let bus = try PrivateBus(display: screen)
        var keyring: GnomeKeyring? = try GnomeKeyring(on: bus, password: "gk-login")
        _ = try bus.python("""
            import sys, secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.Collection(conn, '/org/freedesktop/secrets/collection/login')
            a, b = sys.stdin.buffer.read().split(b'\\n')
            coll.create_item('Mail', {'service': 'mail', 'user': 'alice'}, a, content_type='text/plain')
            coll.create_item('Mail again', {'service': 'mail', 'user': 'alice'}, b)
            coll.create_item('Empty', {'kind': 'empty'}, b'')
            coll.lock()
            assert coll.is_locked()
            """, input: Array("first\u{0}secret\nsecond".utf8))

        func runImport(typing password: String?) throws -> (status: Int32, stdout: String) {
            let out = bus.directory + "/import.out"
            let file = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            var environment = ProcessInfo.processInfo.environment
            environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address
            let log = open(bus.directory + "/bus.log", O_WRONLY | O_APPEND | O_CLOEXEC)
            let pid = try #require(Processes.spawn(PrivateBus.provider, [PrivateBus.provider, "--store", bus.store, "--tcti", bus.tpm.tcti, "--import"],
                                                   environment: environment, stdout: file, stderr: log))
            close(file)
            close(log)
            if let password {
                let typed = try screen.type(password, into: "Unlock")
                #expect(typed.status == 0, "\(typed.stderr)")
            }
            let status = Processes.wait(pid)
            return (status, (try? String(contentsOfFile: out, encoding: .utf8)) ?? "")
        }

        var first: (status: Int32, stdout: String) = (-1, "")
        // The whole bus while the import runs: the secrets crossed it only in the DH session.
        let capture = try bus.captured { first = try runImport(typing: "gk-login") }
        #expect(capture.range(of: Data("first\u{0}secret".utf8)) == nil && capture.range(of: Data("second".utf8)) == nil,
                "a secret crossed the bus in clear")
        #expect(first.status == 0, "\(bus.log)")
        #expect(first.stdout.contains("imported 3 items of 1 collections"), "\(first.stdout)")
        let again = try runImport(typing: nil)
        #expect(again.status == 0, "\(bus.log)")
        #expect(again.stdout.contains("imported 0 items of 1 collections"), "\(again.stdout)")
        #expect(again.stdout.contains("3 were here already"), "\(again.stdout)")

        keyring = nil
        try waitUntil("gnome-keyring to leave the name") { try bus.ownerPID() == nil }
        // Our provider, activated on the store the import wrote: every attribute came, gnome-keyring's xdg:schema too.
        let out = try bus.python("""
            import secretstorage
            conn = secretstorage.dbus_init()
            coll = secretstorage.get_default_collection(conn)
            items = sorted(coll.get_all_items(), key=lambda i: i.get_label())
            for i in items:
                print(i.get_label(), sorted(i.get_attributes().items()), i.get_secret(), i.get_secret_content_type())
            """)
        #expect(out == """
            Empty [('kind', 'empty'), ('xdg:schema', 'org.freedesktop.Secret.Generic')] b'' text/plain
            Mail [('service', 'mail'), ('user', 'alice'), ('xdg:schema', 'org.freedesktop.Secret.Generic')] b'first\\x00secret' text/plain
            Mail again [('service', 'mail'), ('user', 'alice'), ('xdg:schema', 'org.freedesktop.Secret.Generic')] b'second' text/plain

            """, "\(out)")
        _ = keyring
    }
}
