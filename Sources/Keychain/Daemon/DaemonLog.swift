import FoundationEssentials
import Synchronization
import KeychainCLIText

/// keychaind's log (stderr, the journal under systemd): a line repeated is said once, then counted,
/// so a condition that lasts (accept out of descriptors, a bad group file read at every call) costs
/// a line a minute, not twenty a second.
package enum DaemonLog {
    private static let lines = Mutex(RepeatedLines())

    package static func say(_ text: String) {
        let now = ContinuousClock.now
        write(lines.withLock { $0.line(text, at: now) })
    }

    /// Says how often the last line repeated since it was last said: the condition has ended.
    static func settle() {
        let now = ContinuousClock.now
        write(lines.withLock { $0.settle(at: now) })
    }

    private static func write(_ out: [String]) {
        guard !out.isEmpty else { return }
        writeAll(2, out.map { $0 + "\n" }.joined())
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
