import KeychainCore
import KeychainBasics
import Glibc
import FoundationEssentials
import Synchronization

/// A serial executor on its own thread: the engine's blocking SQLite and TPM calls run here, never
/// on Swift's shared cooperative pool (Linux has no `DispatchSerialQueue` executor). Also a task
/// executor, for tasks that must not wait for a pool thread (BiometricsVault's synchronous calls).
///
/// A dedicated thread of the caller's (keychaind's connection threads) may also run the jobs itself
/// while no one else does (`drive`): one thread at a time runs jobs, whichever it is, so the executor
/// stays serial, and a request needs no wake-up of the executor's thread and back.
package final class SerialThreadExecutor: SerialExecutor, TaskExecutor, @unchecked Sendable {
    private let condition = Condition()
    private var jobs: [(job: UnownedJob, enqueued: ContinuousClock.Instant)] = []
    /// Jobs that a running job enqueued (its call moving on: a hop back from the engine, the rest of a
    /// write's reply): they run before the next call's first job, so a call that began finishes before
    /// one queued after it can hold the executor in a TPM command (issue 38 item 13: a `set` that wrote
    /// at once answered 14 s later, its reply queued behind a later call's command to a stopped TPM).
    private var resumed: [(job: UnownedJob, enqueued: ContinuousClock.Instant)] = []
    /// When the job running now was enqueued: the start of its wait for this executor. Written by the
    /// thread that runs jobs before each one, read by that job (`waitedSinceEnqueued`).
    private var runningEnqueued = ContinuousClock.now
    /// The thread inside a job now (set and cleared under the lock): a job it enqueues is the same
    /// call moving on (a task hopping from its nonisolated code onto the engine), and keeps the
    /// time the call was enqueued, so a call's wait behind others counts once, not from each hop.
    private var jobThread: pthread_t?
    /// Calls that driving threads are starting or resuming now (`drive(_:madeAt:until:)`), by thread:
    /// what such a thread enqueues counts from when its call was made, not from now.
    private var madeAt: [pthread_t: ContinuousClock.Instant] = [:]
    /// A thread (the executor's or a driver) is running jobs: only it takes more.
    private var running = false
    private var stopping = false
    private var ended = false

    /// Whether the thread has ended (after `stop()`).
    package var hasEnded: Bool {
        condition.withLock { ended }
    }

    /// The thread holds the executor until `stop()` lets it end.
    package init(name: String) {
        let failed = DetachedThread.start(name: name) { self.run() }
        precondition(failed == nil, "cannot start the executor's thread \(name): pthread_create: errno \(failed ?? 0)")
    }

    /// Ends the thread once the jobs already enqueued have run (its owner is gone: none can come).
    package func stop() {
        condition.withLock {
            stopping = true
            condition.signal()
        }
    }

    /// How long the job running now waited for this executor and has run since: from the moment the
    /// call (or its resumption) was enqueued, so a call's TPM deadline counts the time it spent queued
    /// behind others (`Engine.withKeyring`). Only from a job running on this executor.
    package func waitedSinceEnqueued() -> Duration { ContinuousClock.now - runningEnqueued }

    /// When the call of the job running now was made (its first job enqueued): the same for each of
    /// its jobs, so it names the call (`Engine.withKeyring`). Only from a job running on this executor.
    package var callMadeAt: ContinuousClock.Instant { runningEnqueued }

    package func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let now = ContinuousClock.now
        condition.lock()
        let inJob = jobThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false
        if inJob {
            resumed.append((unowned, runningEnqueued))
        } else {
            jobs.append((unowned, madeAt[pthread_self()] ?? now))
        }
        // Whoever runs jobs now takes this one too; only an idle executor wakes its thread.
        if !running { condition.signal() }
        condition.unlock()
    }

    /// Calls `start` (which enqueues work, e.g. makes a task that prefers this executor) and, when no
    /// other thread is running jobs and none is queued, runs them on the calling thread until none is left or `done`
    /// says the caller has its own work back (the rest go to the executor's thread: a driver does
    /// not keep its own client waiting while it serves others).
    ///
    /// - Parameter madeAt: when the call that `start` starts or resumes was made: its jobs count their
    ///   wait from then (`waitedSinceEnqueued`), so time it waited before reaching the executor (its
    ///   uid's turn in keychaind) is part of its TPM deadline.
    /// - Important: only from a thread of the caller's own, never from Swift's shared pool: the jobs
    ///   block (SQLite, TPM) as they would on the executor's thread.
    package func drive(_ start: () -> Void, madeAt: ContinuousClock.Instant? = nil, until done: () -> Bool = { false }) {
        let thread = pthread_self()
        condition.lock()
        self.madeAt[thread] = madeAt
        // Jobs left by the last driver are its thread's, woken for them: a driver runs its own call's
        // first, so it can give that call up at its deadline rather than block in another's TPM command.
        let driving = !running && jobs.isEmpty && resumed.isEmpty
        if driving { running = true }
        condition.unlock()
        start()  // when another thread runs jobs, it takes the new ones
        condition.lock()
        self.madeAt[thread] = nil
        condition.unlock()
        if driving { runJobs(until: done) }
    }

    /// Whether the calling thread is an executor's own: its jobs may block (it is there for that), so
    /// a task that prefers it waits for keychaind's replies on it (`DaemonClient.exchange`).
    package static var isOwnThread: Bool { pthread_getspecific(ownThreadKey) != nil }
    /// Whether the calling thread is this executor's own.
    package var isCurrent: Bool { pthread_getspecific(Self.ownThreadKey) == Unmanaged.passUnretained(self).toOpaque() }
    private static let ownThreadKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    private func run() {
        pthread_setspecific(Self.ownThreadKey, Unmanaged.passUnretained(self).toOpaque())
        while true {
            condition.lock()
            while running || (jobs.isEmpty && resumed.isEmpty && !stopping) { condition.wait() }
            if jobs.isEmpty && resumed.isEmpty {
                ended = true
                condition.unlock()
                return
            }
            running = true
            condition.unlock()
            runJobs(until: { false })
        }
    }

    /// Runs jobs while there are any and `done` is false, then gives the executor back: jobs left go
    /// to its thread, and the next enqueue wakes it. The caller set `running`.
    private func runJobs(until done: () -> Bool) {
        var batch: [(job: UnownedJob, enqueued: ContinuousClock.Instant)] = []
        var next = 0
        while true {
            let stop = done()
            condition.lock()
            jobThread = nil
            if stop && next < batch.count {
                jobs.insert(contentsOf: batch[next...], at: 0)
                (batch, next) = ([], 0)
            }
            if next == batch.count && (resumed.isEmpty || stop) {
                if (jobs.isEmpty && resumed.isEmpty) || stop {
                    running = false
                    if !jobs.isEmpty || !resumed.isEmpty || stopping { condition.signal() }  // the thread takes them, or ends
                    condition.unlock()
                    return
                }
                (batch, next) = (jobs, 0)
                jobs.removeAll(keepingCapacity: true)
            }
            let job: UnownedJob, enqueued: ContinuousClock.Instant
            if resumed.isEmpty {
                (job, enqueued) = batch[next]
                next += 1
            } else {
                (job, enqueued) = resumed.removeFirst()
            }
            runningEnqueued = enqueued
            jobThread = pthread_self()
            condition.unlock()
            job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor())
        }
    }
}
