import Synchronization

/// The task's side of `handedOver`: `deliver` gives it the value made on another thread, once.
public struct Handover<Value: Sendable>: Sendable {
    fileprivate let slot: Slot<Value>
    fileprivate let continuation: CheckedContinuation<Void, Never>

    /// Gives the awaiting task `value` and resumes it. Call it exactly once.
    public func deliver(_ value: sending Value) {
        slot.value.withLock { $0 = value }
        continuation.resume()
    }
}

/// Suspends until `start`'s work, on a thread of its own choosing, delivers its value.
///
/// The value crosses through a lock, not through the continuation alone: ThreadSanitizer sees no
/// ordering between a continuation resumed before its task suspended and the task's next step (the
/// runtime's fast path; swiftlang/swift#57803), so every byte the other thread wrote (a connection's
/// buffer, a reply) is reported as raced. The lock makes the ordering visible to it, for one
/// uncontended lock and unlock a call.
public func handedOver<Value: Sendable>(_ start: (Handover<Value>) -> Void) async -> Value {
    let slot = Slot<Value>()
    await withCheckedContinuation { continuation in start(Handover(slot: slot, continuation: continuation)) }
    return slot.value.withLock { value -> Value in
        guard let delivered = value.take() else { preconditionFailure("handedOver: resumed without a value") }
        return delivered
    }
}

private final class Slot<Value: Sendable>: Sendable {
    let value = Mutex<Value?>(nil)
}
