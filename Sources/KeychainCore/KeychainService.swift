import SecureMemory

/// The keychain's item and device calls, one API for every front door: the engine in this process
/// (`LocalService`), keychaind over its socket (`DaemonClient`). `Keychain` and `KeychainDevice` hold
/// one; keychaind's `DaemonRequestHandler` maps each request to one.
///
/// What keychaind does not serve (backup and restore of the whole store, boot-state administration,
/// taking TPM ownership) is not here: it needs the store's engine.
package protocol KeychainService: Sendable {
    func setItem(_ key: String, _ value: SecureBytes, options: SetItemOptions?, in storage: StorageRef) async throws(KeychainError)
    /// - Parameter authenticator: asks the user when the item's access control needs it.
    func getItem(_ key: String, options: GetItemOptions?, in storage: StorageRef,
                 authenticator: (any Authenticator)?) async throws(KeychainError) -> SecureBytes?
    func hasItem(_ key: String, in storage: StorageRef) async throws(KeychainError) -> Bool
    func removeItem(_ key: String, in storage: StorageRef) async throws(KeychainError)
    func clear(_ storage: StorageRef) async throws(KeychainError)
    func allKeys(in storage: StorageRef) async throws(KeychainError) -> [String]
    /// The services of `storage`'s scope that hold items, sorted (the storage's own service aside).
    func allServices(in storage: StorageRef) async throws(KeychainError) -> [String]
    func itemInfo(_ key: String, in storage: StorageRef) async throws(KeychainError) -> ItemInfo?
    func canUseAccessControl(_ value: AccessControl, in storage: StorageRef) async throws(KeychainError) -> AccessControlCheck
    /// A read answered at once, on the caller's thread, when it needs no TPM, prompt or write (an item
    /// whose key was opened before); nil when it takes `getItem`. Never waits for a TPM command.
    func warmItem(_ key: String, in storage: StorageRef) -> WarmRead?
    /// Reads of several items of `storage` (keychaind: in one exchange), each as `getItem` would
    /// answer it: its outcomes in the order of `keys`.
    /// - Throws: only what fails the whole batch (keychaind cannot be reached).
    func getItems(_ keys: [String], in storage: StorageRef,
                  authenticator: (any Authenticator)?) async throws(KeychainError) -> [ItemRead]
    func endWindows(in storage: StorageRef) async throws(KeychainError)
    /// The AK's statement of the wrapping key of `storage`'s items of its options' protection
    /// (`Keychain.attestKey`): the key of `storage`'s scope only.
    func attestKey(nonce: [UInt8], in storage: StorageRef) async throws(KeychainError) -> KeyAttestation

    func enrollFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError)
    func removeFinger(_ name: String, passcode: SecureBytes?) async throws(KeychainError) -> Bool
    func deleteReader(passcode: SecureBytes?) async throws(KeychainError) -> Bool
    func enrolledFingers() async throws(KeychainError) -> [String]
    func biometryTypes() -> [BiometryType]
    func canUseAccessControl(_ value: AccessControl) async throws(KeychainError) -> AccessControlCheck
    func initialize() async throws(KeychainError) -> DeviceStatus
    func status() async throws(KeychainError) -> DeviceStatus
    func resetTokenPINTries() async throws(KeychainError)
    func tokenStatus() async throws(KeychainError) -> TokenStatus?
    func unlock(passcode: SecureBytes?) async throws(KeychainError)
    func lock() async throws(KeychainError)
    /// - Parameter old: nil sets a first passcode; `new` nil removes it.
    func setPasscode(old: SecureBytes?, new: SecureBytes?) async throws(KeychainError)
    func resetPasscodeTries() async throws(KeychainError)
    func takeTPMCommandCount() async -> Int
    func dropCaches() async
    /// The device's identity document (provisions the TPM and the store first, as `initialize` does).
    func identity() async throws(KeychainError) -> DeviceIdentity
    /// Imports a bundle sealed to this device into `scope` (keychaind: the caller's uid, whatever the
    /// scope passed), or into the system manager's credentials for a bundle made `--credential`.
    func importBundle(_ bundle: ProvisioningBundle, passcode: SecureBytes?, in scope: ItemScope) async throws(KeychainError) -> ImportOutcome
    /// The same service for one caller of a service that serves many users (keychaind's): its failures
    /// count against its own budgets.
    func serving(_ caller: Caller) -> any KeychainService
}

extension KeychainService {
    package func serving(_ caller: Caller) -> any KeychainService { self }

    /// One `getItem` after another.
    package func getItems(_ keys: [String], in storage: StorageRef,
                          authenticator: (any Authenticator)?) async throws(KeychainError) -> [ItemRead] {
        var reads: [ItemRead] = []
        for key in keys {
            do throws(KeychainError) {
                reads.append(.success(try await getItem(key, options: nil, in: storage, authenticator: authenticator)))
            } catch {
                reads.append(.failure(error))
            }
        }
        return reads
    }
}

/// One read of a batch (`KeychainService.getItems`): the value, nil for no item, or why it failed.
package typealias ItemRead = Result<SecureBytes?, KeychainError>

/// What a read answered at once found (`KeychainService.warmItem`).
package enum WarmRead: Sendable {
    case value(SecureBytes)
    case absent

    package var value: SecureBytes? { if case .value(let bytes) = self { bytes } else { nil } }
}
