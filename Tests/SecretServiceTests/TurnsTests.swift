@testable import SecretService
import Testing

/// `Turns` alone: a client's calls in order, a collection's writes one at a time, everything else at once.
struct TurnsTests {
    @Test func aClientsLaterCallWaitsForItsEarlierOneAndAnotherClientDoesNot() {
        var turns = Turns()
        turns.hold([.client("a")])
        #expect(!turns.isFree(.client("a")) && turns.isFree(.client("b")))
        let (later, started) = turns.enqueue([.client("a")])
        #expect(started.isEmpty)
        let (other, startedToo) = turns.enqueue([.client("b")])
        #expect(startedToo == [other])
        #expect(turns.release([.client("a")]) == [later])
        #expect(turns.release([.client("a")]).isEmpty)
        #expect(turns.isFree(.client("a")))
    }

    @Test func writesOfOneCollectionRunOneAtATimeInArrivalOrder() {
        var turns = Turns()
        let (first, started) = turns.enqueue([.collection("login")])
        #expect(started == [first])
        let (second, none) = turns.enqueue([.collection("login")])
        let (third, alsoNone) = turns.enqueue([.collection("login")])
        let (elsewhere, startedElsewhere) = turns.enqueue([.collection("work")])
        #expect(none.isEmpty && alsoNone.isEmpty && startedElsewhere == [elsewhere])
        #expect(turns.release([.collection("login")]) == [second])
        #expect(turns.release([.collection("login")]) == [third])
    }

    @Test func workNeedingAKeyAnEarlierWaiterNeedsWaitsBehindIt() {
        var turns = Turns()
        turns.hold([.collection("login")])
        // The first waits for login; the second needs login and registry: it must not overtake the first
        // on login, and the third, needing the registry only, must not overtake the second.
        let (first, _) = turns.enqueue([.collection("login")])
        let (second, _) = turns.enqueue([.collection("login"), .registry])
        let (third, started) = turns.enqueue([.registry])
        #expect(started.isEmpty)
        #expect(turns.release([.collection("login")]) == [first])
        #expect(turns.release([.collection("login")]) == [second])
        #expect(turns.release([.collection("login"), .registry]) == [third])
    }
}
