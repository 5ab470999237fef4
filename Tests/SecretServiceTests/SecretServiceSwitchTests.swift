import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// `keychainctl secret-service enable` / `disable` on a session bus that activates from the user's and
/// the system's directories, as a desktop's does, with gnome-keyring installed: activation starts
/// gnome-keyring, after enable keychain-secret-service, after disable gnome-keyring again; disable
/// removes exactly what enable wrote.
@Suite(.serialized, .offThePool) struct SecretServiceSwitchTests {
    static let gnomeKeyringService = "/usr/share/dbus-1/services/org.freedesktop.secrets.service"
    static let full = buildDirectory.appendingPathComponent("keychainctl-full").path

    let bus: PrivateBus
    let home: String
    let session: [String: String]

    init() throws {
        try PrivateBus.require(GnomeKeyring.daemon, "gnome-keyring")
        try #require(FileManager.default.fileExists(atPath: Self.gnomeKeyringService), "gnome-keyring's activation file is missing: apt-get install gnome-keyring")
        try PrivateBus.requirePython(module: "dbus", package: "python3-dbus")
        let tpm = try SoftwareTPM()
        home = tpm.directory + "/home"
        for directory in [home, home + "/run"] { try #require(mkdir(directory, 0o700) == 0) }
        // The user's session: XDG_DATA_DIRS holds gnome-keyring's installed file; the provider (no
        // arguments, as the package's files start it) finds its store in the environment.
        session = ["HOME": home, "XDG_DATA_HOME": home + "/.local/share", "XDG_CONFIG_HOME": home + "/.config",
                   "XDG_DATA_DIRS": "/usr/local/share:/usr/share", "XDG_RUNTIME_DIR": home + "/run",
                   "KEYCHAIN_STORE": tpm.directory + "/store", "KEYCHAIN_TCTI": tpm.tcti]
        bus = try PrivateBus(tpm: tpm, environment: session, standardServiceDirectories: true)
    }

    /// Has the bus start org.freedesktop.secrets; the started program's name (`comm`), which is then stopped.
    func activated() throws -> String {
        _ = try bus.python("""
            import dbus
            d = dbus.Interface(dbus.SessionBus().get_object('org.freedesktop.DBus', '/org/freedesktop/DBus'), 'org.freedesktop.DBus')
            d.StartServiceByName('org.freedesktop.secrets', dbus.UInt32(0))
            """, environment: session)
        let pid = try #require(try bus.ownerPID())
        let comm = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        kill(pid, SIGTERM)
        try waitUntil("org.freedesktop.secrets' owner to exit") { try bus.ownerPID() == nil }
        return comm
    }

    func keychainctl(_ args: [String]) throws -> ChildResult { try bus.run(Self.full, args, environment: session) }

    var written: [String] {
        [home + "/.local/share/dbus-1/services/org.freedesktop.secrets.service",
         home + "/.config/systemd/user/gnome-keyring-daemon.service.d/keychain-secret-service.conf",
         home + "/.config/autostart/gnome-keyring-secrets.desktop"]
    }

    @Test func enableMakesActivationStartTheProviderAndDisableGivesTheNameBackToGnomeKeyring() throws {
        #expect(try activated() == "gnome-keyring-d")
        // A file of the user's own beside enable's: disable leaves it.
        let own = home + "/.local/share/dbus-1/services/org.example.Own.service"
        try FileManager.default.createDirectory(atPath: home + "/.local/share/dbus-1/services", withIntermediateDirectories: true)
        try "[D-BUS Service]\nName=org.example.Own\nExec=/bin/false\n".write(toFile: own, atomically: true, encoding: .utf8)

        let enable = try keychainctl(["secret-service", "enable"])
        #expect(enable.status == 0, "\(enable.stderr)")
        for path in written { #expect(FileManager.default.fileExists(atPath: path), "enable wrote \(path)") }
        let override = try String(contentsOfFile: written[0], encoding: .utf8)
        #expect(override.contains("Exec=\(PrivateBus.provider)\n"), "\(override)")
        #expect(String(decoding: try keychainctl(["secret-service", "status"]).stdout, as: UTF8.self).hasPrefix("secret-service: enabled\n"))
        // Enabled twice is the same switch.
        #expect(try keychainctl(["secret-service", "enable"]).status == 0)

        #expect(try activated() == "keychain-secret")
        #expect(try bus.run(PrivateBus.secretTool, ["store", "--label=s", "switch", "on"], input: Array("switched".utf8), environment: session).status == 0)
        #expect(try bus.run(PrivateBus.secretTool, ["lookup", "switch", "on"], environment: session).stdout == Array("switched".utf8))
        let provider = try #require(try bus.ownerPID())
        kill(provider, SIGTERM)
        try waitUntil("the provider to exit") { try bus.ownerPID() == nil }

        let disable = try keychainctl(["secret-service", "disable"])
        #expect(disable.status == 0, "\(disable.stderr)")
        for path in written { #expect(!FileManager.default.fileExists(atPath: path), "disable removed \(path)") }
        #expect(!FileManager.default.fileExists(atPath: home + "/.config/systemd/user/gnome-keyring-daemon.service.d"))
        #expect(FileManager.default.fileExists(atPath: own), "disable left the user's own file")
        #expect(try activated() == "gnome-keyring-d")
    }

    @Test func enableRefusesToReplaceAFileItDidNotWriteAndDisableKeepsIt() throws {
        let autostart = written[2]
        try FileManager.default.createDirectory(atPath: home + "/.config/autostart", withIntermediateDirectories: true)
        let mine = "[Desktop Entry]\nType=Application\nName=Mine\nExec=/bin/true\n"
        try mine.write(toFile: autostart, atomically: true, encoding: .utf8)
        let refused = try keychainctl(["secret-service", "enable"])
        #expect(refused.status == 3)
        #expect(refused.stderr.contains("\(autostart) exists and was not written by enable"), "\(refused.stderr)")
        #expect(!FileManager.default.fileExists(atPath: written[0]), "nothing written when one file is refused")
        let disable = try keychainctl(["secret-service", "disable"])
        #expect(disable.status == 0)
        #expect(try String(contentsOfFile: autostart, encoding: .utf8) == mine)
        #expect(try keychainctl(["secret-service", "start"]).status == 2)
        #expect(try activated() == "gnome-keyring-d")
    }
}
