import Glibc
import FoundationEssentials
import Dispatch
import Synchronization

/// Bounds each exchange with a socket TPM (swtpm), which tpm2-tss 3.2 would wait on forever.
///
/// ESAPI's synchronous calls ignore `Esys_SetTimeout` (they set the timeout to -1 for their `_Finish`),
/// and the swtpm TCTI blocks in `read` whatever the timeout. So a timer shuts down this process's
/// sockets to the TPM's two addresses when an exchange takes too long: the blocked `read` sees
/// end-of-file and the TCTI fails with an I/O error.
/// - Important: a kernel device (`/dev/tpmrm0`) is bounded by the kernel driver's own timeouts;
///   tabrmd and other TCTIs are not bounded here.
///
/// An exchange can also block before it has a socket to shut down: tpm2-tss connects for each
/// command (and to the control socket when it sets up), and a stopped swtpm accepts nothing, so once
/// the connections of earlier timed-out calls fill its listen queues a blocking `connect` waits
/// until the TPM runs again (76 s against a 30 s deadline in the soak, issue 38 item 13). So the
/// timer also interrupts the exchange's thread with `SIGURG` (a handler that does nothing, installed
/// without `SA_RESTART`) when that thread is in `connect` (its `/proc/…/syscall`): `connect` fails
/// with `EINTR` and the TCTI with an I/O error. It fires again every 50 ms until the exchange ends,
/// for a `connect` begun just after a firing. Only `connect`: tpm2-tss 3.2's control command reads
/// its answer's length into an unsigned, so a `read` ended by `EINTR` (-1) passes for an answer.
/// - Important: `SIGURG` is unblocked on the exchange's thread while it runs and its pending signal
///   taken before `run` returns, so no `EINTR` reaches the caller's code after it.
///
/// One timer per connection, armed again for each exchange. A work item per exchange
/// (`asyncAfter`) stays queued in libdispatch until its time comes, cancelled or not: at a thousand
/// `status` calls a second (four TPM commands each, a 30 s deadline) keychaind held 120,000 of
/// them, grew by 2.8 KB a call and slowed to a third (issue 38 item 5).
final class AnswerDeadline {
    enum Peer: Hashable, Sendable {
        case unix(String)
        case tcp(port: UInt16)
    }

    /// How long each exchange may take; an operation sets its own (`TPMContext.setAnswerTimeout`).
    var timeout: Duration
    /// The deadline of the call the exchanges serve (keychaind's, counted from when it read the
    /// request): no exchange runs past it, however much of `timeout` it has left (issue 38 item 13).
    var until: ContinuousClock.Instant?
    let peers: Set<Peer>
    private let watch: Watch?

    init(device: TPMDevice, timeout: Duration) {
        self.timeout = timeout
        switch device {
        case .swtpmSocket(let path): peers = [.unix(path), .unix(path + ".ctrl")]
        // The address is loopback or a name; the port pair identifies the TPM well enough here.
        case .swtpm(_, let port): peers = [.tcp(port: UInt16(port)), .tcp(port: UInt16(port + 1))]
        default: peers = []
        }
        watch = peers.isEmpty ? nil : Watch(peers: peers)
    }

    deinit { watch?.end() }

    /// Runs `body`; whether the deadline passed while it ran (and the TPM's sockets were shut down).
    func run<T>(_ body: () -> T) -> (result: T, timedOut: Bool) {
        guard let watch else { return (body(), false) }
        Self.installInterruptHandler
        var interrupt = sigset_t(), previous = sigset_t()
        sigemptyset(&interrupt)
        sigaddset(&interrupt, SIGURG)
        // Threads of libdispatch's pool block most signals; the exchange's thread must take this one.
        pthread_sigmask(SIG_UNBLOCK, &interrupt, &previous)
        watch.arm(until.map { min(timeout, $0 - .now) } ?? timeout)
        let result = body()
        let timedOut = watch.disarm()
        if timedOut {
            // No firing sends after `disarm`; a signal sent before it is taken here, on the way back
            // from this system call, not in the caller's later ones.
            var pending = sigset_t()
            while sigpending(&pending) == 0 && sigismember(&pending, SIGURG) == 1 { sched_yield() }
        }
        pthread_sigmask(SIG_SETMASK, &previous, nil)
        return (result, timedOut)
    }

    /// A `SIGURG` handler that does nothing, without `SA_RESTART`: it only ends the blocking system
    /// call the exchange's thread is in. Installed once, unless the process has a handler of its own.
    private static let installInterruptHandler: Void = {
        var existing = sigaction()
        guard sigaction(SIGURG, nil, &existing) == 0, existing.__sigaction_handler.sa_handler == nil else { return }
        var action = sigaction()
        action.__sigaction_handler.sa_handler = { _ in }
        sigemptyset(&action.sa_mask)
        action.sa_flags = 0
        sigaction(SIGURG, &action, nil)
    }()

