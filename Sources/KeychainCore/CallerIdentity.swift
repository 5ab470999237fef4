/// Who calls a door of the keychain, as the kernel vouches for it (never as the caller says): its
/// uid and, when the kernel sets it apart from the uid's other programs, its application. Taken once
/// per connection (`CallerIdentity.ofPeer`: keychaind's socket; `ofProcess`: the Secret Service, from the
/// sender's pid on the bus). docs/security.md, "Per-application items".
package struct CallerIdentity: Sendable, Hashable {
    package var uid: UInt32
    /// nil: the uid's unconfined caller (a shell, a user unit, anything the user runs by hand).
    package var application: ConfinedApplication?

    package init(uid: UInt32, application: ConfinedApplication?) {
        (self.uid, self.application) = (uid, application)
    }
}

/// An application the kernel sets apart from its uid's other programs.
package enum ConfinedApplication: Sendable, Hashable {
    /// A system service: its cgroup is `(/X.slice)*/NAME.service`, where only root moves processes.
    case unit(String)
    /// A Flatpak app: `[Application] name=` of the `/.flatpak-info` in the peer's own root.
    case flatpak(String)

    /// Its default service (the seed's "application id"): a unit's name without `.service`, as
    /// `ApplicationIdentity` names it in-process; a Flatpak app's id.
    package var defaultService: String {
        switch self {
        case .unit(let name): String(name.dropLast(".service".count))
        case .flatpak(let id): id
        }
    }

    /// The kind and name as a store prefix writes them: `unit:NAME.service`, `flatpak:ID`.
    package var storeWords: String {
        switch self {
        case .unit(let name): "unit:\(name)"
        case .flatpak(let id): "flatpak:\(id)"
        }
    }

    /// The application a store prefix's `KIND:NAME` names, nil when either is not valid.
    package init?(storeWords: Substring) {
        if storeWords.hasPrefix("unit:") {
            let name = String(storeWords.dropFirst("unit:".count))
            guard CallerIdentity.isSystemUnitName(name) else { return nil }
            self = .unit(name)
        } else if storeWords.hasPrefix("flatpak:") {
            let id = String(storeWords.dropFirst("flatpak:".count))
            guard CallerIdentity.isFlatpakAppID(id) else { return nil }
            self = .flatpak(id)
        } else {
            return nil
        }
    }

    /// For messages: "the system unit 'a.service'", "the Flatpak app 'org.example.A'".
    package var words: String {
        switch self {
        case .unit(let name): "the system unit '\(name)'"
        case .flatpak(let id): "the Flatpak app '\(id)'"
        }
    }
}

// MARK: What /proc says, read as pure functions

