import KeychainCore
import Dispatch
import Glibc
import Synchronization
internal import CSpawn

/// The one sync-over-async bridge: runs `body` as a task (on `executor` when given, else on Swift's
/// pool) and blocks this thread until it ends.
/// - Important: only from a thread of its own (a connection's, a command's main thread, a synchronous
///   API's caller), never from Swift's pool or the executor `body` runs on: that would wait for itself.
package func waitFor<T: Sendable, E: Error>(on executor: (any TaskExecutor)? = nil,
                                            _ body: @escaping @Sendable () async throws(E) -> T) throws(E) -> T {
    let result = Mutex<Result<T, E>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task(executorPreference: executor) {
        let outcome: Result<T, E>
        do throws(E) { outcome = .success(try await body()) } catch { outcome = .failure(error) }
        result.withLock { $0 = outcome }
        done.signal()
    }
    done.wait()
    return try result.withLock { $0! }.get()
}

/// A thread of our own, made with pthread_create so that a failure is seen: Foundation's
/// `Thread.start` ignores it (the block never runs and nothing says so).
package enum DetachedThread {
    /// Runs `body` on a new detached thread; nil when it started, else pthread_create's error (EAGAIN
    /// under RLIMIT_NPROC or memory pressure), and `body` is not run.
    /// - Parameters:
    ///   - name: the thread's name in `ps` and debuggers; Linux keeps names of up to 15 bytes only.
    ///   - stackSize: nil for the default (RLIMIT_STACK, as Foundation's `Thread` had).
    package static func start(name: String? = nil, stackSize: Int? = nil, _ body: @escaping @Sendable () -> Void) -> Int32? {
        var attributes = pthread_attr_t()
        pthread_attr_init(&attributes)
        defer { pthread_attr_destroy(&attributes) }
        pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
        if let stackSize { pthread_attr_setstacksize(&attributes, stackSize) }
        let context = Unmanaged.passRetained(Body(name: name, run: body))
        var thread = pthread_t()
        let code = pthread_create(&thread, &attributes, { raw in
            let body = Unmanaged<Body>.fromOpaque(raw!).takeRetainedValue()
            if let name = body.name { pthread_setname_np(pthread_self(), name) }
            body.run()
            return nil
        }, context.toOpaque())
        guard code != 0 else { return nil }
        context.release()
        return code
    }

    private final class Body {
        let name: String?
        let run: @Sendable () -> Void
        init(name: String?, run: @escaping @Sendable () -> Void) { (self.name, self.run) = (name, run) }
    }
}

/// A pthread mutex and its condition variable, used as Foundation's `NSCondition` was: `lock`,
/// `wait` while a state is not reached, `signal` after changing it, `unlock`.
package final class Condition: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let variable = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    package init() {
        pthread_mutex_init(mutex, nil)
        // Timed waits count on the monotonic clock: a change of the wall clock neither ends nor stretches them.
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(variable, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    deinit {
        pthread_cond_destroy(variable)
        pthread_mutex_destroy(mutex)
        variable.deallocate()
        mutex.deallocate()
    }

    package func lock() { pthread_mutex_lock(mutex) }
    package func unlock() { pthread_mutex_unlock(mutex) }
    /// Unlocks, sleeps until signaled, locks again; the caller checks its state again (wake-ups may be spurious).
    package func wait() { pthread_cond_wait(variable, mutex) }
    package func signal() { pthread_cond_signal(variable) }
    package func broadcast() { pthread_cond_broadcast(variable) }
    /// As `wait`, but for no longer than until `deadline`; false once it has passed.
    package func wait(until deadline: ContinuousClock.Instant) -> Bool {
        let left = deadline - ContinuousClock.now
        guard left > .zero else { return false }
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        let nanoseconds = Int64(now.tv_nsec) + left.components.attoseconds / 1_000_000_000
        var until = timespec(tv_sec: now.tv_sec + Int(left.components.seconds) + Int(nanoseconds / 1_000_000_000),
                             tv_nsec: Int(nanoseconds % 1_000_000_000))
        pthread_cond_timedwait(variable, mutex, &until)
        return ContinuousClock.now < deadline
    }
}
