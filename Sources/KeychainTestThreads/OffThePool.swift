import Foundation
import Synchronization
import KeychainBasics
// Swift Testing is in the toolchain's shared libraries only, not its static ones: a release build of
// every target with `--static-swift-stdlib` (scripts/package-deb.sh, docs/daemon.md) compiles this
// target without the trait, and only test bundles, which never link statically, use it.
#if canImport(Testing)
import Testing

/// Runs each test of a suite on threads of its own, never on Swift's cooperative pool: its
/// synchronous body, and an async body's jobs (the parts outside an actor), `async let` children
/// and task groups too.
///
/// The pool has as many threads as the machine has cores (two on the shared machine) for the whole
/// test process. A body that blocks (waiting for a child process, a swtpm, a socket) holds one of
/// them for as long as it blocks: two such bodies held both, and every async test's continuation
/// then waited (over four minutes, in a stalled run's thread dumps). Under this trait a body that
/// blocks holds only a thread of its test's.
///
///     @Suite(.offThePool) struct ProcessTests { … }
///
/// The pool also bounded, by accident, how many such tests ran at once (two); Swift Testing starts
/// every test together. Off the pool, at most `width` of them run at once (`KEYCHAIN_TEST_WIDTH`,
/// default two per core): 58 kill-sweep and prompt tests started together on two loaded cores made
/// processes wait past the TPM's 30 s deadline. A test waiting for its turn holds no thread.
///
/// - Important: on every suite whose tests block, in any test target: all of them share the test
///   process's pool.
public struct OffThePool: TestTrait, SuiteTrait, TestScoping {
    /// Every test of the suite, and of the suites inside it.
    public var isRecursive: Bool { true }

    public init() {}

    /// How many of the trait's tests run at once.
    static let width = ProcessInfo.processInfo.environment["KEYCHAIN_TEST_WIDTH"].flatMap { Int($0) }.map { max(1, $0) }
        ?? 2 * ProcessInfo.processInfo.activeProcessorCount
    private static let turns = Turns(width)
    /// Whether this task runs inside the scope of a test that has its turn (a test that starts a
    /// scope of its own, OffThePoolTests, does not wait for a second turn).
    @TaskLocal private static var hasTurn = false

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        let owned = !Self.hasTurn
        if owned { await Self.turns.take() }
        defer { if owned { Self.turns.give() } }
        let threads = OwnThreadsExecutor(name: "test " + test.name)
        defer { threads.stop() }
        try await Self.$hasTurn.withValue(true) {
            try await withTaskExecutorPreference(threads) { try await function() }
        }
    }
}

/// At most `count` holders at once; the others wait in order, suspended (holding no thread).
final class Turns: Sendable {
    private struct State {
        var free: Int
        var waiting: [CheckedContinuation<Void, Never>] = []
    }
    private let state: Mutex<State>

    init(_ count: Int) { state = Mutex(State(free: count)) }

    func take() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.free > 0 { state.free -= 1; return true }
                state.waiting.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    func give() {
        let next = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if state.waiting.isEmpty { state.free += 1; return nil }
            return state.waiting.removeFirst()
        }
        next?.resume()
    }
}

extension Trait where Self == OffThePool {
    /// The suite's tests (and the suites inside it) run on threads of their own, off the cooperative
    /// pool: for tests that block.
    public static var offThePool: Self { Self() }
}
#endif

/// A task executor that never makes a job wait for a thread: each job runs on an idle thread of the
/// executor's, or on a new one when every thread is busy (blocked in a job). A test's body may block
/// while its `async let` child still needs to run (a read whose prompt the body then answers): on
/// one serial thread that child would wait for the body for ever.
///
/// Threads end once `stop()` was called and no job is left; a job enqueued after it (an
/// unstructured task that outlived the test) still runs, on a thread that then ends.
public final class OwnThreadsExecutor: TaskExecutor, @unchecked Sendable {
    private let name: String
    private let condition = Condition()
    private var jobs: [UnownedJob] = []
    /// Threads waiting for a job; the jobs queued are theirs to take.
    private var idle = 0
    private var stopping = false
    /// The executor whose job the current thread runs (nil on any other thread).
    private static let current = ThreadLocalExecutor()

    public init(name: String) {
        self.name = name
    }

    /// Whether the calling thread is one of an `OwnThreadsExecutor`'s, running its job.
    public static var isCurrentThreadOwn: Bool { current.value != nil }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        let waiting = idle >= jobs.count
        if waiting { condition.signal() }
        condition.unlock()
        guard !waiting else { return }
        let thread = Thread { [self] in serve() }
        thread.name = name
        thread.start()
    }

    /// Lets the threads end once no job is left.
    public func stop() {
        condition.lock()
        stopping = true
        condition.broadcast()
        condition.unlock()
    }

    private func serve() {
        Self.current.value = self
        Self.nameThisThread()
        condition.lock()
        while true {
            if !jobs.isEmpty {
                let job = jobs.removeFirst()
                condition.unlock()
                job.runSynchronously(on: asUnownedTaskExecutor())
                condition.lock()
                continue
            }
            if stopping { break }
            idle += 1
            while jobs.isEmpty && !stopping { condition.wait() }
            idle -= 1
        }
        condition.unlock()
        Self.current.value = nil
    }
}

extension OwnThreadsExecutor {
    /// What the kernel calls these threads (`comm`, in `ps -L`, gdb and `/proc`): a new thread has
    /// its creator's name until then, the pool's (`…default-qos`) when a pool thread made it.
    public static let threadName = "off-pool test"

    /// Names the calling thread `threadName` (through procfs: glibc's `pthread_setname_np` is not in
    /// Swift's Glibc module).
    fileprivate static func nameThisThread() {
        let fd = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return }
        _ = Array(threadName.utf8).withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        close(fd)
    }
}

/// One thread-local pointer (pthread's key: Foundation's `threadDictionary` is not `Sendable`).
private final class ThreadLocalExecutor: @unchecked Sendable {
    private var key = pthread_key_t()

    init() { pthread_key_create(&key, nil) }

    var value: OwnThreadsExecutor? {
        get { pthread_getspecific(key).map { Unmanaged<OwnThreadsExecutor>.fromOpaque($0).takeUnretainedValue() } }
        set { pthread_setspecific(key, newValue.map { Unmanaged.passUnretained($0).toOpaque() }) }
    }
}
