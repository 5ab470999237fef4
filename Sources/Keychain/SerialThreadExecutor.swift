import Foundation
import Synchronization

/// A serial executor on its own thread: the engine's blocking SQLite and TPM calls run here, never
/// on Swift's shared cooperative pool (Linux has no `DispatchSerialQueue` executor). Also a task
/// executor, for tasks that must not wait for a pool thread (BiometricsVault's synchronous calls).
package final class SerialThreadExecutor: SerialExecutor, TaskExecutor, @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var stopping = false
    private var ended = false

    /// Whether the thread has ended (after `stop()`).
    package var hasEnded: Bool {
        condition.lock()
        defer { condition.unlock() }
        return ended
    }

    /// The thread holds the executor until `stop()` lets it end.
    package init(name: String) {
        let thread = Thread { self.run() }
        thread.name = name
        thread.start()
    }

    /// Ends the thread once the jobs already enqueued have run (its owner is gone: none can come).
    package func stop() {
        condition.lock()
        stopping = true
        condition.signal()
        condition.unlock()
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        condition.lock()
        jobs.append(unowned)
        condition.signal()
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopping { condition.wait() }
            if jobs.isEmpty {
                ended = true
                condition.unlock()
                return
            }
            let batch = jobs
            jobs.removeAll(keepingCapacity: true)
            condition.unlock()
            for job in batch { job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor()) }
        }
    }
}
