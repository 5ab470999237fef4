import Glibc
import KeychainEngine
import KeychainCLIText
import KeychainBasics
internal import CSystemd

/// A refused credential's reason in the refused unit's own journal (`journalctl -u UNIT`).
///
/// journalctl's `-u UNIT` matches a line about the unit only from the unit's own processes, from PID 1, or from
/// uid 0 with `OBJECT_SYSTEMD_UNIT=UNIT`. keychaind runs as its own user, so its lines about a unit are in
/// keychaind's journal alone. It hands each refusal to `keychain-journal-relay`, a root service without
/// capabilities activated by a datagram on a socket only keychaind's group can write to, which logs it with
/// `OBJECT_SYSTEMD_UNIT=` (docs/credentials.md). The relay checks the sender's uid from the kernel
/// (`SCM_CREDENTIALS`), the unit name by systemd's rules, and bounds and escapes the reason.
///
/// A datagram is `system` or `uid:N`, a NUL, the unit, a NUL, the reason (`RelayedRefusal.encoded`).
struct RelayedRefusal: Equatable {
    var manager: SystemdCredentials.Manager
    var unit: String
    var reason: String

    /// The longest reason relayed: a longer one is cut there and says so.
    static let reasonLimit = 1024
    /// The longest datagram the relay reads: a longer one is refused whole.
    static let datagramLimit = 2048

    var encoded: [UInt8] {
        let who = manager.word
        // One byte past the limit, so that the relay sees a longer reason and says it was cut (at most
        // 14 + 255 + 1,025 bytes and two NULs: always within `datagramLimit`).
        return Array(who.utf8) + [0] + Array(unit.utf8) + [0] + Array(reason.utf8.prefix(Self.reasonLimit + 1))
    }

    /// The refusal in `bytes`, or why it is dropped: a wrong shape, a unit name systemd would not give a unit.
    /// The reason is kept to `reasonLimit` bytes, with every control byte and backslash escaped (`escaped`).
    static func parse(_ bytes: [UInt8]) -> Result<RelayedRefusal, RelayDrop> {
        guard bytes.count <= datagramLimit else { return .failure(.init("a datagram of \(bytes.count) bytes (at most \(datagramLimit))")) }
        let parts = bytes.split(separator: 0, maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return .failure(.init("not MANAGER\\0UNIT\\0REASON")) }
        guard let manager = SystemdCredentials.Manager(word: String(decoding: parts[0], as: UTF8.self)) else {
            return .failure(.init("a manager that is neither system nor uid:N"))
        }
        guard let unit = String(validating: parts[1], as: UTF8.self) else { return .failure(.init("a unit name that is not UTF-8")) }
        do throws(KeychainError) { try SystemdCredentials.checkUnitName(unit) } catch {
            // 64 bytes, not characters: one character can hold any number of combining marks.
            return .failure(.init("a unit name systemd does not give: \(escaped(String(decoding: parts[1].prefix(64), as: UTF8.self)))"))
        }
        var reason = escaped(String(decoding: parts[2].prefix(reasonLimit), as: UTF8.self))
        if parts[2].count > reasonLimit { reason += " (cut at \(reasonLimit) bytes)" }
        return .success(RelayedRefusal(manager: manager, unit: unit, reason: reason))
    }

    /// The journal fields of this refusal: what `journalctl -u UNIT` (a user's unit: `OBJECT_SYSTEMD_USER_UNIT=`
    /// with `OBJECT_UID=`, in the system journal) shows.
    var journalFields: [String] {
        let object = switch manager {
        case .system: ["OBJECT_SYSTEMD_UNIT=\(unit)"]
        case .user(let uid): ["OBJECT_SYSTEMD_USER_UNIT=\(unit)", "OBJECT_UID=\(uid)"]
        }
        return ["MESSAGE=keychaind refused this unit's credential: \(reason)", "PRIORITY=3", "SYSLOG_IDENTIFIER=keychaind",
                "MESSAGE_ID=\(Self.messageID)"] + object
    }

    /// The catalog ID of a refused credential (`journalctl MESSAGE_ID=…` finds every one).
    static let messageID = "5e7a1c0b3f9d4e21a8c6b24d9f0e7a13"
}

struct RelayDrop: Error, Equatable {
    var why: String
    init(_ why: String) { self.why = why }
}

/// keychaind's side: one datagram per refusal, never waiting (a relay that is down or full loses the line,
/// which keychaind's own journal still has).
package final class JournalRelayClient: Sendable {
    private let fd: Int32
    private let address: sockaddr_un

    package init?(path: String) {
        guard path.utf8.count < MemoryLayout.size(ofValue: sockaddr_un().sun_path) else { return nil }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return nil }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in path.utf8.enumerated() { raw[i] = byte }
        }
        self.fd = fd
        self.address = address
    }

    func tell(_ refusal: RelayedRefusal) {
        let bytes = refusal.encoded
        var address = self.address
        _ = bytes.withUnsafeBytes { raw in
            withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, raw.baseAddress, raw.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL), $0, socklen_t(MemoryLayout<sockaddr_un>.size))
                }
            }
        }
    }
}

let journalRelayUsage = """
    usage: keychain-journal-relay [--idle-exit SECONDS]
      Run by keychain-journal-relay.socket (a datagram socket, PassCredentials=yes): logs each refused
      credential keychaind sends into the refused unit's own journal. Datagrams from any uid other than
      root's and keychaind's are dropped. Exits after --idle-exit seconds (default 60) without one.
    """

