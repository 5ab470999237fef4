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
