@testable import Keychain
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
}
