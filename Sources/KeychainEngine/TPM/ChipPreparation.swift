import KeychainStore
import TPM2

/// What keychaind does at its start so that a chip's first read is short (issue 39, item 3;
/// docs/daemon.md, "The TPM connection"): the salted session kept, the wrapping keys' contexts saved.
extension Engine {
    /// Before "ready": decides whether this TPM is a chip (`configuration.tpmSession`) and, if so,
    /// starts the session every later Unseal's answer is encrypted by. - Returns: the line to log.
    func prepareKeptSession() throws(KeychainError) -> String? {
        guard let mode = configuration.tpmSession, mode != .perOperation else { return nil }
        return try withKeyring { keyring throws(KeychainError) -> String? in
            let context = keyring.context
            // Only a connection kept between operations can keep a session (not on /dev/tpm0).
            guard context.device.allowsAKeptConnection else { return nil }
            do throws(TPMError) {
                _ = try context.keptSession(saltKey: keyring.srk)
            } catch {
                throw KeychainError(.hardwareUnavailable, "The TPM refused keychaind's salted session", underlying: .tpm(error))
            }
            let took = context.saltedSessionTime ?? .zero
            let milliseconds = Int((Double(took.components.seconds) * 1e3 + Double(took.components.attoseconds) / 1e15).rounded())
            if mode == .auto && took < KeychainConfiguration.TPMSessionMode.chipThreshold {
                context.dropKeptSession()
                return nil
            }
            keepsTPMSession = true
            context.keepsSession = true
            return "keychaind: a salted StartAuthSession took the TPM \(milliseconds) ms: a salted session is kept "
                + "between operations and the wrapping keys' contexts are saved"
        }
    }

    /// The wrapping keys to save after "ready" (their TPM parts), at most `limit` of them (a bound on
    /// keychaind's memory and on the start's TPM time, 3 commands a key). Empty unless the session is kept.
    func wrappingKeysToSave(limit: Int) throws(KeychainError) -> [TPMContext.SealedBlob] {
        guard keepsTPMSession else { return [] }
        let store = try store()
        let records: [WrappingKeyRecord]
        do { records = try store.wrappingKeys(whereProtectionHasPrefix: "") } catch { throw KeychainError(store: error) }
        return records.lazy.filter { !$0.sealedPublic.isEmpty }.prefix(limit)
            .map { TPMContext.SealedBlob(publicArea: $0.sealedPublic, privateArea: $0.sealedPrivate) }
    }

    /// Load, ContextSave and FlushContext of one wrapping key, in an operation of its own so that
    /// requests are served between two. A key that does not load (removed since) is skipped.
    /// - Returns: whether its context was saved.
    func saveContext(of blob: TPMContext.SealedBlob) throws(KeychainError) -> Bool {
        guard keepsTPMSession, savedContexts[blob] == nil else { return false }
        return try withKeyring { keyring throws(KeychainError) -> Bool in
            let context = keyring.context
            context.outsideCrashPoints = true
            defer { context.outsideCrashPoints = false }
            // The object is flushed when the scope ends.
            return try context.withTransient { () throws(KeychainError) -> Bool in
                guard let object = try? context.load(blob, parent: keyring.srk) else { return false }
                do throws(TPMError) {
                    savedContexts[blob] = try context.saveContext(object)
                    return true
                } catch {
                    throw KeychainError(.hardwareUnavailable, "The TPM refused to save a wrapping key's context", underlying: .tpm(error))
                }
            }
        }
    }
}
