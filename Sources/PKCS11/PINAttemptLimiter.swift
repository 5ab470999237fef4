/// A retry limit for user PINs, kept by the keychain for tokens that keep none themselves.
///
/// SoftHSM2 accepts any number of wrong PINs. This value counts consecutive failures; once `limit` is
/// reached it stays locked until `reset()` (an administrator's act, like the token's SO unblocking
/// the user PIN). Storing it between processes is the caller's job.
///
/// - Important: weaker than a token's own counter: whoever can write the caller's store, or talk to
///   the module directly, can try PINs without it.
public struct PINAttemptLimiter: Sendable, Hashable, Codable {
    /// Consecutive wrong PINs so far.
    public private(set) var failures: Int
    /// Wrong PINs that lock; at least 1.
    public let limit: Int

    public init(limit: Int, failures: Int = 0) {
        precondition(limit >= 1, "a PIN attempt limit is at least 1")
        self.limit = limit
        self.failures = min(max(failures, 0), limit)
    }

    /// No PIN may be tried any more.
    public var isLocked: Bool { failures >= limit }
    /// Wrong PINs left before the lock.
    public var remaining: Int { limit - failures }

    /// A wrong PIN (the token said `CKR_PIN_INCORRECT`).
    public mutating func recordFailure() {
        failures = min(failures + 1, limit)
    }

    /// A PIN the token accepted: the count starts again, unless already locked.
    public mutating func recordSuccess() {
        if !isLocked { failures = 0 }
    }

    /// Unlocks after an administrator's intervention.
    public mutating func reset() {
        failures = 0
    }
}