extension CallerIdentity {
    /// The system unit of a `/proc/PID/cgroup`: the systemd hierarchy's path (cgroup v1's
    /// `name=systemd` line when there is one, else the unified `0::` line) must be
    /// `(/X.slice)*/NAME.service[/...]`; the unit is the first `.service` component (a unit with
    /// `Delegate=` may make sub-cgroups of any name below itself). Nothing under `user.slice` or a
    /// `user@N.service` counts: a user manager's units are its user's to move.
    package static func systemUnit(cgroup: String) -> String? {
        guard let path = systemdPath(cgroup: cgroup) else { return nil }
        for component in path.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            if component == "user.slice" { return nil }
            if component.hasSuffix(".slice") && component.count > ".slice".count { continue }
            guard component.hasSuffix(".service"), !component.hasPrefix("user@"), isSystemUnitName(String(component)) else { return nil }
            return String(component)
        }
        return nil
    }

    /// The app id of the scope `flatpak run` puts an app in (`app-flatpak-ID-N.scope`, N its pid, the
    /// id escaped as systemd escapes unit names: `-` is `\x2d`) on the systemd hierarchy's path of a
    /// `/proc/PID/cgroup`; nil when there is none, or its id is not valid (`isFlatpakAppID`).
    package static func flatpakScope(cgroup: String) -> String? {
        guard let path = systemdPath(cgroup: cgroup) else { return nil }
        for component in path.split(separator: "/") where component.hasPrefix("app-flatpak-") && component.hasSuffix(".scope") {
            let middle = component.dropFirst("app-flatpak-".count).dropLast(".scope".count)
            guard let dash = middle.lastIndex(of: "-") else { continue }
            let digits = middle[middle.index(after: dash)...]
            guard !digits.isEmpty, digits.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { continue }
            if let id = unitNameUnescaped(middle[..<dash]), isFlatpakAppID(id) { return id }
        }
        return nil
    }

    /// A unit name's part with systemd's `\xHH` escapes undone; nil for a malformed escape.
    private static func unitNameUnescaped(_ text: Substring) -> String? {
        var bytes: [UInt8] = [], rest = text.utf8[...]
        while let byte = rest.popFirst() {
            guard byte == UInt8(ascii: "\\") else { bytes.append(byte); continue }
            guard rest.popFirst() == UInt8(ascii: "x"), rest.count >= 2,
                  let value = UInt8(String(decoding: rest.prefix(2), as: UTF8.self), radix: 16) else { return nil }
            bytes.append(value)
            rest = rest.dropFirst(2)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The systemd hierarchy's path in a `/proc/PID/cgroup`: cgroup v1's `name=systemd` line when
    /// there is one, else the unified `0::` line.
    private static func systemdPath(cgroup: String) -> Substring? {
        var unified: Substring?, named: Substring?
        for line in cgroup.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            if fields[1] == "name=systemd" {
                named = fields[2]
            } else if fields[0] == "0" && fields[1].isEmpty {
                unified = fields[2]
            }
        }
        guard let path = named ?? unified, path.first == "/" else { return nil }
        return path
    }

    /// A service unit's name as systemd allows it: at most 255 bytes of letters, digits, `:-_.\@`,
    /// ending in `.service` with a name before it.
    package static func isSystemUnitName(_ name: String) -> Bool {
        let bytes = name.utf8
        guard bytes.count <= 255, name.hasSuffix(".service"), bytes.count > ".service".count else { return false }
        return bytes.allSatisfy { byte in
            isLetterOrDigit(byte) || byte == UInt8(ascii: ":") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "\\") || byte == UInt8(ascii: "@")
        }
    }

    /// The app id of a `.flatpak-info` (a key file): `name=` of `[Application]`, or of `[Runtime]`
    /// when the file has that group (a sandbox run with `--runtime`), as xdg-desktop-portal reads it.
    /// nil when the name is missing, given twice, or not a valid app id (`isFlatpakAppID`): a file
    /// that is there but names nothing valid never makes its reader unconfined.
    package static func flatpakApplication(info: String) -> String? {
        var group: Substring = ""
        var names: [Substring: [Substring]] = [:]
        for raw in info.split(separator: "\n", omittingEmptySubsequences: true) {
            let line = raw.drop { $0 == " " || $0 == "\t" }
            if line.isEmpty || line.first == "#" { continue }
            if line.first == "[" {
                guard let end = line.firstIndex(of: "]") else { return nil }
                group = line[line.index(after: line.startIndex)..<end]
                continue
            }
            guard let equals = line.firstIndex(of: "=") else { continue }
            let key = line[..<equals].reversed().drop { $0 == " " || $0 == "\t" }
            guard String(key.reversed()) == "name", group == "Application" || group == "Runtime" else { continue }
            names[group, default: []].append(line[line.index(after: equals)...].drop { $0 == " " || $0 == "\t" })
        }
        guard let values = names["Runtime"] ?? names["Application"], values.count == 1 else { return nil }
        let id = String(values[0])
        return isFlatpakAppID(id) ? id : nil
    }

    /// Flatpak's rule for an app id: at most 255 bytes, at least three elements separated by '.',
    /// each starting with a letter or '_' and made of letters, digits and '_' (the last may hold '-').
    package static func isFlatpakAppID(_ id: String) -> Bool {
        let elements = id.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard id.utf8.count <= 255, elements.count >= 3 else { return false }
        for (index, element) in elements.enumerated() {
            let dash = index == elements.count - 1
            guard let first = element.first, isLetter(first) || first == UInt8(ascii: "_") || (dash && first == UInt8(ascii: "-")),
                  element.allSatisfy({ isLetterOrDigit($0) || $0 == UInt8(ascii: "_") || (dash && $0 == UInt8(ascii: "-")) })
            else { return false }
        }
        return true
    }

    /// The pid a pidfd names, from `/proc/self/fdinfo/FD`'s `Pid:` line: nil when there is none;
    /// the kernel writes -1 once the process is gone (and 0 when it is in no pid namespace of ours).
    package static func pid(fdinfo: String) -> Int32? {
        for line in fdinfo.split(separator: "\n") where line.hasPrefix("Pid:") {
            return Int32(line.dropFirst("Pid:".count).trimmingCharacters(in: " \t"))
        }
        return nil
    }

    private static func isLetter(_ byte: UInt8) -> Bool {
        (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
    }

    private static func isLetterOrDigit(_ byte: UInt8) -> Bool {
        isLetter(byte) || (byte >= 0x30 && byte <= 0x39)
    }
}

