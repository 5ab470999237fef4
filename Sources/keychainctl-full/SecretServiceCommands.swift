import DBus
import Glibc
import Keychain
import KeychainBasics
import KeychainCLIText

/// `secret-service enable|disable|status`: which program the user's session starts for
/// org.freedesktop.secrets, keychain-secret-service or gnome-keyring (docs/secret-service.md,
/// "Switching from gnome-keyring"). Only files in the user's own directories, each marked as enable's;
/// `disable` removes those and nothing else.
struct SecretServiceSwitch {
    /// The first line of every file enable writes: what disable removes, and enable may rewrite.
    static let marker = "# Written by `keychainctl secret-service enable`; `keychainctl secret-service disable` removes it."

    struct File {
        let path: String
        let contents: String
        /// What the file does, for the report.
        let purpose: String
    }

    let files: [File]

    /// The files for the user of `environment` (HOME, XDG_DATA_HOME, XDG_CONFIG_HOME as the bus, systemd
    /// and the desktop read them), the provider at `provider`, with its user unit when `unit` (installed).
    init(environment: (String) -> String?, provider: String, unit: Bool) throws(KeychainError) {
        guard let home = environment("HOME"), home.hasPrefix("/") else {
            throw KeychainError.invalidArgument("HOME is not set to an absolute path: the switch is made in the user's own directories")
        }
        func base(_ name: String, _ fallback: String) -> String {
            environment(name).flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home + fallback
        }
        let data = base("XDG_DATA_HOME", "/.local/share"), config = base("XDG_CONFIG_HOME", "/.config")
        files = [
            File(path: data + "/dbus-1/services/org.freedesktop.secrets.service", contents: """
                \(Self.marker)
                # The session bus reads this directory before /usr/share/dbus-1/services: it starts
                # keychain-secret-service for org.freedesktop.secrets, not gnome-keyring.
                [D-BUS Service]
                Name=org.freedesktop.secrets
                Exec=\(provider)
                \(unit ? "SystemdService=keychain-secret-service.service\n" : "")
                """, purpose: "D-Bus activation starts keychain-secret-service"),
            File(path: config + "/systemd/user/gnome-keyring-daemon.service.d/keychain-secret-service.conf", contents: """
                \(Self.marker)
                # gnome-keyring's user unit (started at login through its socket) keeps its PKCS#11 component
                # and leaves org.freedesktop.secrets alone.
                [Service]
                ExecStart=
                ExecStart=/usr/bin/gnome-keyring-daemon --foreground --components=pkcs11 --control-directory=%t/keyring

                """, purpose: "gnome-keyring's user unit runs without its secrets component"),
            File(path: config + "/autostart/gnome-keyring-secrets.desktop", contents: """
                \(Self.marker)
                # Hides the desktop's autostart entry that starts gnome-keyring's secrets component at login.
                [Desktop Entry]
                Type=Application
                Name=Secret Storage Service
                Hidden=true

                """, purpose: "the desktop does not start gnome-keyring's secrets component at login"),
        ]
    }

    enum State: Equatable { case absent, ours, foreign }

    static func state(of path: String) throws(KeychainError) -> State {
        guard let contents = try read(path) else { return .absent }
        return contents.hasPrefix(marker + "\n") ? .ours : .foreign
    }

    /// Writes every file (rewriting enable's own); refuses, before writing any, when one is the user's own.
    func enable() throws(KeychainError) -> [File] {
        for file in files where try Self.state(of: file.path) == .foreign {
            throw KeychainError(.unsupported, "\(file.path) exists and was not written by enable: move it away (or remove it) and enable again")
        }
        for file in files { try Self.write(file.contents, to: file.path) }
        return files
    }

    /// Removes the files enable wrote (and the unit's drop-in directory when that leaves it empty); the
    /// user's own files at those paths stay. Returns what was removed and what was left.
    func disable() throws(KeychainError) -> (removed: [File], kept: [File]) {
        var removed: [File] = [], kept: [File] = []
        for file in files {
            switch try Self.state(of: file.path) {
            case .absent: continue
            case .foreign: kept.append(file)
            case .ours:
                guard unlink(file.path) == 0 else { throw KeychainError(.storageError, "Cannot remove \(file.path)", underlying: .errno(errno)) }
                removed.append(file)
            }
        }
        for file in removed where file.path.hasSuffix(".service.d/keychain-secret-service.conf") {
            _ = rmdir(String(file.path.dropLast("/keychain-secret-service.conf".count)))  // only when empty
        }
        return (removed, kept)
    }

