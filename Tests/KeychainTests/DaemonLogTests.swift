@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon
import KeychainCLIText
import Testing

/// keychaind's log says a repeated line once, then how often it repeated (issue 22 item 5: accept's
/// errno 24 was written 20 times a second).
@Suite("keychaind: repeated log lines")
struct DaemonLogTests {
    let start = ContinuousClock.now

    func at(_ seconds: Double) -> ContinuousClock.Instant { start + .milliseconds(Int(seconds * 1000)) }

    @Test func aRepeatedLineIsSaidOnceThenCounted() {
        var lines = RepeatedLines()
        #expect(lines.line("accept: errno 24", at: at(0)) == ["accept: errno 24"])
        for tick in 1..<100 {
            #expect(lines.line("accept: errno 24", at: at(Double(tick) * 0.05)).isEmpty, "repeat \(tick) was written")
        }
        // Another line says the count first.
        #expect(lines.line("ignoring groups.d/x.conf", at: at(5)) == ["keychaind: the last line repeated 99 more times in 5 s",
                                                                     "ignoring groups.d/x.conf"])
        // Nothing repeated: nothing to settle.
        #expect(lines.settle(at: at(6)).isEmpty)
    }

    @Test func aLastingRepeatIsCountedOncePerWindowAndSettledWhenItEnds() {
        var lines = RepeatedLines()
        var written: [String] = []
        // 20 a second for 150 s.
        for tick in 0..<3000 { written += lines.line("accept: errno 24", at: at(Double(tick) * 0.05)) }
        #expect(written == ["accept: errno 24",
                            "keychaind: the last line repeated 1200 more times in 60 s",
                            "keychaind: the last line repeated 1200 more times in 60 s"], "\(written)")
        #expect(lines.settle(at: at(150)) == ["keychaind: the last line repeated 599 more times in 30 s"])
        #expect(lines.settle(at: at(151)).isEmpty)
        // The same line after it settled is counted again, not said again.
        #expect(lines.line("accept: errno 24", at: at(152)).isEmpty)
    }

    /// Issue 38 item 4: one uid's thousands of lines (a fetch a millisecond, each line unlike the last)
    /// are written up to the burst, then counted and folded into one line naming the uid when its window
    /// ends; another uid's lines are written meanwhile.
    @Test func aUidsLinesBeyondItsBurstAreCountedAndFoldedWhenItsWindowEnds() {
        var users = UserLines()
        var written: [String] = []
        for tick in 0..<1000 {
            written += users.settle(at: at(Double(tick) * 0.01)) + users.line("served to pid \(tick)", uid: 1600, at: at(Double(tick) * 0.01))
        }
        #expect(written == (0..<20).map { "served to pid \($0)" })
        #expect(users.holds && users.nextSettle == at(60))
        #expect(users.line("refused: uid 1601", uid: 1601, at: at(11)) == ["refused: uid 1601"])
        #expect(users.settle(at: at(59)).isEmpty)
        #expect(users.settle(at: at(61)) == ["keychaind: uid 1600 caused 980 more lines in 61 s, not written (at most 20 a uid in 60 s); "
                                             + "the last: served to pid 999"])
        #expect(!users.holds && users.nextSettle == nil)
        // A new window: its burst is written again.
        #expect(users.line("served to pid 1000", uid: 1600, at: at(62)) == ["served to pid 1000"])
    }

    /// Issue 38 item 3: a caller's field is one word of printable ASCII (as systemd escapes a unit name),
    /// bounded; any line written has its control characters escaped and is bounded too.
    @Test func aCallersFieldIsOneEscapedWordAndEveryLineOneLine() {
        #expect(logField("x\u{0}y\nkeychaind: unit\u{1B}[2K\\é") == "x\\x00y\\x0akeychaind:\\x20unit\\x1b[2K\\x5c\\xc3\\xa9")
        #expect(logField("db.service") == "db.service")
        #expect(logField(String(repeating: "a", count: 300)) == String(repeating: "a", count: 256) + "…(300 bytes)")
        #expect(DaemonLog.written("a\nb\u{0}c\u{1B}d\te\\x0a") == "a\\x0ab\\x00c\\x1bd\te\\x0a")
        let long = DaemonLog.written(String(repeating: "z", count: 10_000))
        #expect(long.utf8.count < DaemonLog.maxLine + 40 && long.hasSuffix("…(cut at 4096 bytes)"))
    }
}
