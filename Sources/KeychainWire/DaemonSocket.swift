#if canImport(Glibc)
import Glibc
#endif

/// Where keychaind is, by the one rule the library, `keychainctl` (both tools) and the Secret Service
/// provider share (docs/daemon.md, "Callers"): `KEYCHAIN_SOCKET` when set and not empty; else, when
/// `KEYCHAIN_STORE` is unset or empty, the system's socket if it exists; else nowhere (a store in the
/// process). A process that names its own store keeps it, even on a device where keychaind runs.
public enum DaemonSocket {
    /// keychaind's socket in the units of `dist/systemd/`.
    public static let system = "/run/keychain/keychaind.sock"

    /// The socket to use, or nil for a store in this process.
    /// - Parameters:
    ///   - variable: an environment variable's value (nil when unset).
    ///   - exists: whether something is at a path (keychaind's socket, when it runs).
    public static func resolve(variable: (String) -> String? = environmentVariable,
                               exists: (String) -> Bool = pathExists) -> String? {
        if let socket = variable("KEYCHAIN_SOCKET"), !socket.isEmpty { return socket }
        if let store = variable("KEYCHAIN_STORE"), !store.isEmpty { return nil }
        return exists(system) ? system : nil
    }

    /// The process's environment, by `getenv`.
    public static func environmentVariable(_ name: String) -> String? {
        getenv(name).map { String(cString: $0) }
    }

    /// Whether `stat` finds something at `path`.
    public static func pathExists(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0
    }
}