    /// The file's text, nil when there is none.
    static func read(_ path: String) throws(KeychainError) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw KeychainError(.storageError, "Cannot read \(path)", underlying: .errno(errno))
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while bytes.count < 1 << 20 {
            let result = valueOrErrno { chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) } }
            guard case .success(let n) = result, n > 0 else { break }
            bytes += chunk[..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Writes `contents` to `path` whole (a temporary file renamed over it), making its directories.
    static func write(_ contents: String, to path: String) throws(KeychainError) {
        var directory = ""
        for part in path.split(separator: "/").dropLast() {
            directory += "/" + part
            guard mkdir(directory, 0o755) == 0 || errno == EEXIST else {
                throw KeychainError(.storageError, "Cannot make \(directory)", underlying: .errno(errno))
            }
        }
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw KeychainError(.storageError, "Cannot write \(temporary)", underlying: .errno(errno)) }
        let bytes = Array(contents.utf8)
        var offset = 0
        while offset < bytes.count,
              case .success(let n) = valueOrErrno({ bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) } }),
              n > 0 {
            offset += n
        }
        let failure = offset < bytes.count || fsync(fd) != 0 ? errno : 0
        close(fd)
        guard failure == 0, rename(temporary, path) == 0 else {
            let code = failure == 0 ? errno : failure
            unlink(temporary)
            throw KeychainError(.storageError, "Cannot write \(path)", underlying: .errno(code))
        }
    }

    /// keychain-secret-service installed beside this program (/proc/self/exe), as the package installs both.
    static func provider() throws(KeychainError) -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard n > 0 else { throw KeychainError(.internal, "Cannot read /proc/self/exe: mount /proc", underlying: .errno(errno)) }
        let own = String(decoding: buffer[..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let path = String(own[..<own.lastIndex(of: "/")!]) + "/keychain-secret-service"
        guard access(path, X_OK) == 0 else {
            throw KeychainError(.unsupported, "keychain-secret-service is not installed beside keychainctl (\(path)): install the package's provider first")
        }
        return path
    }

    /// Asks the running session bus to read its service directories again, so the next activation
    /// follows the switch at once; false when no session bus answers (one that starts later reads them then).
    static func reloadSessionBus() -> Bool {
        guard let bus = try? Bus() else { return false }
        return (try? bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ReloadConfig")) != nil
    }

    /// Whether the provider's systemd user unit is installed (the bus then asks the user manager to start it).
    static var unitInstalled: Bool {
        let directories = (getenv("XDG_CONFIG_HOME").map { [String(cString: $0) + "/systemd/user"] } ?? [])
            + ["/etc/systemd/user", "/usr/lib/systemd/user", "/lib/systemd/user"]
        return directories.contains { access($0 + "/keychain-secret-service.service", R_OK) == 0 }
    }
}

extension Commands {
    /// `secret-service enable|disable|status`.
    func secretService() throws -> Exit {
        let args = Array(inv.command.dropFirst())
        guard args.count == 1, let action = args.first, ["enable", "disable", "status"].contains(action) else {
            throw UsageError(message: "secret-service takes one of: enable, disable, status")
        }
        let environment: (String) -> String? = { getenv($0).map { String(cString: $0) } }
        let provider = action == "enable" ? try SecretServiceSwitch.provider() : "/usr/bin/keychain-secret-service"
        let switch_ = try SecretServiceSwitch(environment: environment, provider: provider, unit: SecretServiceSwitch.unitInstalled)
        switch action {
        case "enable":
            let written = try switch_.enable()
            _ = SecretServiceSwitch.reloadSessionBus()
            if inv.json {
                printJSON(["enabled": written.map(\.path)])
            } else {
                written.forEach { print("wrote \(escaped($0.path)): \($0.purpose)") }
                print("org.freedesktop.secrets is keychain-secret-service's from its next start: a gnome-keyring running now "
                      + "keeps it until it stops (log out and in)")
            }
        case "disable":
            let (removed, kept) = try switch_.disable()
            _ = SecretServiceSwitch.reloadSessionBus()
            if inv.json {
                printJSON(["removed": removed.map(\.path), "kept": kept.map(\.path)])
            } else {
                removed.forEach { print("removed \(escaped($0.path))") }
                kept.forEach { print("kept \(escaped($0.path)): not written by enable") }
                if removed.isEmpty { print("nothing to remove: secret-service was not enabled") }
            }
        default:
            var states: [String: String] = [:]
            for file in switch_.files {
                states[file.path] = switch try SecretServiceSwitch.state(of: file.path) {
                case .absent: "absent"
                case .ours: "enabled"
                case .foreign: "not enable's"
                }
            }
            let enabled = switch_.files.allSatisfy { states[$0.path] == "enabled" }
            if inv.json {
                printJSON(["enabled": enabled ? "yes" : "no"].merging(states) { $1 })
            } else {
                print("secret-service: \(enabled ? "enabled" : "not enabled")")
                switch_.files.forEach { print("\(escaped($0.path)): \(states[$0.path]!)") }
            }
        }
        return .ok
    }
}
