import KeychainCore
import FoundationEssentials
import SecureMemory
import KeychainWire

/// Where a process's keychain lives: the store directory and the TPM behind it. A value; the
/// default comes from the environment (`KEYCHAIN_STORE`, `KEYCHAIN_TCTI`, then `TPM2TCTI`).
public struct KeychainConfiguration: Sendable {
    /// Which TPM seals the wrapping keys.
    public enum TPMSource: Sendable, Hashable {
        /// A TCTI configuration string: `device:/dev/tpmrm0`, `swtpm:path=…`, `swtpm:host=…,port=…`, `tabrmd:`;
        /// a malformed one is refused with `INVALID_ARGUMENT`.
        case tcti(String)
        /// A software TPM (swtpm) kept in the store directory and started on demand.
        case embedded
    }

    /// The seed's default service is the app's identifier: `KEYCHAIN_APP_ID`, else the systemd unit
    /// the process runs in (a desktop app's desktop file id, a service's unit name), else the desktop
    /// file id GLib launched (`ApplicationIdentity`). Nil when there is none: a storage made without
    /// a service is then `INVALID_ARGUMENT` (never the executable's name, which a rename changes).
    public var applicationIdentifier: String? = Self.defaultApplicationIdentifier

    /// The identifier this process has (`applicationIdentifier`), read from the environment and
    /// `/proc/self/cgroup`.
    public static var defaultApplicationIdentifier: String? {
        ApplicationIdentity.resolve(environment: ProcessInfo.processInfo.environment,
                                    cgroup: try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8))
    }

    /// The directory of the SQLite store (created 0700), made absolute when set: the embedded TPM's
    /// swtpm daemonizes into `/`, where a relative path names another place.
    public var storeDirectory: String { didSet { storeDirectory = Self.absolute(storeDirectory) } }
    public var tpm: TPMSource
    /// PCRs a `ThisDeviceOnly` wrapping key is bound to, as given (`--pcrs`), any of 0–15 (checked by
    /// `checkPCRSelection()` before a `ThisDeviceOnly` write or `initialize`). The store records the
    /// selection it is set up with (this one, PCR 7 when nil) and every later call uses that record:
    /// nil, the default, is the recorded one; another is refused (`INVALID_ARGUMENT` naming both).
    public var pcrSelection: [Int]?
    /// Wrong passcodes the TPM accepts before it refuses the passcode (its PIN index's limit).
    public var passcodeRetryLimit: UInt32
    /// The owner hierarchy's authorization set at device provisioning; nil for an empty one.
    public var ownerAuthorization: SecureBytes?
    /// The simulated fingerprint reader's directory (its own trust boundary, apart from the store);
    /// nil for a device without a reader.
    public var readerDirectory: String?
    /// Shows the prompt for reads behind an access control; without one such reads fail with
    /// `INTERACTION_NOT_ALLOWED`. `default`, `direct` and `daemon(socket:)` have the system's
    /// (`SystemAuthenticator`: the terminal, systemd's password agents).
    public var authenticator: (any Authenticator)?
    /// How long one TPM command may wait for the TPM's answer before the operation fails with
    /// `HARDWARE_UNAVAILABLE` (a stopped or hung software TPM; see `docs/security.md`).
    public var tpmTimeout: Duration = .seconds(30)
    /// The PKCS#11 token of `keyStorage: 'strongbox'` storages, an RFC 7512 URI with
    /// `module-path=` or `module-name=` and `pin-source=` (`KEYCHAIN_PKCS11_URI`).
    public var pkcs11URI: String?
    /// keychaind's socket (`KEYCHAIN_SOCKET`): when set, every call goes through the daemon, which
    /// owns the store and the TPM; the store, TPM and reader settings here are then unused. The same
    /// API, codes and messages; prompts still come to this configuration's `authenticator`.
    public var daemonSocket: String?
    /// keychaind only: whether its TPM connection keeps a salted session between operations and
    /// saves the wrapping keys' contexts at its start (docs/daemon.md, "The TPM connection"); nil
    /// in-process, where a connection lives for one call: never.
    package var tpmSession: TPMSessionMode?

    /// keychaind's `--tpm-session`: `auto` keeps the session where starting a salted one takes the TPM
    /// long enough to matter (a chip's ECDH; `TPMSessionMode.chipThreshold`), not on swtpm.
    package enum TPMSessionMode: String, Sendable {
        case auto, kept
        case perOperation = "per-operation"
        /// A salted StartAuthSession this slow is a chip's (33–100 ms measured, docs/tpm-profiles.md);
        /// swtpm's is about 1 ms of CPU.
        static let chipThreshold: Duration = .milliseconds(20)
    }

    public init(storeDirectory: String, tpm: TPMSource, pcrSelection: [Int]? = nil,
                passcodeRetryLimit: UInt32 = 10, ownerAuthorization: SecureBytes? = nil,
                readerDirectory: String? = nil, authenticator: (any Authenticator)? = nil) {
        self.readerDirectory = readerDirectory
        self.authenticator = authenticator
        self.storeDirectory = Self.absolute(storeDirectory)
        self.tpm = tpm
        self.pcrSelection = pcrSelection
        self.passcodeRetryLimit = passcodeRetryLimit
        self.ownerAuthorization = ownerAuthorization
    }

    /// Refuses PCRs that bind nothing: 16 and 23 are resettable by anyone (TPM2_PCR_Reset at locality 0),
    /// 17–22 by a dynamic launch; only 0–15 hold a boot state no process can take back.
    public func checkPCRSelection() throws(KeychainError) {
        guard let pcrSelection else { return }  // the store's, checked when it was recorded
        guard !pcrSelection.isEmpty else {
            throw .invalidArgument("Invalid PCR selection: empty; give at least one of PCRs 0–15 (default 7)")
        }
        for pcr in pcrSelection where !(0...15).contains(pcr) {
            let why = switch pcr {
            case 16: "PCR 16 is the debug PCR: any process can reset it, so it binds an item to nothing"
            case 23: "PCR 23 is the application PCR: any process can reset it, so it binds an item to nothing"
            case 17...22: "PCRs 17–22 are reset by a dynamic launch (DRTM) and hold no boot state"
            default: "a TPM has PCRs 0–23"
            }
            throw .invalidArgument("Invalid PCR selection \(pcrSelection): \(why); use PCRs 0–15 only (default 7)")
        }
    }

    /// The given selection when it passes `checkPCRSelection()`, sorted; nil when none was given (or
    /// one that binds nothing: the writes that need it refuse it).
    var validPCRSelection: [Int]? {
        guard let pcrSelection, (try? checkPCRSelection()) != nil else { return nil }
        return Array(Set(pcrSelection)).sorted()
    }

    /// For tests: inside `KeychainConfiguration.$taskDefault.withValue(configuration) { … }` (or
    /// KeychainTestSupport's `SimulatedDevice.asDefault`), `default` is `configuration`, so the app's
    /// `keychain`, `createKeychain(options)` and `KeychainDevice()` use it. A task-local: it holds for
    /// that task and the tasks it starts (not detached ones), so tests running in parallel each have theirs.
    @TaskLocal public static var taskDefault: KeychainConfiguration?

}

extension KeychainConfiguration {
    /// `path` against the current directory, once, at configuration time ("" stays: no store).
    static func absolute(_ path: String) -> String {
        path.isEmpty || path.hasPrefix("/") ? path : URL(fileURLWithPath: path).standardizedFileURL.path
    }

    /// `INVALID_ARGUMENT` naming the first setting of `other` that one engine cannot honour next to
    /// this one; nil when they can share it. The application identifier, reader directory,
    /// authenticator and token URI are read per call and may differ.
    func refusal(sharing other: KeychainConfiguration) -> KeychainError? {
        let differing: String? = if tpm != other.tpm { "tpm" }
            else if ownerAuthorization != other.ownerAuthorization { "ownerAuthorization" }
            else if pcrSelection != other.pcrSelection { "pcrSelection" }
            else if passcodeRetryLimit != other.passcodeRetryLimit { "passcodeRetryLimit" }
            else if tpmTimeout != other.tpmTimeout { "tpmTimeout" }
            else { nil }
        return differing.map {
            KeychainError(.invalidArgument, "This process already uses the store at \(storeDirectory) with another \($0): "
                          + "use one configuration per store (only the reader, authenticator, token URI and app identifier may differ)")
        }
    }
}
