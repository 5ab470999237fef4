import Foundation
import Synchronization
import Testing
@testable import Keychain
@testable import KeychainEngine

/// The engine's executor, driven by other threads (keychaind's connection threads): still serial.
@Suite("SerialThreadExecutor")
struct SerialExecutorTests {
    actor Probe {
        nonisolated let executor: SerialThreadExecutor
        nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
        /// Jobs inside `enter` at once, counted without the actor's help.
        let inside = Atomic(0)
        let overlaps = Atomic(0)
        let runs = Atomic(0)

        init(_ executor: SerialThreadExecutor) { self.executor = executor }

        func enter() {
            if inside.add(1, ordering: .sequentiallyConsistent).newValue != 1 { overlaps.add(1, ordering: .relaxed) }
            for _ in 0..<50 { sched_yield() }  // a window for another thread to come in
            inside.subtract(1, ordering: .sequentiallyConsistent)
            runs.add(1, ordering: .relaxed)
        }
    }

    final class Threads: Sendable {
        let caller = Mutex<pthread_t?>(nil)
        /// The job's thread, as seen when `drive` returned.
        let ranOn = Mutex<pthread_t?>(nil)
        let seen = Mutex<pthread_t?>(nil)
        /// The driver's own work is done.
        let mine = Atomic(false)
    }

    /// With no other runner, `drive` runs the task's jobs on the calling thread before it returns.
    @Test func driveRunsTheJobsOnTheCallingThread() async {
        let executor = SerialThreadExecutor(name: "test.drive")
        defer { executor.stop() }
        let threads = Threads()
        let finished = DispatchSemaphore(value: 0)
        let thread = Thread {
            threads.caller.withLock { $0 = pthread_self() }
            executor.drive {
                Task(executorPreference: executor) { threads.ranOn.withLock { $0 = pthread_self() } }
            }
            threads.seen.withLock { $0 = threads.ranOn.withLock { $0 } }
            finished.signal()
        }
        thread.start()
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async { finished.wait(); continuation.resume() }
        }
        #expect(threads.seen.withLock { $0 } != nil, "the job ran before drive returned")
        #expect(threads.seen.withLock { $0 } == threads.caller.withLock { $0 })
    }

    /// A driver stops once its own work is back (`until`): the jobs its task enqueued meanwhile go to
    /// the executor's thread, so a connection thread never keeps its client waiting to serve others.
    @Test func aDriverHandsTheRestToTheExecutorsThreadWhenItsWorkIsDone() async {
        let executor = SerialThreadExecutor(name: "test.handoff")
        defer { executor.stop() }
        let threads = Threads()
        let finished = DispatchSemaphore(value: 0)
        Thread {
            threads.caller.withLock { $0 = pthread_self() }
            executor.drive({
                Task(executorPreference: executor) {
                    Task(executorPreference: executor) {
                        threads.ranOn.withLock { $0 = pthread_self() }
                        finished.signal()
                    }
                    threads.mine.store(true, ordering: .sequentiallyConsistent)
                }
            }, until: { threads.mine.load(ordering: .sequentiallyConsistent) })
        }.start()
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async { finished.wait(); continuation.resume() }
        }
        #expect(threads.ranOn.withLock { $0 } != nil)
        #expect(threads.ranOn.withLock { $0 } != threads.caller.withLock { $0 }, "the other job ran on the executor's thread")
    }

    final class TaskList: Sendable { let list = Mutex<[Task<Void, Never>]>([]) }

    /// Eight threads drive jobs while eight pool tasks enqueue theirs (run by the executor's thread
    /// or by a driver): never two jobs at once.
    @Test func drivenAndEnqueuedJobsNeverOverlap() async {
        let executor = SerialThreadExecutor(name: "test.serial")
        defer { executor.stop() }
        let probe = Probe(executor)
        let perThread = 300
        let tasks = TaskList()
        let threadsDone = DispatchGroup()
        for _ in 0..<8 {
            threadsDone.enter()
            Thread {
                for _ in 0..<perThread {
                    executor.drive {
                        let task = Task(executorPreference: executor) { await probe.enter() }
                        tasks.list.withLock { $0.append(task) }
                    }
                }
                threadsDone.leave()
            }.start()
        }
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 { group.addTask { for _ in 0..<perThread { await probe.enter() } } }
        }
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async { threadsDone.wait(); continuation.resume() }
        }
        for task in tasks.list.withLock({ $0 }) { await task.value }
        #expect(probe.runs.load(ordering: .relaxed) == 16 * perThread)
        #expect(probe.overlaps.load(ordering: .relaxed) == 0)
    }
}
