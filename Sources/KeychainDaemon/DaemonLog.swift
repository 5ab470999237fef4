import KeychainEngine
import FoundationEssentials
import Glibc
import Synchronization
import KeychainCLIText

/// keychaind's log (stderr, the journal under systemd): a line repeated is said once, then counted,
/// so a condition that lasts (accept out of descriptors, a bad group file read at every call) costs
/// a line a minute, not twenty a second; and a line a caller causes is that caller's (`say(_:uid:)`),
/// so that one uid's thousands a second cannot fill journald's rate limit and have the lines that
/// matter dropped.
///
/// - Important: a field a caller chose goes in through `logField` (a unit name, an ID, an address);
///   every line is also written with its control characters escaped and bounded (`written`), so a
///   field that was missed still cannot end the line and forge the next one.
package enum DaemonLog {
    private static let lines = Mutex(RepeatedLines())
    private static let users = Mutex(UserLines())
    /// Whether a thread waits to write the summaries of the windows now running (`UserLines.settle`).
    private static let settling = Atomic<Bool>(false)

    package static func say(_ text: String) {
        let now = ContinuousClock.now
        write(lines.withLock { $0.line(text, at: now) })
    }

    /// A line that `uid`'s call caused: beyond `UserLines.burst` of that uid's in a window, counted and
    /// folded into one line when the window ends. Root's lines (the system manager's) are never held.
    package static func say(_ text: String, uid: UInt32) {
        guard uid != 0 else { return say(text) }
        let now = ContinuousClock.now
        let (out, held) = users.withLock { users in (users.settle(at: now) + users.line(text, uid: uid, at: now), users.holds) }
        write(out)
        if held { settleLater() }
    }

    /// Says how often the last line repeated since it was last said: the condition has ended.
    static func settle() {
        let now = ContinuousClock.now
        write(lines.withLock { $0.settle(at: now) })
    }

    /// The counts of held lines are written when their window ends, even if no line comes after: one
    /// thread at a time waits for that (when none can start, the next line writes them).
    private static func settleLater() {
        guard settling.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        let failed = DetachedThread.start(name: "keychaind log") {
            while true {
                let wait = users.withLock { $0.nextSettle.map { $0 - ContinuousClock.now } }
                guard let wait else { break }
                if wait > .zero { usleep(UInt32(clamping: wait.components.seconds * 1_000_000 + 1_000_000)) }
                let now = ContinuousClock.now
                write(users.withLock { $0.settle(at: now) })
            }
            settling.store(false, ordering: .releasing)
            // A line held while this thread was ending: its count still needs a writer.
            if users.withLock({ $0.holds }) { settleLater() }
        }
        if failed != nil { settling.store(false, ordering: .releasing) }
    }

    private static func write(_ out: [String]) {
        guard !out.isEmpty else { return }
        writeAll(2, out.map { written($0) + "\n" }.joined())
    }

    /// Longest line written: a message with a caller's long field is cut, not split.
    static let maxLine = 4096

    /// `line` as it is written: control characters (C0 but tab, DEL, C1) and the bidirectional overrides
    /// escaped, at most `maxLine` bytes. Backslashes are kept: `logField`'s escapes stay as they are.
    static func written(_ line: String) -> String {
        var out = ""
        var bytes = 0
        for scalar in line.unicodeScalars {
            let piece: String = switch scalar.value {
            case 0x09: "\t"
            case 0x00..<0x20, 0x7F: "\\x" + lowerHex(scalar.value, digits: 2)
            case 0x80..<0xA0, 0x202A...0x202E, 0x2066...0x2069: "\\u{" + lowerHex(scalar.value, digits: 4) + "}"
            default: String(scalar)
            }
            bytes += piece.utf8.count
            guard bytes <= maxLine else { return out + "…(cut at \(maxLine) bytes)" }
            out += piece
        }
        return out
    }
}

/// What to write for each log line so that repeats are counted, not written: the first of a run is
/// written; its repeats are written as one count when another line comes, when the condition ends
/// (`settle`), or once per `window` while it lasts.
struct RepeatedLines: Sendable {
    var window: Duration = .seconds(60)
    private var last: String?
    private var repeats = 0
    private var since: ContinuousClock.Instant?

    mutating func line(_ text: String, at now: ContinuousClock.Instant) -> [String] {
        if text == last {
            repeats += 1
            guard let since, now - since >= window else { return [] }
            return settle(at: now)
        }
        let out = settle(at: now)
        (last, repeats, since) = (text, 0, now)
        return out + [text]
    }

    mutating func settle(at now: ContinuousClock.Instant) -> [String] {
        guard repeats > 0, let since else { return [] }
        let seconds = Int((now - since).components.seconds)
        defer { (repeats, self.since) = (0, now) }
        return ["keychaind: the last line repeated \(repeats) more time\(repeats == 1 ? "" : "s") in \(seconds) s"]
    }
}

/// Each uid's log lines: the first `burst` of a `window` are written, the rest counted and folded
/// into one line when the window ends (`settle`), naming the uid, the count and the last of them.
/// Whatever a uid does (a connection a microsecond, each from a new pid), it writes at most
/// `burst + 1` lines a window, and another uid's lines are written as they come.
struct UserLines: Sendable {
    var window: Duration = .seconds(60)
    var burst = 20
    private struct Account {
        var since: ContinuousClock.Instant
        var written = 0
        var held = 0
        var last = ""
    }
    private var accounts: [UInt32: Account] = [:]

    /// Whether a count waits for its window's end.
    var holds: Bool { accounts.values.contains { $0.held > 0 } }

    /// When the first window with held lines ends; nil when none holds any.
    var nextSettle: ContinuousClock.Instant? {
        accounts.values.filter { $0.held > 0 }.map { $0.since + window }.min()
    }

    mutating func line(_ text: String, uid: UInt32, at now: ContinuousClock.Instant) -> [String] {
        var account = accounts[uid] ?? Account(since: now)
        defer { accounts[uid] = account }
        guard account.written < burst else {
            account.held += 1
            account.last = text
            return []
        }
        account.written += 1
        return [text]
    }

    /// The counts of the windows that ended by `now`; their uids start a new window at their next line.
    mutating func settle(at now: ContinuousClock.Instant) -> [String] {
        var out: [String] = []
        for (uid, account) in accounts.sorted(by: { $0.key < $1.key }) where now - account.since >= window {
            accounts[uid] = nil
            guard account.held > 0 else { continue }
            let seconds = Int((now - account.since).components.seconds)
            out.append("keychaind: uid \(uid) caused \(account.held) more line\(account.held == 1 ? "" : "s") in \(seconds) s, not written "
                       + "(at most \(burst) a uid in \(window.components.seconds) s); the last: \(account.last)")
        }
        return out
    }
}
