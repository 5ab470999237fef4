import Foundation
import Synchronization

/// A serial executor on its own thread: the engine's blocking SQLite and TPM calls run here, never
/// on Swift's shared cooperative pool (Linux has no `DispatchSerialQueue` executor). Also a task
/// executor, for tasks that must not wait for a pool thread (BiometricsVault's synchronous calls).
package final class SerialThreadExecutor: SerialExecutor, TaskExecutor, @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []

    package init(name: String) {
        let thread = Thread { [unowned self] in self.run() }
        thread.name = name
        thread.start()
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
            while jobs.isEmpty { condition.wait() }
            let batch = jobs
            jobs.removeAll(keepingCapacity: true)
            condition.unlock()
            for job in batch { job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor()) }
        }
    }
}
