import KeychainCore
import Glibc
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

/// A simulated fingerprint reader: the stand-in for a sensor's secure element on a Linux device.
///
/// Its trust boundary is its own directory (0700), apart from the keychain's store: it holds an
/// HMAC-SHA256 key and the enrolled fingers. The TPM holds a verify-only copy of the key at a
/// persistent handle; when a finger matches, the reader signs the policy session's nonce with a
/// `policyRef` naming the key and, for `biometryCurrentSet` keys, today's enrollment set
/// (PolicySigned): any enrollment change makes the reader stop signing for those. After 5 failed
/// matches in a row the reader is locked out (`LOCKOUT`): it refuses every finger, and each touch
/// still counts; at 10 it is `LOCKOUT_PERMANENT`. Both last until the passcode is entered (a read
/// that the passcode opens, or an enrollment change). Through keychaind each uid has its own count
/// (an account): one user's wrong touches lock the reader for that user only.
///
/// - Important: whoever can read the reader's directory can sign as the reader. On a real device
///   that key lives in the sensor; here the directory must be the caller's own, 0700, and no one
///   else's files in it are trusted (`FileSystem.preparePrivateDirectory`).
final class FingerprintReader {
    static let lockoutAfter = 5
    static let permanentLockoutAfter = 10
    static let persistentHandles: ClosedRange<UInt32> = 0x8100_0010...0x8100_001F

    struct State: Codable {
        var hmacKey: [UInt8]
        var tpmHandle: UInt32
        var keyName: [UInt8]
        /// ESAPI's serialized handle of the persistent key: using it costs no TPM command.
        var keyTR: [UInt8]
        var fingers: [String: [UInt8]] = [:]
        var enrollmentSet: [UInt8]
        /// The failures of the in-process caller (the store's owner).
        var failures: Int = 0
        /// keychaind's callers' failures, by account (`Caller.readerAccount`); absent in older files.
        var accountFailures: [String: Int]? = nil
        /// How many enrollment changes this reader has had, which a bound store records after each
        /// (`Engine.checkedReader`): a copy of this file put back is behind it. Absent in older files.
        var generation: UInt64? = nil

        /// An enrollment change: the generation one further (and past `floor`, a bound store's record).
        mutating func changedEnrollment(past floor: UInt64 = 0) { generation = max(generation ?? 0, floor) + 1 }
    }

    let directory: String
    private(set) var state: State?

    init(directory: String) throws(KeychainError) {
        self.directory = directory
        state = try Self.load(directory)
    }

    var statePath: String { directory + "/reader.json" }
    var enrolled: [String] { (state?.fingers.keys).map { Array($0).sorted() } ?? [] }
    /// Today's enrollment set (what CurrentSet keys are sealed to); empty when nothing is enrolled.
    var enrollmentSet: [UInt8] { state?.enrollmentSet ?? [] }
    var keyName: [UInt8]? { state?.keyName }
    /// The enrollment changes counted in the file (0: none, or a file older than the count).
    var generation: UInt64 { state?.generation ?? 0 }

    enum Match: Equatable { case match, noMatch, lockout, permanentLockout }

    /// The lockout of `account` (nil: the in-process caller's), counting at least `recorded`
    /// failures (a bound store's record of them: `Engine.touch`).
    func lockState(of account: String? = nil, recorded: Int = 0) -> Match? {
        guard let current = state else { return nil }
        return Self.lockState(max(Self.failures(current, account), recorded))
    }

    private static func lockState(_ failures: Int) -> Match? {
        if failures >= permanentLockoutAfter { return .permanentLockout }
        if failures >= lockoutAfter { return .lockout }
        return nil
    }

    private static func failures(_ state: State, _ account: String?) -> Int {
        guard let account else { return state.failures }
        return state.accountFailures?[account] ?? 0
    }

    private static func setFailures(_ state: inout State, _ account: String?, _ count: Int) {
        guard let account else { state.failures = count; return }
        var map = state.accountFailures ?? [:]
        map[account] = count == 0 ? nil : count
        state.accountFailures = map.isEmpty ? nil : map
    }

