import Foundation
internal import CSpawn
import KeychainWire
import Synchronization

/// Waits for keychaind's replies for async callers: one thread of this process sleeps in `epoll`
/// for every connection whose caller awaits a reply, and resumes the caller when its socket can be
/// read. The caller sends and reads on its own thread without waiting (`DaemonClient.exchange`),
/// so an exchange wakes this thread once and the caller's once, where a hop to a blocking thread
/// woke that thread for the request, again for the reply, and then the caller; and no thread of
/// Swift's shared pool ever blocks on the socket.
final class ReplyWaiter: @unchecked Sendable {
    /// One per process; nil when the kernel gives no epoll or eventfd descriptor (then exchanges
    /// hop to a blocking thread, as before).
    static let shared = ReplyWaiter()

    enum Readiness { case readable, timedOut, failed(Int32) }

    private struct Waiter {
        let continuation: CheckedContinuation<Readiness, Never>
        let deadline: ContinuousClock.Instant?
    }
    private struct State {
        var waiters: [Int32: Waiter] = [:]
        /// When the thread wakes by itself (the nearest deadline, or the end of an idle tick), nil
        /// when it sleeps until an event.
        var wakesAt: ContinuousClock.Instant?
        /// When the last waiter came.
        var lastWait = ContinuousClock.now
    }
    /// How long after the last waiter the thread still wakes by itself, then sleeps until one comes:
    /// the deadlines of the waiters that come meanwhile (`replyTimeout` ahead) are later than its
    /// wake-up, so they need no wake-up of their own.
    private static let idleTick = Duration.seconds(10)
    private let state = Mutex(State())
    private let epoll: Int32
    /// Written when a waiter's deadline comes before the thread would wake.
    private let wake: Int32

    private init?() {
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wake = eventfd(0, Int32(EFD_CLOEXEC | EFD_NONBLOCK))
        guard epoll >= 0, wake >= 0 else {
            if epoll >= 0 { close(epoll) }
            if wake >= 0 { close(wake) }
            return nil
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wake
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, wake, &event) == 0 else {
            close(epoll)
            close(wake)
            return nil
        }
        let thread = Thread { [self] in run() }
        thread.name = "keychain-replies"
        thread.start()
    }

    /// Until `fd` can be read (bytes, end of stream or an error are there) or `deadline` (nil: none).
    /// A wake-up may be spurious: the caller reads without waiting and asks again.
    func readable(_ fd: Int32, until deadline: ContinuousClock.Instant?) async -> Readiness {
        await withCheckedContinuation { continuation in
            let wakeThread = state.withLock { state in
                state.waiters[fd] = Waiter(continuation: continuation, deadline: deadline)
                state.lastWait = .now
                guard let deadline, state.wakesAt.map({ deadline < $0 }) ?? true else { return false }
                state.wakesAt = deadline
                return true
            }
            // One-shot: the event disarms the descriptor until the next wait arms it again.
            var event = epoll_event()
            event.events = EPOLLIN.rawValue | EPOLLRDHUP.rawValue | EPOLLONESHOT.rawValue
            event.data.fd = fd
            var armed = epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &event) == 0
            if !armed && errno == ENOENT { armed = epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) == 0 }
            if !armed {
                let code = errno
                // Whoever takes the waiter out resumes it (the thread may have timed it out already).
                state.withLock { $0.waiters.removeValue(forKey: fd) }?.continuation.resume(returning: .failed(code))
                return
            }
            if wakeThread {
                var one: UInt64 = 1
                _ = Glibc.write(wake, &one, 8)
            }
        }
    }

    private func run() -> Never {
        var events = [epoll_event](repeating: epoll_event(), count: 64)
        while true {
            let now = ContinuousClock.now
            let (expired, wakesAt) = state.withLock { state in
                var expired: [Waiter] = []
                for (fd, waiter) in state.waiters where waiter.deadline.map({ $0 <= now }) ?? false {
                    expired.append(waiter)
                    state.waiters[fd] = nil
                }
                if state.waiters.isEmpty {
                    let tickEnds = state.lastWait + Self.idleTick
                    state.wakesAt = tickEnds > now ? tickEnds : nil
                } else {
                    state.wakesAt = state.waiters.values.compactMap(\.deadline).min()
                }
                return (expired, state.wakesAt)
            }
            for waiter in expired { waiter.continuation.resume(returning: .timedOut) }
            let timeout = wakesAt.map { Self.milliseconds($0 - now) } ?? -1
            let count = epoll_wait(epoll, &events, Int32(events.count), timeout)
            guard count > 0 else { continue }  // the timeout, or EINTR
            for event in events[0..<Int(count)] {
                let fd = event.data.fd
                if fd == wake {
                    var value: UInt64 = 0
                    _ = Glibc.read(wake, &value, 8)
                    continue
                }
                state.withLock { $0.waiters.removeValue(forKey: fd) }?.continuation.resume(returning: .readable)
            }
        }
    }

    /// `epoll_wait`'s timeout for `duration`, rounded up so that the thread never wakes early.
    private static func milliseconds(_ duration: Duration) -> Int32 {
        guard duration > .zero else { return 0 }
        let (seconds, attoseconds) = duration.components
        return Int32(clamping: seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }
}
