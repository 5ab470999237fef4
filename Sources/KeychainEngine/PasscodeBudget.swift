import KeychainCore
import FoundationEssentials
import KeychainStore

/// The wrong passcodes keychaind lets users who are neither root nor `admin` give: each such uid at
/// most `perUser`, and all of them together at most the TPM's limit less `reserve`, so that no one
/// of them (nor all of them) can spend the TPM's PIN tries and lock the device's owner out. The TPM's
/// count never goes down by itself (only `passcode reset-tries` resets it), so neither do these.
struct PasscodeBudget: Codable, Equatable {
    /// Wrong passcodes each uid has given through the daemon since the last reset, by uid.
    var failures: [String: Int] = [:]

    static let perUser = 3
    /// Tries of the TPM's that only root and `admin` may spend.
    static let reserve: UInt32 = 2

    static func load(_ store: Store) throws -> PasscodeBudget {
        guard let bytes = try store.meta(StoreMeta.passcodeBudget) else { return PasscodeBudget() }
        guard let budget = try? JSONDecoder().decode(PasscodeBudget.self, from: Data(bytes)) else {
            throw KeychainError(.dataCorrupted, "The store's record of wrong passcodes per user (\(StoreMeta.passcodeBudget)) "
                                + "cannot be read: reset the tries (keychainctl passcode reset-tries) to write it again")
        }
        return budget
    }

    func save(_ tx: Transaction) throws {
        try tx.setMeta(StoreMeta.passcodeBudget, Array(try JSONEncoder().encode(self)))
    }
}

extension Engine {
    /// Runs one passcode `attempt` (an unlock, or a read's passcode answer) for `caller`: refused with
    /// `LOCKOUT` before the TPM when the caller's budget is spent, and charged before it runs (a kill
    /// during the attempt leaves it counted), given back unless the TPM found the passcode wrong.
    /// Root and `admin` spend the TPM's own tries, as in-process. On a bound store each change of
    /// the budget is a counted write: a snapshot of the store put back is refused as a rollback,
    /// never a spent budget given back.
    func spendingPasscodeBudget<T>(of caller: Caller?, _ attempt: () throws(KeychainError) -> T) throws(KeychainError) -> T {
        guard let caller, !caller.isAdmin() else { return try attempt() }
        let store = try store()
        let uid = String(caller.uid)
        var budget = try read { try PasscodeBudget.load(store) }
        let pool = Int(configuration.passcodeRetryLimit.subtractingReportingOverflow(PasscodeBudget.reserve).partialValue)
        let spent = budget.failures.values.reduce(0, +)
        if budget.failures[uid, default: 0] >= PasscodeBudget.perUser {
            throw KeychainError(.lockout, "uid \(caller.uid) gave \(PasscodeBudget.perUser) wrong passcodes through the keychain service, "
                                + "its limit (the TPM allows \(configuration.passcodeRetryLimit) for the whole device): an administrator "
                                + "resets the tries (keychainctl passcode reset-tries)")
        }
        if spent >= min(pool, Int(configuration.passcodeRetryLimit) - 1) {
            throw KeychainError(.lockout, "Users other than root and the group 'admin' gave \(spent) wrong passcodes through the "
                                + "keychain service, all they may of the TPM's \(configuration.passcodeRetryLimit): an administrator "
                                + "resets the tries (keychainctl passcode reset-tries)")
        }
        budget.failures[uid, default: 0] += 1
        try writeStore(store) { [budget] tx in try budget.save(tx) }
        do throws(KeychainError) {
            let result = try attempt()
            budget.failures[uid, default: 1] -= 1
            if budget.failures[uid] == 0 { budget.failures[uid] = nil }
            try writeStore(store) { [budget] tx in try budget.save(tx) }
            return result
        } catch where error.code != .authenticationFailed {
            budget.failures[uid, default: 1] -= 1
            if budget.failures[uid] == 0 { budget.failures[uid] = nil }
            _ = try? writeStore(store) { [budget] tx in try budget.save(tx) }
            throw error
        }
    }

    /// `passcode reset-tries` resets the TPM's count: every user's budget starts again.
    func resetPasscodeBudgets() throws(KeychainError) {
        let store = try store()
        _ = try writeStore(store) { try $0.deleteMeta(StoreMeta.passcodeBudget) }
    }
}

extension KeychainError.Code {
    /// Linux, keychaind: the caller's Unix identity may not do this (not a member of the storage's
    /// access group; a device-wide change by someone neither root nor in the `admin` group).
    public static let accessDenied = KeychainError.Code(rawValue: "ACCESS_DENIED")
}
