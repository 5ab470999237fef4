import KeychainCore
import KeychainStore
import TPM2

extension KeychainError.Cause {
    static func tpm(_ error: TPMError) -> Self {
        .tpm(code: error.code.rawValue, name: "\(error.command): \(error.code)")
    }
}

extension KeychainError {
    /// SQLite and filesystem failures: the store is unusable or the disk refused; nothing was half-written.
    init(store error: StoreError) {
        let cause: Cause = if let code = error.sqliteExtendedCode ?? error.sqliteCode {
            .sqlite(code: code, message: error.message)
        } else if let errno = error.errno {
            .errno(errno)
        } else {
            .other(error.message)
        }
        switch error.kind {
        case .notThisStore:
            self.init(.dataCorrupted, error.message)
        case .untrusted:
            self.init(.storageError, error.message)
        case .invalidName:
            self.init(.invalidArgument, error.message)
        case .corrupt:
            self.init(.dataCorrupted, "The keychain database at \(error.path) is damaged: restore it from a backup",
                      underlying: cause)
        default:
            self.init(.storageError, error.message, underlying: cause)
        }
    }
}

extension KeychainError {
    /// A TPM that let a command's deadline pass (`KeychainConfiguration.tpmTimeout`).
    static func tpmDidNotAnswer(_ device: TPMDevice, timeout: Duration, _ error: TPMError) -> KeychainError {
        KeychainError(.hardwareUnavailable,
                      "The TPM at \(device) did not answer within \(timeout): check that it is running and not stopped "
                      + "(for the embedded software TPM: keychainctl tpm reboot)", underlying: .tpm(error))
    }
}
