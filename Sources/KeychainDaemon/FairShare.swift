import Keychain
import Synchronization

/// One call of each uid in the engine at a time: the engine runs its jobs in arrival order, so
/// without this a uid with many connections (each sending cold writes) put its whole backlog ahead
/// of another user's read. A uid's further calls wait at their connection threads; the engine's
/// queue then holds at most one call per uid, and another uid's call waits for at most one of each.
/// Root's calls are not held (root can stop the daemon anyway; its own calls only wait for it).
final class FairShare: Sendable {
    private final class Gate: @unchecked Sendable {
        let condition = Condition()
        var busy = false
        var users = 0  // holding or waiting, under FairShare's lock
    }
    private let gates = Mutex<[UInt32: Gate]>([:])

    /// Waits until no other call of `uid` is in the engine, then takes its turn.
    func enter(_ uid: UInt32) {
        guard uid != 0 else { return }
        let gate = gates.withLock { gates in
            let gate = gates[uid] ?? Gate()
            gates[uid] = gate
            gate.users += 1
            return gate
        }
        gate.condition.lock()
        while gate.busy { gate.condition.wait() }
        gate.busy = true
        gate.condition.unlock()
    }

    /// Ends the turn `enter` gave; the uid's next waiting call goes in.
    func leave(_ uid: UInt32) {
        guard uid != 0, let gate = gates.withLock({ $0[uid] }) else { return }
        gate.condition.lock()
        gate.busy = false
        gate.condition.signal()
        gate.condition.unlock()
        gates.withLock { gates in
            gate.users -= 1
            if gate.users == 0 { gates[uid] = nil }
        }
    }

    /// Gives the turn back while the call waits for something outside the engine (a prompt's
    /// answer, which a person gives), then takes it again.
    func pause<T, E: Error>(_ uid: UInt32, _ body: () throws(E) -> T) throws(E) -> T {
        guard uid != 0, let gate = gates.withLock({ $0[uid] }) else { return try body() }
        gate.condition.lock()
        gate.busy = false
        gate.condition.signal()
        gate.condition.unlock()
        defer {
            gate.condition.lock()
            while gate.busy { gate.condition.wait() }
            gate.busy = true
            gate.condition.unlock()
        }
        return try body()
    }
}
