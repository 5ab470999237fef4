/// The application's identifier on Linux, the seed's default service ("the bundle identifier / the
/// application id"). Linux has no bundle identifier; what it has, in this order:
/// 1. `KEYCHAIN_APP_ID`, when set and not empty: the same for an app's daemon, its CLI and its tests;
/// 2. the systemd unit the process runs in (`/proc/self/cgroup`): for a desktop application, the
///    desktop file id in its `app-[<launcher>-]<id>[@<random>].service` or
///    `app-[<launcher>-]<id>-<random>.scope` unit (systemd's desktop-environment naming, which GNOME
///    and KDE follow); for a service, the unit's name without `.service` (`myapp.service` → `myapp`);
/// 3. the desktop file id GLib passes to what it launches (`GIO_LAUNCHED_DESKTOP_FILE`, without
///    `.desktop`).
/// A process that has none of them (a program run by hand from a shell) has no identifier: a storage
/// made without a service is then `INVALID_ARGUMENT`, since a guess such as the executable's name
/// would lose the items when the binary is renamed.
package enum ApplicationIdentity {
    package static let missing = KeychainError(
        .invalidArgument,
        "No application identifier for the default service: set KEYCHAIN_APP_ID, run the program as its systemd unit "
        + "or from its desktop file, or give the storage a service (createKeychain(.init(service: …)))")

    package static func resolve(environment: [String: String], cgroup: String?) -> String? {
        if let id = environment["KEYCHAIN_APP_ID"], !id.isEmpty { return id }
        if let cgroup, let id = unitApplication(cgroup: cgroup) { return id }
        if let file = environment["GIO_LAUNCHED_DESKTOP_FILE"], let id = desktopFileID(path: file) { return id }
        return nil
    }

    /// The application of the innermost unit in the systemd hierarchy of `/proc/self/cgroup` (the
    /// unified `0::` line, or cgroup v1's `name=systemd`); nil for a slice, a user manager, a login
    /// session or any other scope (a terminal's `vte-spawn-….scope` names the terminal, not the app).
    package static func unitApplication(cgroup: String) -> String? {
        for line in cgroup.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3, (fields[0] == "0" && fields[1].isEmpty) || fields[1] == "name=systemd" else { continue }
            guard let unit = fields[2].split(separator: "/").last(where: { $0.hasSuffix(".service") || $0.hasSuffix(".scope") })
            else { continue }
            return application(unit: String(unit))
        }
        return nil
    }

    package static func application(unit: String) -> String? {
        let isScope = unit.hasSuffix(".scope")
        var name = Substring(unit.dropLast(isScope ? ".scope".count : ".service".count))
        if name.hasPrefix("app-") {
            name = name.dropFirst("app-".count)
            if isScope {
                guard let random = name.lastIndex(of: "-") else { return nil }
                name = name[..<random]
            } else if let random = name.firstIndex(of: "@") {
                name = name[..<random]
            }
            // The id's own dashes are escaped (\x2d): a dash left separates the launcher.
            if let launcher = name.firstIndex(of: "-") { name = name[name.index(after: launcher)...] }
            return nonEmpty(unescaped(name))
        }
        guard !isScope, !name.hasPrefix("user@"), !name.hasPrefix("user-runtime-dir@") else { return nil }
        return nonEmpty(unescaped(name))
    }

    package static func desktopFileID(path: String) -> String? {
        guard let base = path.split(separator: "/").last, base.hasSuffix(".desktop") else { return nil }
        return nonEmpty(String(base.dropLast(".desktop".count)))
    }

    /// systemd's unit-name escapes (`\xNN`) undone.
    private static func unescaped(_ text: Substring) -> String {
        var bytes: [UInt8] = []
        var rest = Array(text.utf8)[...]
        while let byte = rest.first {
            if byte == UInt8(ascii: "\\"), rest.count >= 4, rest[rest.startIndex + 1] == UInt8(ascii: "x"),
               let value = UInt8(String(decoding: rest[(rest.startIndex + 2)..<(rest.startIndex + 4)], as: UTF8.self), radix: 16) {
                bytes.append(value)
                rest = rest.dropFirst(4)
            } else {
                bytes.append(byte)
                rest = rest.dropFirst()
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func nonEmpty(_ text: String) -> String? { text.isEmpty ? nil : text }
}
