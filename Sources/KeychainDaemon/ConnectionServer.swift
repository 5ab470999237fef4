import KeychainEngine
import Glibc
import Synchronization

/// Every socket keychaind listens on (its doors: the keychain API's, systemd credentials') is served by
/// this one accept loop, so that a new door cannot be born without what the first one learned: the
/// peer's credentials and application taken at accept (`CallerIdentity.ofPeer`, once per connection;
/// a peer that exited before it could be told apart is refused), one slot per connection counted per
/// uid and in all across every door (`Limits.refusal`: the slots are descriptors and threads, which
/// every door spends alike), a thread whose failed start is seen, a write deadline on every
/// connection, and a log that one uid cannot flood (`DaemonLog.say(_:uid:)`).
///
/// - Important: a door's `refuse` runs on the accept loop and must not wait on its client; what a
///   door writes in its own time (`serve`) is bounded by the socket's deadlines and holds the slot
///   meanwhile, so one uid holds at most its quarter of the slots, each for at most that long.
package final class ConnectionServer: Sendable {
    /// One socket's part: what a connection is served, and how it is told that it is not.
    package struct Door: Sendable {
        /// For the log: "credentials socket".
        package var name: String
        /// Serves one connection on a thread of its own, in a slot; the server closes `fd` after.
        package var serve: @Sendable (_ fd: Int32, _ peer: Peer) -> Void
        /// Tells a connection that nothing will serve it (`reason`), without waiting on its client; the
        /// server closes `fd` after.
        package var refuse: @Sendable (_ fd: Int32, _ reason: KeychainError) -> Void
        /// Whether the door's calls depend on the caller's application (`CallerIdentity`): the keychain
        /// socket's do; the credentials socket's caller is a service manager, named by its address.
        package var tellsApplications: Bool

        package init(name: String, tellsApplications: Bool, serve: @escaping @Sendable (Int32, Peer) -> Void,
                     refuse: @escaping @Sendable (Int32, KeychainError) -> Void) {
            (self.name, self.tellsApplications, self.serve, self.refuse) = (name, tellsApplications, serve, refuse)
        }
    }

    let limits: DaemonServer.Limits
    /// Open connections of every door, in all and per uid.
    private let open = Mutex<(total: Int, byUser: [UInt32: Int])>((0, [:]))

    init(limits: DaemonServer.Limits) { self.limits = limits }

    /// Accepts connections on `listener` forever, each served by `door` on a thread of its own.
    package func serve(listener: Int32, door: Door) -> Never {
        var starved = false
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                let code = errno
                if code == EMFILE || code == ENFILE || code == ENOMEM {
                    // Out of descriptors: let connections end rather than spin; said once, then counted.
                    DaemonLog.say("keychaind: \(door.name): accept: errno \(code) (\(String(cString: strerror(code)))); "
                                  + "waiting for connections to end")
                    starved = true
                    usleep(50_000)
                }
                continue
            }
            if starved {
                DaemonLog.settle()
                starved = false
            }
            // Keychaind starts no programs, but the embedded TPM's swtpm must not inherit a client.
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            guard var peer = Peer(socket: fd) else { close(fd); continue }
            do throws(KeychainError) {
                if door.tellsApplications {
                    peer.application = try CallerIdentity.ofPeer(socket: fd, uid: peer.uid, pid: peer.pid).application
                }
            } catch {
                // Never served as its uid's unconfined caller instead (docs/security.md).
                refuse(fd, peer, error, door: door)
                continue
            }
            let uid = peer.uid
            let full = open.withLock { count -> KeychainError? in
                if let refusal = limits.refusal(open: count.total, openOfUser: count.byUser[uid, default: 0], uid: uid) { return refusal }
                count.total += 1
                count.byUser[uid, default: 0] += 1
                return nil
            }
            if let full {
                refuse(fd, peer, full, door: door)
                continue
            }
            // A write deadline on every connection: a client that stops reading holds its slot this long at most.
            var sendTimeout = timeval(tv_sec: limits.stallTimeout, tv_usec: 0)
            _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, socklen_t(MemoryLayout<timeval>.size))
            let started = DetachedThread.start(stackSize: DaemonServer.connectionStackSize) { [self, peer] in
                door.serve(fd, peer)
                close(fd)
                release(uid)
            }
            if let code = started {
                // Under a task limit or memory pressure: said on the connection and its slot given back at
                // once, where Foundation's Thread.start failed unnoticed (the client waited, the slot was lost).
                refuse(fd, peer, KeychainError(.hardwareUnavailable, "keychaind cannot start a thread for this connection "
                    + "(pthread_create: errno \(code): its task limit or memory is exhausted); nothing was done: retry later",
                                               underlying: .errno(code)), door: door)
                release(uid)
            }
        }
    }

    /// A connection nothing will serve: the door's word, without waiting (non-blocking), closed, logged.
    private func refuse(_ fd: Int32, _ peer: Peer, _ reason: KeychainError, door: Door) {
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        door.refuse(fd, reason)
        close(fd)
        DaemonLog.say("keychaind: \(door.name): refused a connection of uid \(peer.uid) pid \(peer.pid): \(reason.message)", uid: peer.uid)
    }

    /// Gives a connection's slot back.
    private func release(_ uid: UInt32) {
        open.withLock { count in
            count.total -= 1
            count.byUser[uid, default: 1] -= 1
            if count.byUser[uid] == 0 { count.byUser[uid] = nil }
        }
    }
}