/// A `/proc/PID/mountinfo` read line by line, bounded, for a mount at `/.flatpak-info` (a line's fifth
/// field, the mount point, which the kernel writes with spaces and backslashes escaped): of each line
/// only its first `maxLineBytes` are kept, at most `maxLines` lines (the kernel's default
/// `fs.mount-max`), so a sandbox with a large mount table is read, not refused, in bounded memory.
package struct MountTable {
    package static let maxLineBytes = 32 << 10
    package static let maxLines = 100_000

    /// Why a table is refused: its mount point cannot be told within the bounds.
    package struct Refusal: Error {
        package var reason: String
    }

    private var line: [UInt8] = []
    private var truncated = false
    private var lines = 0

    package init() {}

    /// Whether the whole table `text` mounts `/.flatpak-info`.
    package static func mountsFlatpakInfo(_ text: String) throws(Refusal) -> Bool {
        var table = MountTable()
        if try table.scan(ArraySlice(text.utf8)) { return true }
        return try table.finish()
    }

    /// Takes the table's next bytes; true once a line mounts `/.flatpak-info`.
    package mutating func scan(_ bytes: ArraySlice<UInt8>) throws(Refusal) -> Bool {
        var rest = bytes
        while !rest.isEmpty {
            let end = rest.firstIndex(of: UInt8(ascii: "\n"))
            let piece = rest[..<(end ?? rest.endIndex)]
            let room = Self.maxLineBytes - line.count
            if piece.count > room { truncated = true }
            line += piece.prefix(room)
            guard let end else { return false }
            if try lineEnded() { return true }
            rest = rest[(end + 1)...]
        }
        return false
    }

    /// The table's end: whether its last line, one without a newline, mounts `/.flatpak-info`.
    package mutating func finish() throws(Refusal) -> Bool {
        line.isEmpty && !truncated ? false : try lineEnded()
    }

    private mutating func lineEnded() throws(Refusal) -> Bool {
        defer {
            line.removeAll(keepingCapacity: true)
            truncated = false
        }
        lines += 1
        guard lines <= Self.maxLines else { throw Refusal(reason: "has more than \(Self.maxLines) mounts") }
        let fields = line.split(separator: UInt8(ascii: " "), maxSplits: 5, omittingEmptySubsequences: false)
        // A line cut short must have its fifth field whole (a space after it) within what was kept.
        guard fields.count > 5 || !truncated else {
            throw Refusal(reason: "has a line longer than \(Self.maxLineBytes) bytes before its mount point ends")
        }
        return fields.count > 4 && fields[4].elementsEqual("/.flatpak-info".utf8)
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> Substring {
        var text = self
        while let first = text.first, set.contains(first) { text = text.dropFirst() }
        while let last = text.last, set.contains(last) { text = text.dropLast() }
        return text
    }
}
