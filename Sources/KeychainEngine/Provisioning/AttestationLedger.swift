import KeychainCore
import FoundationEssentials
import Glibc
import KeychainBasics
import KeychainStore
import TPM2

/// The verifier's record of its open challenges (docs/provisioning.md): each nonce is answered once.
///
/// The state file is a document the server keeps, and a kept copy of it is as good as the file, so
/// the challenge's life cannot be in it. `open` records the nonce's SHA-256 when the challenge is
/// made; `spend` strikes it off once an answer verified, under a lock, and refuses a nonce the
/// ledger does not list: answered already (whatever copy of the state is given), expired, or
/// challenged by another verifier. A copy of the state brings no line back: only this directory,
/// which the verifier alone writes, holds them.
public struct AttestationLedger: Sendable {
    /// A private directory (0700): `open-challenges` and its lock.
    public let directory: String

    /// How long a challenge stays open; older lines are dropped at each change.
    public static let lifetime: TimeInterval = 7 * 24 * 3600
    /// The most challenges open at once (about 80 bytes each): more is refused until some are answered or expire.
    public static let capacity = 100_000

    public init(directory: String) { self.directory = directory }

    /// `$XDG_STATE_HOME/keychain/attestation`, else `$HOME/.local/state/keychain/attestation`.
    public static func defaultDirectory(environment: [String: String]) -> String {
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/keychain/attestation" }
        return (environment["HOME"] ?? FileManager.default.homeDirectoryForCurrentUser.path) + "/.local/state/keychain/attestation"
    }

    /// Records the challenge of `state` as open.
    /// - Throws: `STORAGE_ERROR` when the ledger cannot be written (then the challenge is not to be sent).
    public func open(_ state: AttestationState) throws(KeychainError) {
        let key = try Self.key(state)
        try update { entries throws(KeychainError) in
            guard entries.count < Self.capacity else {
                throw KeychainError(.quotaExceeded, "The attestation ledger in \(directory) holds \(Self.capacity) open challenges: "
                                    + "answer some, or wait until they expire (after \(Int(Self.lifetime / 86_400)) days)")
            }
            entries.append((key, Int(state.created.timeIntervalSince1970)))
        }
    }

    /// Strikes the challenge of `state` off: call it once its answer verified, before trusting the identity.
    /// - Throws: `AUTHENTICATION_FAILED` when the challenge is not open (answered already, expired,
    ///   or made by another verifier).
    public func spend(_ state: AttestationState) throws(KeychainError) {
        let key = try Self.key(state)
        try update { entries throws(KeychainError) in
            guard let index = entries.firstIndex(where: { $0.key == key }) else {
                throw KeychainError(.authenticationFailed, "The answer does not verify: its challenge is not open in the attestation ledger "
                                    + "(\(directory)): it was answered already (a kept copy of the state does not open it again), it "
                                    + "expired after \(Int(Self.lifetime / 86_400)) days, or another verifier made it. Make a new challenge")
            }
            entries.remove(at: index)
        }
    }

    private static func key(_ state: AttestationState) throws(KeychainError) -> String {
        Hex.encode(sha256(try decoded(state.nonce, "state's nonce", count: 32)))
    }

    private var file: String { directory + "/open-challenges" }

    /// Reads the open challenges, drops the expired ones, applies `change` and writes them back
    /// (a new file renamed over the old), all under the ledger's lock.
    private func update(_ change: (inout [(key: String, created: Int)]) throws(KeychainError) -> Void) throws(KeychainError) {
        let what = "attestation ledger"
        do { try FileSystem.preparePrivateDirectory(directory, what: what) } catch { throw KeychainError(store: error) }
        let lock = Glibc.open(directory + "/lock", O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard lock >= 0 else { throw KeychainError(.storageError, "Cannot open \(directory)/lock", underlying: .errno(errno)) }
        defer { close(lock) }
        if case .failure(let code) = valueOrErrno({ flock(lock, LOCK_EX) }) {
            throw KeychainError(.storageError, "Cannot lock \(directory)/lock", underlying: .errno(code.rawValue))
        }
        let bytes: [UInt8]
        do { bytes = try FileSystem.readPrivateFile(file, what: what) ?? [] } catch { throw KeychainError(store: error) }
        var entries: [(key: String, created: Int)] = []
        for (number, line) in String(decoding: bytes, as: UTF8.self).split(separator: "\n").enumerated() {
            let fields = line.split(separator: " ")
            guard fields.count == 2, fields[0].count == 64, fields[0].allSatisfy(\.isHexDigit), let created = Int(fields[1]) else {
                throw KeychainError(.dataCorrupted, "The attestation ledger \(file) is not one this keychain wrote (line \(number + 1)): "
                                    + "restore it, or remove it and make new challenges")
            }
            entries.append((String(fields[0]), created))
        }
        let oldest = Int(Date().timeIntervalSince1970 - Self.lifetime)
        entries.removeAll { $0.created < oldest }
        try change(&entries)
        let temporary = directory + "/.open-challenges.\(getpid())"
        unlink(temporary)
        let text = entries.map { "\($0.key) \($0.created)\n" }.joined()
        do { _ = try FileSystem.createPrivateFile(temporary, Array(text.utf8), what: what) } catch { throw KeychainError(store: error) }
        guard rename(temporary, file) == 0 else {
            let code = errno
            unlink(temporary)
            throw KeychainError(.storageError, "Cannot replace \(file)", underlying: .errno(code))
        }
        // The rename made durable: after a crash, a spent challenge must not be open again.
        let parent = Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        let synced = parent >= 0 && fsync(parent) == 0
        let code = errno
        if parent >= 0 { close(parent) }
        guard synced else { throw KeychainError(.storageError, "Cannot write \(file) durably", underlying: .errno(code)) }
    }
}
