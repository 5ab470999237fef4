import KeychainEngine
import Glibc
import KeychainWire
import Synchronization

/// Who is on the other end of a daemon connection, as the kernel saw it at `connect` (`SO_PEERCRED`,
/// `SO_PEERGROUPS`): nothing the client sends changes it.
package struct Peer: Sendable, Hashable {
    package var pid: Int32
    package var uid: UInt32
    package var gid: UInt32
    /// The supplementary groups at connect time.
    package var groups: [UInt32]
    /// The application the kernel sets it apart as, taken at accept (`CallerIdentity.ofPeer`); nil
    /// for its uid's unconfined caller.
    package var application: ConfinedApplication?

    package init(pid: Int32, uid: UInt32, gid: UInt32, groups: [UInt32], application: ConfinedApplication? = nil) {
        self.pid = pid; self.uid = uid; self.gid = gid; self.groups = groups; self.application = application
    }

    package var identity: CallerIdentity { CallerIdentity(uid: uid, application: application) }

    /// A Flatpak app: its user's unconfined domain (the user's own manager's credentials, `admin`) is
    /// not its own.
    package var isSandboxed: Bool { if case .flatpak = application { true } else { false } }

    /// The credentials of a connected Unix socket's peer, or nil when the kernel gives none.
    package init?(socket fd: Int32) {
        guard let credentials = WireSocket.peerCredentials(fd) else { return nil }
        var groups = [gid_t](repeating: 0, count: 256)
        var groupsLength = socklen_t(groups.count * MemoryLayout<gid_t>.size)
        // SO_PEERGROUPS (Linux 4.13); without it only the primary group counts.
        let peerGroups: Int32 = 59
        if getsockopt(fd, SOL_SOCKET, peerGroups, &groups, &groupsLength) == 0 {
            groups = Array(groups.prefix(Int(groupsLength) / MemoryLayout<gid_t>.size))
        } else {
            groups = []
        }
        self.init(pid: credentials.pid, uid: credentials.uid, gid: credentials.gid, groups: groups)
    }
}

/// The administrator's access groups: `DIR/NAME.conf`, each a named set of uids and gids. A storage
/// with `accessGroup: NAME` sees the group's shared items only for a member; the group `admin` also
/// names who may make device-wide changes besides root. Read at each use, so an edit takes effect
/// at the next call without a restart.
///
/// A file counts only when it is a regular file owned by root (or the daemon's user) and writable by
/// no one else: a group another user could edit would let them in.
package struct AccessGroups: Sendable {
    package let directory: String?
    package static let adminGroup = "admin"

    package init(directory: String?) { self.directory = directory }

    /// Root, or a member of `admin` by its uid or gids: device-wide changes are a Unix user's to make,
    /// and a system unit is root's configuration. Never a Flatpak app: an administrator's sandbox is
    /// not the administrator.
    package func isAdmin(_ peer: Peer) -> Bool {
        guard !peer.isSandboxed else { return false }
        var user = peer
        user.application = nil
        return peer.uid == 0 || (try? isMember(user, of: Self.adminGroup)) == true
    }

    /// `INVALID_ARGUMENT` for a name no group file can have.
    package static func check(name: String) throws(KeychainError) {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a)
                || byte == 0x2d || byte == 0x5f || byte == 0x2e
        }
        guard allowed, !name.isEmpty, name.utf8.count <= 64, name.first != "." else {
            throw .invalidArgument("Invalid accessGroup '\(name)': expected 1 to 64 letters, digits, '.', '-' or '_', not starting with '.'")
        }
    }

    /// Whether `peer` reads and writes the group's items: a confined application when the group names
    /// it (`unit NAME.service`, `app APP.ID`), whatever its uid; an unconfined caller by its uid or gids.
    package func isMember(_ peer: Peer, of name: String) throws(KeychainError) -> Bool {
        try Self.check(name: name)
        guard let directory, let members = Self.members(path: "\(directory)/\(name).conf") else { return false }
        if let application = peer.application { return members.applications.contains(application) }
        return members.uids.contains(peer.uid) || members.gids.contains(peer.gid)
            || peer.groups.contains { members.gids.contains($0) }
    }

    /// Who a group file lists.
    struct Members {
        var uids = Set<UInt32>(), gids = Set<UInt32>()
        var applications = Set<ConfinedApplication>()
    }

    /// The group's members, or nil when the file is absent, untrusted or unreadable (logged).
    static func members(path: String) -> Members? {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            if errno != ENOENT { log("keychaind: ignoring \(path): cannot open it (errno \(errno))") }
            return nil
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_size <= 65536 else {
            log("keychaind: ignoring \(path): not a regular file of at most 64 KiB")
            return nil
        }
        guard info.st_uid == 0 || info.st_uid == geteuid(), info.st_mode & 0o022 == 0 else {
            log("keychaind: ignoring \(path): it must be owned by root and writable by no one else (chmod 644)")
            return nil
        }
        var bytes = [UInt8](repeating: 0, count: Int(info.st_size))
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count == bytes.count, let text = String(validating: bytes, as: UTF8.self) else {
            log("keychaind: ignoring \(path): unreadable or not UTF-8")
            return nil
        }
        var members = Members()
        for (number, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            let words = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if words.isEmpty { continue }
            let keyword = words.count == 2 ? String(words[0]) : "", value = words.count == 2 ? String(words[1]) : ""
            if keyword == "unit" || keyword == "app" {
                guard let application = ConfinedApplication(storeWords: "\(keyword == "unit" ? "unit" : "flatpak"):\(value)") else {
                    log("keychaind: ignoring \(path): line \(number + 1) names no valid "
                        + (keyword == "unit" ? "system unit ('unit NAME.service')" : "Flatpak app id ('app org.example.App')"))
                    return nil
                }
                members.applications.insert(application)
                continue
            }
            let id: UInt32? = switch keyword {
            case "uid", "gid": UInt32(value)
            case "user": names.withLock { _ in getpwnam(value)?.pointee.pw_uid }
            case "group": names.withLock { _ in getgrnam(value)?.pointee.gr_gid }
            default: nil
            }
            guard let id else {
                // A group that says more than it can be read as is not used at all.
                log("keychaind: ignoring \(path): line \(number + 1) is not 'uid N', 'gid N', 'user NAME', 'group NAME' (of a known "
                    + "name), 'unit NAME.service' or 'app APP.ID'")
                return nil
            }
            if keyword == "uid" || keyword == "user" { members.uids.insert(id) } else { members.gids.insert(id) }
        }
        return members
    }

    /// getpwnam and getgrnam return static storage: one connection thread at a time.
    private static let names = Mutex(())

    static func log(_ text: String) { DaemonLog.say(text) }
}

extension SystemdCredentials {
    /// The message for a caller who may not administer `manager`'s credentials.
    static func refusal(_ peer: Peer, for manager: Manager) -> KeychainError {
        switch manager {
        case .system:
            KeychainError(.accessDenied, "Only root or a member of the access group '\(AccessGroups.adminGroup)' may store, read, list "
                          + "or remove systemd credentials; uid \(peer.uid) is neither")
        case .user(let uid):
            KeychainError(.accessDenied, "Only uid \(uid), root or a member of the access group '\(AccessGroups.adminGroup)' may store, "
                          + "read, list or remove the systemd credentials of uid \(uid)'s user units; uid \(peer.uid) is none of them "
                          + "(your own user units' are `keychainctl credential … --user`)")
        }
    }
}
