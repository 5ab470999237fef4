import Synchronization

/// The deadline of the call a task serves, which bounds each of its waits for the TPM and each of
/// its TPM commands (docs/security.md: each call fails at its deadline, counted from when it was
/// made). keychaind sets it around a request's handling (`DaemonServer.respond`), counted from when
/// it read the request; a person's answer to a prompt is not part of it (`extend(by:)`).
///
/// Elsewhere (the library in-process) there is none, and an operation's TPM deadline counts from
/// when the call's first engine job was enqueued (`Engine.withKeyring`). Before (issue 38 item 13),
/// keychaind's calls had only that too: each TPM command of an operation got what was left when the
/// operation began, so an operation whose earlier commands the TPM answered slowly, or a later
/// operation of the same call, ran past the call's deadline (the soak's 43.6 s `set` may have been one).
package final class CallDeadline: Sendable {
    @TaskLocal package static var current: CallDeadline?

    private let end: Mutex<ContinuousClock.Instant>

    package init(_ end: ContinuousClock.Instant) { self.end = Mutex(end) }

    /// When the call fails if it has not ended.
    package var instant: ContinuousClock.Instant { end.withLock { $0 } }

    package var hasPassed: Bool { instant <= .now }

    /// Moves the deadline on by a wait that is not the call's (a person answering its prompt).
    package func extend(by wait: Duration) { end.withLock { $0 += wait } }
}
