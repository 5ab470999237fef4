import KeychainEngine
import KeychainBasics
import Synchronization

/// One call of each uid in the engine at a time: the engine runs its jobs in arrival order, so
/// without this a uid with many connections (each sending cold writes) put its whole backlog ahead
/// of another user's read. A uid's further calls wait at their connection threads, in the order they
/// came; the engine's queue then holds at most one call per uid, and another uid's call waits for at
/// most one of each. Root's calls are not held (root can stop the daemon anyway; its own calls only
/// wait for it).
///
/// A call waits for its turn no longer than its deadline (docs/security.md: each call fails at its
/// deadline, counted from when it was made). Before (issue 38 item 13, found by the soak), the wait
/// had no end and no order: with the TPM stopped, a nobody's `status` waited 45.9 s for its uid's
/// turn while later calls went in before it, and then ran.
final class FairShare: Sendable {
    private final class Gate: @unchecked Sendable {
        let condition = Condition()
        var busy = false
        /// The tickets of the calls waiting for the turn, in arrival order: the first goes in next.
        var waiting: [UInt64] = []
        var users = 0  // holding or waiting, under FairShare's lock

        /// Takes the turn after the calls waiting before `ticket`; false when `deadline` passes first.
        func take(_ ticket: UInt64, until deadline: ContinuousClock.Instant) -> Bool {
            condition.lock()
            defer { condition.unlock() }
            waiting.append(ticket)
            while busy || waiting.first != ticket {
                if !condition.wait(until: deadline) && (busy || waiting.first != ticket) {
                    waiting.removeAll { $0 == ticket }
                    condition.broadcast()  // the next in line may be free to go in now
                    return false
                }
            }
            waiting.removeFirst()
            busy = true
            return true
        }

        func give() {
            condition.withLock {
                busy = false
                condition.broadcast()
            }
        }
    }
    private let gates = Mutex<(byUid: [UInt32: Gate], tickets: UInt64)>(([:], 0))

    /// Waits, after the uid's calls that came before it, until no other call of `uid` is in the
    /// engine, and takes its turn; false when `deadline` passes first (then it holds no turn).
    /// Each `enter` is followed by one `leave`, whatever it returned.
    func enter(_ uid: UInt32, until deadline: ContinuousClock.Instant) -> Bool {
        guard uid != 0 else { return true }
        let (gate, ticket) = gates.withLock { state in
            let gate = state.byUid[uid] ?? Gate()
            state.byUid[uid] = gate
            gate.users += 1
            state.tickets += 1
            return (gate, state.tickets)
        }
        return gate.take(ticket, until: deadline)
    }

    /// Ends the call: gives its turn back when it holds one (the uid's next waiting call goes in).
    func leave(_ uid: UInt32, holdingTurn: Bool) {
        guard uid != 0, let gate = gates.withLock({ $0.byUid[uid] }) else { return }
        if holdingTurn { gate.give() }
        gates.withLock { state in
            gate.users -= 1
            if gate.users == 0 { state.byUid[uid] = nil }
        }
    }

    /// Gives the turn back while the call waits for something outside the engine (a prompt's
    /// answer, which a person gives), then waits for it again, after the calls that came meanwhile,
    /// until `deadline()` (asked once `body` returned); whether it has the turn again.
    func pause<T, E: Error>(_ uid: UInt32, until deadline: () -> ContinuousClock.Instant,
                            _ body: () throws(E) -> T) -> (result: Result<T, E>, holdingTurn: Bool) {
        let result: Result<T, E>
        guard uid != 0, let gate = gates.withLock({ $0.byUid[uid] }) else {
            do throws(E) { result = .success(try body()) } catch { result = .failure(error) }
            return (result, true)
        }
        gate.give()
        do throws(E) { result = .success(try body()) } catch { result = .failure(error) }
        let ticket = gates.withLock { state in
            state.tickets += 1
            return state.tickets
        }
        return (result, gate.take(ticket, until: deadline()))
    }

    /// The calls of `uid` holding or waiting for its turn (tests).
    func users(of uid: UInt32) -> Int { gates.withLock { $0.byUid[uid]?.users ?? 0 } }
}
