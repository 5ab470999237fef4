import KeychainCore
import FoundationEssentials
import KeychainEngine
import KeychainWire

// The configurations the public API defaults to: they name keychaind's socket and the system prompter,
// which the engine does not know.
extension KeychainConfiguration {
    /// A configuration that reaches the keychain through keychaind at `socket`.
    public static func daemon(socket: String, authenticator: (any Authenticator)? = SystemAuthenticator()) -> KeychainConfiguration {
        var configuration = KeychainConfiguration(storeDirectory: "", tpm: .embedded, authenticator: authenticator)
        configuration.daemonSocket = socket
        return configuration
    }

    /// Read at each use: the task's `taskDefault` when set, else the environment:
    /// `KEYCHAIN_STORE` or `~/.local/share/keychain`; `KEYCHAIN_TCTI`, `TPM2TCTI`, `/dev/tpmrm0`,
    /// and the embedded software TPM when there is none of them. The reader is `KEYCHAIN_READER`
    /// (`none` for a device without one), or `<store>.reader`.
    /// keychaind (`daemon(socket:)`) by the rule keychainctl uses too: at `KEYCHAIN_SOCKET` when it is
    /// set, else at `systemSocket` when it exists and `KEYCHAIN_STORE` is not set (on a device where
    /// keychaind owns the store, an app reaches it without configuration).
    public static var `default`: KeychainConfiguration {
        if let taskDefault { return taskDefault }
        if let socket = DaemonSocket.resolve() { return .daemon(socket: socket) }
        return direct
    }

    /// keychaind's socket in the units of `dist/systemd/`.
    public static let systemSocket = DaemonSocket.system

    /// The environment's store and TPM in this process, as `default` without `KEYCHAIN_SOCKET`.
    public static var direct: KeychainConfiguration {
        let env = ProcessInfo.processInfo.environment
        let store = env["KEYCHAIN_STORE"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (env["HOME"] ?? FileManager.default.homeDirectoryForCurrentUser.path) + "/.local/share/keychain"
        let tcti = [env["KEYCHAIN_TCTI"], env["TPM2TCTI"]].compactMap { $0 }.first { !$0.isEmpty }
        let source: TPMSource = if let tcti {
            .tcti(tcti)
        } else if FileManager.default.fileExists(atPath: "/dev/tpmrm0") {
            .tcti("device:/dev/tpmrm0")
        } else {
            .embedded
        }
        let reader: String? = switch env["KEYCHAIN_READER"] {
        case "none": nil
        case let path? where !path.isEmpty: path
        default: store + ".reader"
        }
        var configuration = KeychainConfiguration(storeDirectory: store, tpm: source, readerDirectory: reader,
                                                  authenticator: SystemAuthenticator())
        configuration.pkcs11URI = env["KEYCHAIN_PKCS11_URI"].flatMap { $0.isEmpty ? nil : $0 }
        return configuration
    }
}
