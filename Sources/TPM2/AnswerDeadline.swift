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
struct AnswerDeadline: Sendable {
    enum Peer: Hashable, Sendable {
        case unix(String)
        case tcp(port: UInt16)
    }

    let timeout: Duration
    let peers: Set<Peer>

    init(device: TPMDevice, timeout: Duration) {
        self.timeout = timeout
        switch device {
        case .swtpmSocket(let path): peers = [.unix(path), .unix(path + ".ctrl")]
        // The address is loopback or a name; the port pair identifies the TPM well enough here.
        case .swtpm(_, let port): peers = [.tcp(port: UInt16(port)), .tcp(port: UInt16(port + 1))]
        default: peers = []
        }
    }

    /// Runs `body`; whether the deadline passed while it ran (and the TPM's sockets were shut down).
    func run<T>(_ body: () -> T) -> (result: T, timedOut: Bool) {
        guard !peers.isEmpty else { return (body(), false) }
        let watch = Watch(peers: peers)
        let item = DispatchWorkItem { watch.expire() }
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds, execute: item)
        let result = body()
        item.cancel()
        return (result, watch.finish())
    }

    private final class Watch: Sendable {
        /// (finished, expired); the lock keeps a late timer from touching sockets after `finish`.
        private let state = Mutex((finished: false, expired: false))
        private let peers: Set<Peer>
        init(peers: Set<Peer>) { self.peers = peers }

        func expire() {
            state.withLock { state in
                guard !state.finished else { return }
                state.expired = true
                AnswerDeadline.shutDownSockets(to: peers)
            }
        }

        func finish() -> Bool {
            state.withLock { state in
                state.finished = true
                return state.expired
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