    /// Reads a finger for `account` (nil: the in-process caller): a match if it is enrolled. Failed
    /// matches count toward that account's lockouts, from at least `recorded` (a bound store's
    /// record); `record` records a new count there. Crash-atomic: a failure is recorded before the
    /// file, so a kill in between leaves it counted; a match's reset goes to the file first (a kill
    /// then leaves a lockout standing, never one ended).
    func read(finger: String, account: String? = nil, recorded: Int = 0,
              record: (Int) throws(KeychainError) -> Void = { _ in }) throws(KeychainError) -> Match {
        guard var current = state else { return .noMatch }
        let failures = max(Self.failures(current, account), recorded)
        let locked = Self.lockState(failures)
        if locked == .permanentLockout { return .permanentLockout }
        // Touches during a lockout keep counting: ten in a row make it permanent.
        if locked == nil, current.fingers[finger] != nil {
            if failures != 0 {  // write only when the count changes
                Self.setFailures(&current, account, 0)
                try save(current)
                if recorded != 0 { try record(0) }
            }
            return .match
        }
        try record(failures + 1)
        Self.setFailures(&current, account, failures + 1)
        try save(current)
        return Self.lockState(failures + 1) ?? .noMatch
    }

    /// PolicySigned's policyRef for a key: SHA-256 of a domain string, the CurrentSet flag, the
    /// enrollment set (length-prefixed) and the key's own reference, so a signature or ticket
    /// stands for one key; for keys sealed before they had a reference, the enrollment set alone.
    /// Keys with a stored window add it (v2), so the window the reader checks is the key's own.
    static func policyRef(currentSet: Bool, enrollmentSet: [UInt8], keyRef: [UInt8]?, window: Int? = nil) -> [UInt8] {
        guard let keyRef else { return enrollmentSet }
        let set = UInt32(enrollmentSet.count).bigEndianBytes + enrollmentSet
        guard let window else { return sha256(Array("keychain-linux/reader-ref/v1".utf8), [currentSet ? 1 : 0], set, keyRef) }
        return sha256(Array("keychain-linux/reader-ref/v2".utf8), [currentSet ? 1 : 0], set, keyRef,
                      UInt32(clamping: window).bigEndianBytes)
    }

    /// Signs what PolicySigned verifies for a key sealed to this reader: for a CurrentSet key only
    /// today's enrollment set, and never with an expiration (its ticket would outlive an enrollment
    /// change, and the seed gives CurrentSet no authValidity window); for a key with a window, never
    /// an expiration longer than it (the window is in the policyRef signed, so the TPM binds the two).
    func sign(nonceTPM: [UInt8], for binding: SealPolicy.BiometryBinding, keyRef: [UInt8]?, window: Int? = nil,
              expiration: Int32 = 0) -> [UInt8]? {
        guard let current = state else { return nil }
        if binding.currentSet {
            guard binding.enrollmentSet == current.enrollmentSet, expiration == 0 else { return nil }
        } else {
            guard binding.enrollmentSet.isEmpty else { return nil }
        }
        if let window, Int(expiration.magnitude) > window { return nil }
        let policyRef = Self.policyRef(currentSet: binding.currentSet, enrollmentSet: binding.enrollmentSet, keyRef: keyRef,
                                       window: window)
        let key = SecureBytes(copying: current.hmacKey)
        return Sodium.hmacSHA256(key: key, message: TPMContext.policySignedDigest(nonceTPM: nonceTPM, expiration: expiration, policyRef: policyRef))
    }

    /// The passcode was entered: the lockout of `account` ends (through keychaind, the caller's);
    /// in-process (nil), and at an enrollment change, every account's.
    func resetLockout(account: String? = nil) throws(KeychainError) {
        guard var current = state else { return }
        if let account {
            guard Self.failures(current, account) != 0 else { return }
            Self.setFailures(&current, account, 0)
        } else {
            guard current.failures != 0 || current.accountFailures != nil else { return }
            current.failures = 0
            current.accountFailures = nil
        }
        try save(current)
    }

    /// Enrolls a finger (a new enrollment set); provisions the reader's TPM key on first use.
    func enroll(_ finger: String, keyring: TPMKeyring) throws(KeychainError) {
        guard !finger.isEmpty, finger.utf8.count <= 64 else {
            throw KeychainError.invalidArgument("Invalid finger name: expected 1 to 64 bytes")
        }
        var current: State
        if let existing = state { current = existing } else { current = try provision(keyring) }
        current.fingers[finger] = Sodium.randomBytes(32)
        current.enrollmentSet = Sodium.randomBytes(16)
        current.changedEnrollment()
        try save(current)
    }

    func remove(_ finger: String) throws(KeychainError) -> Bool {
        guard var current = state, current.fingers.removeValue(forKey: finger) != nil else { return false }
        current.enrollmentSet = current.fingers.isEmpty ? [] : Sodium.randomBytes(16)
        current.changedEnrollment()
        try save(current)
        return true
    }