    /// Unchecked for `timer` alone: a dispatch source may be scheduled from any thread.
    private final class Watch: @unchecked Sendable {
        /// The armed exchange's deadline (nil between exchanges) and whether it passed. A firing
        /// meant for an earlier exchange, late, finds a deadline still ahead and does nothing.
        /// `thread` is the exchange's, interrupted at each firing once the deadline passed while it is
        /// in `connect`; `syscall` is its `/proc/<pid>/task/<tid>/syscall`.
        private let state = Mutex((deadline: ContinuousClock.Instant?.none, expired: false, thread: pthread_t?.none,
                                   syscall: String?.none))
        private let peers: Set<Peer>
        private let timer: any DispatchSourceTimer

        init(peers: Set<Peer>) {
            self.peers = peers
            timer = DispatchSource.makeTimerSource(queue: .global())
            timer.setEventHandler { [weak self] in self?.expire() }
            timer.activate()
        }

        func arm(_ timeout: Duration) {
            let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
            // Scheduled under the lock, so a late firing's `schedule` cannot replace this one.
            let syscall = Self.currentThreadSyscallFile()
            state.withLock {
                $0 = (ContinuousClock.now + timeout, false, pthread_self(), syscall)
                timer.schedule(deadline: .now() + seconds, leeway: .milliseconds(10))
            }
        }

        /// Ends the exchange; whether its deadline passed. The lock keeps a late firing from
        /// touching sockets after this.
        func disarm() -> Bool {
            state.withLock { state in
                state.deadline = nil
                state.thread = nil
                return state.expired
            }
        }

        func end() { timer.cancel() }

        /// `/proc/<pid>/task/<tid>/syscall` of the calling thread (`/proc/thread-self` names it).
        private static func currentThreadSyscallFile() -> String? {
            var buffer = [CChar](repeating: 0, count: 64)
            let count = readlink("/proc/thread-self", &buffer, buffer.count - 1)
            guard count > 0 else { return nil }
            return "/proc/" + String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) + "/syscall"
        }

        /// Whether the thread whose `syscall` file this is waits in `connect` (its first field is the
        /// system call's number while it is blocked in one).
        private static func isInConnect(_ syscall: String) -> Bool {
            #if arch(x86_64)
            let connect = "42"
            #elseif arch(arm64)
            let connect = "203"
            #else
            let connect = ""
            #endif
            let fd = open(syscall, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else { return false }
            defer { close(fd) }
            var buffer = [UInt8](repeating: 0, count: 32)
            let count = read(fd, &buffer, buffer.count)
            guard count > 0 else { return false }
            return buffer[..<count].split(separator: UInt8(ascii: " ")).first.map { String(decoding: $0, as: UTF8.self) } == connect
        }

        private func expire() {
            state.withLock { state in
                guard let deadline = state.deadline, ContinuousClock.now >= deadline, let thread = state.thread else { return }
                state.expired = true
                AnswerDeadline.shutDownSockets(to: peers)
                if let syscall = state.syscall, Self.isInConnect(syscall) { pthread_kill(thread, SIGURG) }
                timer.schedule(deadline: .now() + .milliseconds(50), leeway: .milliseconds(10))
            }
        }
    }

    /// Shuts down every socket of this process connected to one of `peers`.
    static func shutDownSockets(to peers: Set<Peer>) {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd") else { return }
        for fd in entries.compactMap(Int32.init) {
            var address = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let rc = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) }
            }
            guard rc == 0, let peer = peer(address), peers.contains(peer) else { continue }
            shutdown(fd, Int32(SHUT_RDWR))
        }
    }

    private static func peer(_ address: sockaddr_storage) -> Peer? {
        var address = address
        switch Int32(address.ss_family) {
        case AF_UNIX:
            return withUnsafeBytes(of: &address) { raw in
                let path = raw.load(as: sockaddr_un.self).sun_path
                return withUnsafeBytes(of: path) { .unix(String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)) }
            }
        case AF_INET:
            return withUnsafeBytes(of: &address) { .tcp(port: UInt16(bigEndian: $0.load(as: sockaddr_in.self).sin_port)) }
        case AF_INET6:
            return withUnsafeBytes(of: &address) { .tcp(port: UInt16(bigEndian: $0.load(as: sockaddr_in6.self).sin6_port)) }
        default:
            return nil
        }
    }
}
