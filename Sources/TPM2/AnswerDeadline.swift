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
        watch.arm(timeout)
        let result = body()
        return (result, watch.disarm())
    }

    /// Unchecked for `timer` alone: a dispatch source may be scheduled from any thread.
    private final class Watch: @unchecked Sendable {
        /// The armed exchange's deadline (nil between exchanges) and whether it passed. A firing
        /// meant for an earlier exchange, late, finds a deadline still ahead and does nothing.
        private let state = Mutex((deadline: ContinuousClock.Instant?.none, expired: false))
        private let peers: Set<Peer>
        private let timer: any DispatchSourceTimer

        init(peers: Set<Peer>) {
            self.peers = peers
            timer = DispatchSource.makeTimerSource(queue: .global())
            timer.setEventHandler { [weak self] in self?.expire() }
            timer.activate()
        }

        func arm(_ timeout: Duration) {
            state.withLock { $0 = (ContinuousClock.now + timeout, false) }
            let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
            timer.schedule(deadline: .now() + seconds, leeway: .milliseconds(10))
        }

        /// Ends the exchange; whether its deadline passed. The lock keeps a late firing from
        /// touching sockets after this.
        func disarm() -> Bool {
            state.withLock { state in
                state.deadline = nil
                return state.expired
            }
        }

        func end() { timer.cancel() }

        private func expire() {
            state.withLock { state in
                guard let deadline = state.deadline, ContinuousClock.now >= deadline, !state.expired else { return }
                state.expired = true
                AnswerDeadline.shutDownSockets(to: peers)
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
