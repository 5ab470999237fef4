import Glibc
import KeychainCore

/// The connection of the caller whose call a task serves (keychaind's, set around a request's
/// handling by `DaemonServer.respond`), so that a write is not made once its caller has gone.
///
/// keychaind serves a request it has read even when its client is gone (killed, exited), and a
/// request waits for its uid's turn and for the engine. Before, a client killed while its write
/// waited had that write made later, in its turn, and its turn could come after the write of the
/// program that took its place (the same app started again) had been made and acknowledged: the old
/// value came back (the soak's CI failure, 2026-12-07: a read found a value older than the last one
/// acknowledged). Now an item's write, its removal and a service's clearing check, inside their
/// transaction and just before it commits, that the caller still holds its connection; a caller that
/// closed it gets nothing made. Its successor starts after it ended, so every write of the caller
/// that is made is made before any of its successor's.
///
/// In-process callers (the library, the Secret Service provider) have none: they cannot be gone.
package final class CallerPresence: Sendable {
    @TaskLocal package static var current: CallerPresence?

    /// The connection's socket; it stays open while the call is served (`DaemonServer.serve(connection:)`
    /// closes it after the reply).
    private let socket: Int32

    package init(socket: Int32) { self.socket = socket }

    /// Whether the caller has closed its end of the connection: the socket's `POLLHUP`, which a Unix
    /// stream socket shows once its peer closed both directions (it exited or was killed). A client that
    /// only shut its sending side down (`SHUT_WR`) still waits for its reply: that is `POLLRDHUP` alone.
    package var hasLeft: Bool {
        var entry = pollfd(fd: socket, events: 0, revents: 0)
        return poll(&entry, 1, 0) == 1 && entry.revents & Int16(POLLHUP) != 0
    }

    /// Throws when the caller of the call this task serves has left: a write then makes nothing.
    package static func checkBeforeWriting() throws(KeychainError) {
        guard let current, current.hasLeft else { return }
        throw KeychainError(.systemCanceled, "The caller closed its connection before this write was made: nothing was written")
    }
}
