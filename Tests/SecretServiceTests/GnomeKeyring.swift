import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// A real gnome-keyring-daemon (the secrets component only) on a test's private bus, its keyrings in a
/// home of its own: the `login` keyring is made, or unlocked, with `password` (given on its stdin, as
/// PAM gives it). `deinit` stops it.
final class GnomeKeyring {
    static let daemon = "/usr/bin/gnome-keyring-daemon"
    let pid: pid_t
    let home: String

    init(on bus: PrivateBus, password: String) throws {
        try PrivateBus.require(Self.daemon, "gnome-keyring")
        home = bus.directory + "/gnome-keyring-home"
        for directory in [home, home + "/run", home + "/data", home + "/config"] where !FileManager.default.fileExists(atPath: directory) {
            guard mkdir(directory, 0o700) == 0 else { throw SoftwareTPMError("mkdir \(directory): errno \(errno)") }
        }
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home
        environment["XDG_RUNTIME_DIR"] = home + "/run"
        environment["XDG_DATA_HOME"] = home + "/data"
        environment["XDG_CONFIG_HOME"] = home + "/config"
        environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address
        environment["DISPLAY"] = nil
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw SoftwareTPMError("pipe: errno \(errno)") }
        let log = open(bus.directory + "/bus.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        defer { close(log) }
        let started = Processes.spawn(Self.daemon, [Self.daemon, "--foreground", "--components=secrets", "--unlock"],
                                      environment: environment, stdin: ends[0], stderr: log)
        close(ends[0])
        _ = Array(password.utf8).withUnsafeBytes { write(ends[1], $0.baseAddress!, $0.count) }
        close(ends[1])
        guard let started else { throw SoftwareTPMError("cannot start gnome-keyring-daemon: errno \(errno)") }
        pid = started
        try waitUntil("gnome-keyring-daemon to own org.freedesktop.secrets") { try bus.ownerPID() == started }
    }

    deinit {
        kill(pid, SIGTERM)
        _ = Processes.wait(pid)
    }
}

extension PrivateBus {
    /// The pid of org.freedesktop.secrets' owner on this bus; nil when no one owns it (asking does not activate).
    func ownerPID() throws -> pid_t? {
        let out = try python("""
            import dbus
            d = dbus.Interface(dbus.SessionBus().get_object('org.freedesktop.DBus', '/org/freedesktop/DBus'), 'org.freedesktop.DBus')
            print(d.GetConnectionUnixProcessID('org.freedesktop.secrets') if d.NameHasOwner('org.freedesktop.secrets') else '')
            """)
        return pid_t(out.trimmingCharacters(in: .whitespacesAndNewlines))
    }
}
