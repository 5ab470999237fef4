#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The one condition variable: a pthread mutex and its condition, for threads that wait until a state
/// is reached (`lock`, `wait` while it is not, `unlock`; `signal` or `broadcast` after changing it).
/// Plain mutual exclusion uses `Synchronization.Mutex`; this is for waiters only.
///
/// ThreadSanitizer intercepts pthread calls, so it sees the ordering this lock gives even when it is
/// contended (a contended `Mutex` is invisible to it: scripts/sanitizers/tsan.supp).
public final class Condition: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let variable = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    public init() {
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

    public func lock() { pthread_mutex_lock(mutex) }
    public func unlock() { pthread_mutex_unlock(mutex) }

    /// Runs `body` holding the lock.
    public func withLock<R, E: Error>(_ body: () throws(E) -> R) throws(E) -> R {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Unlocks, sleeps until signaled, locks again; the caller checks its state again (wake-ups may be spurious).
    public func wait() { pthread_cond_wait(variable, mutex) }
    public func signal() { pthread_cond_signal(variable) }
    public func broadcast() { pthread_cond_broadcast(variable) }

    /// As `wait`, but for no longer than until `deadline`; false once it has passed.
    public func wait(until deadline: ContinuousClock.Instant) -> Bool {
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