    /// Removes every enrolled finger (the passcode's removal ends biometrics) and the lockout; the
    /// reader and its TPM key stay. Its generation goes past `floor` (the store's record), so even a
    /// copy put back is current once emptied. - Returns: whether a finger was enrolled.
    @discardableResult
    func removeAll(past floor: UInt64 = 0) throws(KeychainError) -> Bool {
        guard var current = state, !current.fingers.isEmpty || current.failures != 0 else { return false }
        let had = !current.fingers.isEmpty
        current.fingers = [:]
        current.enrollmentSet = []
        current.failures = 0
        if had { current.changedEnrollment(past: floor) }
        try save(current)
        return had
    }

    /// Deletes the reader: its state first (renamed away, then removed), then its TPM key, so a
    /// kill in between leaves a recorded key that the next enrollment evicts, never a reader
    /// without its key. - Returns: false when there was no reader.
    func delete(keyring: TPMKeyring) throws(KeychainError) -> Bool {
        guard let current = state else { return false }
        let retired = directory + "/.reader.json.deleted"
        guard rename(statePath, retired) == 0 else {
            throw KeychainError(.storageError, "Cannot remove \(statePath)", underlying: .errno(errno))
        }
        unlink(retired)
        state = nil
        try ReaderKeys(keyring: keyring).evict(handle: current.tpmHandle, name: current.keyName)
        return true
    }

    /// Makes the reader's TPM key persistent at the first free handle, recorded in the store first
    /// (`ReaderKeys`): keys of deleted readers and of killed enrollments are evicted before.
    private func provision(_ keyring: TPMKeyring) throws(KeychainError) -> State {
        let keys = ReaderKeys(keyring: keyring)
        try keys.reclaimOrphans()
        let key = SecureBytes(random: 32)
        let context = keyring.context
        let srk = keyring.srk
        let directory = URL(fileURLWithPath: directory).standardizedFileURL.path
        for handle in Self.persistentHandles {
            if (try? context.resource(forPersistent: handle)) != nil { continue }  // taken (another reader)
            // The session and the loaded key are flushed at the end of this scope.
            return try context.withTransient { () throws(KeychainError) -> State in
                let object: TPMHandle
                let name: [UInt8]
                do throws(TPMError) {
                    let session = try context.startSession(.hmac, saltKey: srk, decryptCommand: true, continueSession: true)
                    (object, name) = try context.loadVerificationKey(key, parent: srk, session: session)
                } catch {
                    throw keyring.diagnose(error, doing: "create the fingerprint reader's key")
                }
                try keys.record(.init(handle: handle, name: name, directory: directory))
                do throws(TPMError) {
                    try context.persist(object, at: handle)
                    let tr = try context.serialize(try context.resource(forPersistent: handle))
                    return State(hmacKey: key.withUnsafeBytes { Array($0) }, tpmHandle: handle, keyName: name, keyTR: tr,
                                 enrollmentSet: [])
                } catch {
                    throw keyring.diagnose(error, doing: "make the fingerprint reader's key persistent")
                }
            }
        }
        throw KeychainError(.hardwareUnavailable, "No free persistent handle for the fingerprint reader's key (0x81000010–0x8100001F)")
    }

    static let what = "fingerprint reader's directory"

    /// A reader directory or state planted by someone else (whose HMAC key they hold) is refused.
    private static func load(_ directory: String) throws(KeychainError) -> State? {
        let path = directory + "/reader.json"
        let bytes: [UInt8]?
        do {
            guard try FileSystem.checkPrivateDirectoryIfPresent(directory, what: what) else { return nil }
            bytes = try FileSystem.readPrivateFile(path, what: "the fingerprint reader's state")
        } catch {
            throw KeychainError(store: error)
        }
        guard let bytes else { return nil }
        guard let state = try? JSONDecoder().decode(State.self, from: Data(bytes)) else {
            throw KeychainError(.dataCorrupted, "The fingerprint reader's state at \(path) cannot be read")
        }
        return state
    }

    /// Atomic: a temporary file renamed over the old one, mode 0600 in a 0700 directory.
    private func save(_ new: State) throws(KeychainError) {
        do {
            try FileSystem.preparePrivateDirectory(directory, what: Self.what)
            let data = try JSONEncoder().encode(new)
            let temp = directory + "/.reader.json.\(getpid())"
            guard FileManager.default.createFile(atPath: temp, contents: data, attributes: [.posixPermissions: 0o600]) else {
                throw KeychainError(.storageError, "Cannot write \(temp)")
            }
            guard rename(temp, statePath) == 0 else {
                throw KeychainError(.storageError, "Cannot replace \(statePath)", underlying: .errno(errno))
            }
            state = new
        } catch let error as KeychainError {
            throw error
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.storageError, "Cannot save the fingerprint reader's state: \(error)")
        }
    }
}
