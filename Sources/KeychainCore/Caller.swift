/// Who a call comes from, passed with each call of a service that serves many users (keychaind: the
/// kernel's `SO_PEERCRED`), for the budgets that are each user's own: the fingerprint reader's failed
/// matches and the wrong passcodes a user may give. nil in-process: there the caller is the store's owner.
package struct Caller: Sendable {
    package var uid: UInt32
    /// Root or a member of the access group `admin` (read only when a passcode is tried).
    package var isAdmin: @Sendable () -> Bool

    package init(uid: UInt32, isAdmin: @escaping @Sendable () -> Bool) {
        self.uid = uid
        self.isAdmin = isAdmin
    }

    /// The reader's failure count of this caller (`FingerprintReader`).
    package var readerAccount: String { "uid:\(uid)" }
}