/// keychain-journal-relay's entry point: reads refusals from the socket systemd passes until idle, then exits.
public func journalRelayMain() -> Never {
    var idleSeconds: Int32 = 60
    var arguments = CommandLine.arguments.dropFirst()
    while let arg = arguments.popFirst() {
        switch arg {
        case "--help", "-h": print(journalRelayUsage); exit(0)
        case "--idle-exit":
            guard let value = arguments.popFirst().flatMap({ Int32($0) }), value > 0 else { relayFail("--idle-exit needs a number of seconds") }
            idleSeconds = value
        default: relayFail("unknown argument \(escaped(arg))\n\(journalRelayUsage)")
        }
    }
    let listenPID = getenv("LISTEN_PID").flatMap { Int32(String(cString: $0)) }
    let listenFDs = getenv("LISTEN_FDS").map { String(cString: $0) }
    guard listenPID == getpid(), listenFDs == "1" else {
        relayFail("run by keychain-journal-relay.socket: expected one socket from systemd (LISTEN_FDS=1, LISTEN_PID=this process)")
    }
    let fd: Int32 = 3
    var on: Int32 = 1
    _ = setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, socklen_t(MemoryLayout<Int32>.size))
    let allowed: Set<UInt32> = [0, getpwnam("keychaind")?.pointee.pw_uid].compactMap { $0 }.reduce(into: []) { $0.insert($1) }
    var drops = 0
    while true {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        switch valueOrErrno({ poll(&poller, 1, idleSeconds * 1000) }) {
        case .failure(let error): relayFail("poll: errno \(error.rawValue)")
        case .success(0): exit(0)
        case .success: break
        }
        guard let (bytes, uid) = receiveWithSender(fd) else { continue }
        guard let uid, allowed.contains(uid) else {
            drops += 1
            // A line per hundred drops: a flood from a uid that reached the socket cannot flood the journal.
            if drops % 100 == 1 { writeAll(2, "keychain-journal-relay: dropped a datagram from uid \(uid.map(String.init) ?? "unknown") (\(drops) so far): only keychaind's\n") }
            continue
        }
        switch RelayedRefusal.parse(bytes) {
        case .failure(let drop):
            writeAll(2, "keychain-journal-relay: dropped \(drop.why)\n")
        case .success(let refusal):
            sendToJournal(refusal.journalFields)
        }
    }
}

private func relayFail(_ message: String) -> Never {
    writeAll(2, "keychain-journal-relay: \(message)\n")
    exit(2)
}

/// One datagram and its sender's uid from the kernel (`SCM_CREDENTIALS`, present with `SO_PASSCRED`).
private func receiveWithSender(_ fd: Int32) -> ([UInt8], UInt32?)? {
    var buffer = [UInt8](repeating: 0, count: RelayedRefusal.datagramLimit + 1)
    // cmsghdr (16 bytes on LP64) then struct ucred (pid, uid, gid), padded: 64 bytes hold it.
    var control = [UInt8](repeating: 0, count: 64)
    let count = buffer.withUnsafeMutableBytes { data in
        control.withUnsafeMutableBytes { control in
            var vector = iovec(iov_base: data.baseAddress, iov_len: data.count)
            return withUnsafeMutablePointer(to: &vector) { vector in
                var message = msghdr(msg_name: nil, msg_namelen: 0, msg_iov: vector, msg_iovlen: 1,
                                     msg_control: control.baseAddress, msg_controllen: control.count, msg_flags: 0)
                return recvmsg(fd, &message, Int32(MSG_DONTWAIT | MSG_TRUNC))
            }
        }
    }
    guard count >= 0 else { return nil }
    let header = MemoryLayout<cmsghdr>.size
    let length = control.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 0, as: Int.self) }
    let level = control.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 8, as: Int32.self) }
    let type = control.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 12, as: Int32.self) }
    var uid: UInt32?
    // SCM_CREDENTIALS is 2; struct ucred is pid (4 bytes), uid (4), gid (4). Glibc's headers hide both without _GNU_SOURCE.
    if level == SOL_SOCKET, type == 2, length >= header + 12 {
        uid = control.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: header + 4, as: UInt32.self) }
    }
    // MSG_TRUNC: count is the datagram's whole length; a longer one than the buffer comes back as the whole
    // buffer, one byte over the limit, and is refused.
    return (Array(buffer.prefix(count)), uid)
}

private func sendToJournal(_ fields: [String]) {
    let copies = fields.map { Array($0.utf8) }
    var pointers: [UnsafeMutableRawPointer?] = []
    var vectors: [iovec] = []
    for field in copies {
        let pointer = UnsafeMutableRawPointer.allocate(byteCount: max(field.count, 1), alignment: 1)
        field.withUnsafeBytes { pointer.copyMemory(from: $0.baseAddress!, byteCount: field.count) }
        pointers.append(pointer)
        vectors.append(iovec(iov_base: pointer, iov_len: field.count))
    }
    defer { pointers.forEach { $0?.deallocate() } }
    let result = sd_journal_sendv(&vectors, Int32(vectors.count))
    if result < 0 { writeAll(2, "keychain-journal-relay: the journal refused a line (errno \(-result))\n") }
}
