import Foundation
import KeychainTestThreads
import Testing

/// `.offThePool` (issue 22 item 14): the suite hung now and then because synchronous test bodies that
/// wait for a child (the kill sweeps) held both threads of this machine's cooperative pool, and every
/// async test's continuation waited for one (nothing finished for over four minutes in a stalled
/// run). Each wait here is for an event and bounded by `deadline`, far beyond any load's delay: a
/// failure names what never came.
@Suite(.offThePool) struct OffThePoolTests {
    static let deadline: TimeInterval = 600

    /// This thread's name as the kernel has it (`comm`): the pool's threads are Dispatch's
    /// (`com.apple.root.default-qos`, cut to its last 15 bytes), the trait's `OwnThreadsExecutor.threadName`.
    static var threadName: String {
        ((try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)) ?? "?").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// A synchronous body, as the kill sweeps' are, runs on a thread of the trait's: not one of the pool's.
    @Test func aSynchronousBodyRunsOnAThreadOfItsOwn() {
        #expect(OwnThreadsExecutor.isCurrentThreadOwn, "the body runs on \(Self.threadName)")
        #expect(Self.threadName == OwnThreadsExecutor.threadName, "the body runs on \(Self.threadName)")
    }

    /// An async body resumes on the trait's threads after each suspension, and its children run there too.
    @Test func anAsyncBodyAndItsChildrenStayOffThePool() async {
        await Task.yield()
        #expect(OwnThreadsExecutor.isCurrentThreadOwn, "after a suspension the body runs on \(Self.threadName)")
        async let child = OwnThreadsExecutor.isCurrentThreadOwn
        #expect(await child, "an async let child runs on the pool")
    }

    /// A body that blocks until its own `async let` child has run (a read whose prompt the body then
    /// answers) is not held up: the child gets another thread. On one serial thread it would wait
    /// for the body for ever.
    @Test func aBodyBlockedOnItsOwnChildIsNotHeldUpByIt() async {
        let event = Event()
        async let child: Void = event.happen()
        #expect(event.wait(seconds: Self.deadline), "the async let child never ran while its parent's body blocked")
        await child
    }

    /// With as many synchronous bodies blocked as the pool has threads (one per core), an async task
    /// on the pool still runs. Each blocked body is started as the test runner starts one: on the
    /// pool, through the trait's scope. Before (a body run on the pool), the task never ran and each
    /// body waited `deadline` for it.
    @Test func anAsyncTaskRunsWhileSynchronousBodiesBlockAsManyThreadsAsThePoolHas() async throws {
        let width = ProcessInfo.processInfo.activeProcessorCount
        let blocked = Countdown(width), ran = Event()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<width {
                group.addTask(executorPreference: globalConcurrentExecutor) {
                    try await OffThePool().provideScope(for: Test.current!, testCase: nil) {
                        blocked.arrive()
                        #expect(ran.wait(seconds: Self.deadline),
                                "the async task never ran while \(width) synchronous bodies blocked: they hold the cooperative pool")
                    }
                }
            }
            group.addTask(executorPreference: globalConcurrentExecutor) {
                await blocked.reachedZero()
                ran.happen()
            }
            try await group.waitForAll()
        }
    }

    /// Happens once; `wait` blocks its thread until it has, or `seconds` passed (false).
    final class Event: @unchecked Sendable {
        private let condition = NSCondition()
        private var happened = false

        func happen() {
            condition.lock()
            happened = true
            condition.broadcast()
            condition.unlock()
        }

        func wait(seconds: TimeInterval) -> Bool {
            let until = Date(timeIntervalSinceNow: seconds)
            condition.lock()
            defer { condition.unlock() }
            while !happened && condition.wait(until: until) {}
            return happened
        }
    }

    /// Counts arrivals down from `count`; `reachedZero` suspends (holding no thread) until the last.
    final class Countdown: @unchecked Sendable {
        private let lock = NSLock()
        private var left: Int
        private var waiter: CheckedContinuation<Void, Never>?

        init(_ count: Int) { left = count }

        func arrive() {
            let resume = lock.withLock { () -> CheckedContinuation<Void, Never>? in
                left -= 1
                guard left == 0 else { return nil }
                defer { waiter = nil }
                return waiter
            }
            resume?.resume()
        }

        func reachedZero() async {
            await withCheckedContinuation { continuation in
                let now = lock.withLock { () -> Bool in
                    if left > 0 { waiter = continuation }
                    return left <= 0
                }
                if now { continuation.resume() }
            }
        }
    }
}
