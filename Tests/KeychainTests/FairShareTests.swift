import Foundation
@testable import KeychainDaemon
import Keychain
import Synchronization
import Testing

/// keychaind's turn per uid (`FairShare`): a call waits for its uid's earlier calls in the order they
/// came, and no longer than its deadline (issue 38 item 13: with the TPM stopped, the soak saw a
/// `status` wait 45.9 s for its uid's turn against a 30 s deadline while later calls went in first).
/// Threads only: no daemon, no TPM; no assertion on wall time (each wait is bounded by a watchdog).
@Suite("keychaind: a uid's turn at the engine", .offThePool)
struct FairShareTests {
    static let uid: UInt32 = 65534

    /// Runs `body` on a thread of its own; a semaphore signalled when it ends.
    func onThread(_ body: @escaping @Sendable () -> Void) -> DispatchSemaphore {
        let ended = DispatchSemaphore(value: 0)
        Thread.detachNewThread { body(); ended.signal() }
        return ended
    }

    /// Waits (bounded) until `users(of:)` reaches `count`: the threads are at the gate.
    func waitForUsers(_ share: FairShare, _ count: Int) {
        for _ in 0..<2000 where share.users(of: Self.uid) < count { usleep(5_000) }
    }

    @Test func aCallWaitingForItsUidsTurnGivesUpAtItsDeadline() {
        let share = FairShare()
        #expect(share.enter(Self.uid, until: .now + .seconds(60)))
        let outcome = Mutex<Bool?>(nil)
        let ended = onThread {
            let entered = share.enter(Self.uid, until: .now + .milliseconds(200))
            outcome.withLock { $0 = entered }
            share.leave(Self.uid, holdingTurn: entered)
        }
        // The holder gives its turn back only once the waiter returned (or after the watchdog).
        let returned = ended.wait(timeout: .now() + 20) == .success
        share.leave(Self.uid, holdingTurn: true)
        if !returned { _ = ended.wait(timeout: .now() + 20) }
        #expect(returned, "the waiter returned only when the holder left")
        #expect(outcome.withLock { $0 } == false)
        #expect(share.users(of: Self.uid) == 0)
        // Nothing left behind: the next call goes in at once.
        #expect(share.enter(Self.uid, until: .now + .seconds(60)))
        share.leave(Self.uid, holdingTurn: true)
    }

    @Test func aUidsCallsGoInInTheOrderTheyCame() {
        let share = FairShare()
        #expect(share.enter(Self.uid, until: .now + .seconds(60)))
        let order = Mutex<[Int]>([])
        var ends: [DispatchSemaphore] = []
        for n in 0..<6 {
            ends.append(onThread {
                guard share.enter(Self.uid, until: .now + .seconds(60)) else { return }
                order.withLock { $0.append(n) }
                share.leave(Self.uid, holdingTurn: true)
            })
            waitForUsers(share, n + 2)  // this one waits before the next comes
        }
        share.leave(Self.uid, holdingTurn: true)
        for end in ends { _ = end.wait(timeout: .now() + 60) }
        #expect(order.withLock { $0 } == Array(0..<6))
    }

    @Test func aCallBackFromItsPromptWaitsNoLongerThanItsDeadline() {
        let share = FairShare()
        #expect(share.enter(Self.uid, until: .now + .seconds(60)))
        let other = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        // While the first call waits for its prompt's answer, another of the uid goes in and stays.
        let otherEnded = onThread {
            guard share.enter(Self.uid, until: .now + .seconds(60)) else { return }
            other.signal()
            _ = release.wait(timeout: .now() + 30)
            share.leave(Self.uid, holdingTurn: true)
        }
        let (answer, back) = share.pause(Self.uid, until: { .now + .milliseconds(200) }) { () throws(CancellationError) -> Int in
            _ = other.wait(timeout: .now() + 20)
            return 7
        }
        release.signal()
        _ = otherEnded.wait(timeout: .now() + 40)
        share.leave(Self.uid, holdingTurn: back)
        #expect((try? answer.get()) == 7)
        #expect(!back)
        #expect(share.users(of: Self.uid) == 0)
    }
}
