internal import CTSS2

/// The transient objects and sessions one connection holds, as rust-tss-esapi's handle manager keeps
/// them: each is recorded when the TPM makes it, in the scope (`withTransient`) that made it, and
/// forgotten when it is flushed or when a command closed it (a session used with continueSession
/// clear). A scope's end flushes what it left, on every path: with no resource manager (swtpm has
/// three object slots), one leaked handle would make the next operation fail.
struct HandleManager {
    struct Record {
        var tr: UInt32
        /// The scope that made it: 0 outside every scope, `kept` for the connection's own session.
        var scope: Int
        /// False for a session started with continueSession clear: the first command it authorizes closes it.
        var continues: Bool
    }

    static let kept = -1
    private(set) var live: [Record] = []
    private(set) var depth = 0

    mutating func record(_ tr: UInt32, continues: Bool) {
        live.append(Record(tr: tr, scope: depth, continues: continues))
    }

    /// Forgets `tr`; false when it was not live (already flushed, or closed by the TPM).
    mutating func forget(_ tr: UInt32) -> Bool {
        guard let i = live.lastIndex(where: { $0.tr == tr }) else { return false }
        live.remove(at: i)
        return true
    }

    /// A command authorized by `sessions` succeeded: those started with continueSession clear are gone,
    /// and returned (ESAPI still holds its record of each until it is closed).
    mutating func authorized(_ sessions: [UInt32]) -> [UInt32] {
        taking { sessions.contains($0.tr) && !$0.continues }
    }

    mutating func keep(_ tr: UInt32) {
        if let i = live.lastIndex(where: { $0.tr == tr }) { live[i].scope = Self.kept }
    }

    /// Gives `tr`, made in the current scope, to the enclosing one.
    mutating func handOut(_ tr: UInt32) {
        if let i = live.lastIndex(where: { $0.tr == tr && $0.scope == depth }) { live[i].scope = depth - 1 }
    }

    mutating func enter() { depth += 1 }

    /// Leaves the current scope: what it left, newest first, to be flushed.
    mutating func leave() -> [UInt32] {
        let scope = depth
        depth -= 1
        return taking { $0.scope >= scope }
    }

    /// What no scope owns (made outside every scope, and the kept session): flushed when an operation ends.
    mutating func unscoped() -> [UInt32] { taking { $0.scope <= 0 } }

    mutating func all() -> [UInt32] { taking { _ in true } }

    private mutating func taking(_ matching: (Record) -> Bool) -> [UInt32] {
        let taken = live.filter(matching).map(\.tr).reversed()
        live.removeAll(where: matching)
        return Array(taken)
    }
}

extension TPMContext {
    /// Runs `body` in a scope of its own: every transient object and session made in it (by this
    /// context's commands) that is still live when it returns or throws is flushed then, newest first.
    public func withTransient<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        handles.enter()
        defer { flush(handles.leave()) }
        return try body()
    }

    /// As `withTransient`, but the object `kept` picks from what `body` returns outlives the scope: it
    /// belongs to the enclosing one. For an object loaded under a parent that is needed for a while only
    /// (the AK under the EK: three object slots), the parent goes when the scope ends.
    public func withTransient<T, E: Error>(keeping kept: (T) -> TPMHandle, _ body: () throws(E) -> T) throws(E) -> T {
        handles.enter()
        defer { flush(handles.leave()) }
        let result = try body()
        handles.handOut(kept(result).tr)
        return result
    }

    /// Flushes `handle` now (a slot needed before the scope ends); a handle not live is left alone.
    public func flush(_ handle: TPMHandle?) {
        guard let handle, handle.mustFlush, handles.forget(handle.tr) else { return }
        flush([handle.tr])
    }

    /// Records a transient object or session the TPM just made.
    func adopt(_ tr: ESYS_TR, continues: Bool = true) -> TPMHandle {
        handles.record(tr, continues: continues)
        return TPMHandle(tr: tr, mustFlush: true)
    }

    /// Keeps `handle` past every scope, until the operation ends (`endOperation`).
    func keep(_ handle: TPMHandle) { handles.keep(handle.tr) }

    /// Transient handles this connection holds now (tests check that an operation leaves none).
    public var liveTransientHandles: Int { handles.live.count }

    /// Flushes; never throws, so it can run on every error path.
    func flush(_ trs: [ESYS_TR]) {
        for tr in trs {
            do { try call("FlushContext") { Esys_FlushContext(esys, tr) } } catch {
                failedFlushes += 1
                closeResources([tr])  // forgotten here, and ESAPI's record of it would outlive it
            }
        }
    }

    /// Closes ESAPI's records of handles that the TPM no longer holds for this connection, or that
    /// nothing will flush: a successful FlushContext closes its own, nothing else does. Each record
    /// (about 700 bytes) stayed until the connection ended, and keychaind keeps its connection: a
    /// prompted read left two (issue 38 item 13, keychaind's memory rising 0.15 MiB/min under the soak).
    func closeResources(_ trs: [ESYS_TR]) {
        for tr in trs {
            var handle = tr
            _ = Esys_TR_Close(esys, &handle)
        }
    }
}
