import FoundationEssentials
import Dispatch
public import Keychain
public import Observation
import Synchronization

/// Biometric sign-in for app and appliance code (seed: BiometricsVault), built only on the public
/// `Keychain` API: the credentials either in a plain keychain item (`keychainSecured`) or behind the
/// fingerprint reader (`biometricsSecured`, `locked`), with every transition of the seed, and the
/// seed's calls as written:
///
/// ```swift
/// let vault = BiometricsVault<Credentials>(key: "biometrics_credentials")
/// switch vault.state {
/// case .keychainSecured(let credentials): signIn(with: credentials)
/// case .locked: let credentials = try await vault.unlockWithBiometrics()   // the prompt
/// default: showSignIn()
/// }
/// ```
///
/// The calls the seed makes synchronous (`init`, `state`, `biometricsAvailable`,
/// `enableKeychainVault(saving:)`, `lock()`, `downgradeBiometricsToKeychain()`,
/// `disableBiometricsSecureVault()`, `resetEverything()`) never prompt; they wait for the keychain
/// on a thread of the vault's own, never on Swift's shared pool, so they are safe from any thread,
/// task or actor. Each one costs what its keychain calls cost (a store read and, the first time,
/// one TPM unseal: milliseconds; see docs/performance.md), so call them off a UI thread that must
/// not stall. The calls that may prompt are `async`.
///
/// The vault is `Observable` (Observation, as the seed's `ObservableObject` with a `@Published`
/// state): a SwiftUI view or `withObservationTracking` that read `state` or `biometricsAvailable`
/// is told when either changes, after the change, on the thread of the call that made it (never
/// with the vault's lock held, so the handler may read the vault). `states` is the same as an
/// `AsyncStream`.
///
/// A transition that is not allowed throws `VaultError` and changes nothing; one that fails in the
/// keychain (a canceled prompt, `KEY_INVALIDATED`) throws that `KeychainError` after the state was
/// settled to match what is stored. When locked, the credentials are not in memory.
public final class BiometricsVault<Credentials: Codable & Sendable>: Sendable, Observable {
    public let key: String
    typealias Machine = VaultStateMachine<Credentials>
    private let storages: Result<Storages, KeychainError>
    private let device: KeychainDevice
    private let shared = Mutex(Shared())
    private let registrar = ObservationRegistrar()

    private struct Storages: Sendable {
        let plain: Keychain
        let biometric: Keychain
    }

    /// What the vault's calls share, behind one lock.
    private struct Shared: Sendable {
        /// Nil until the stored state is first read (by `state`, or the first transition).
        var machine: Machine?
        /// A `state` read answered `unavailable` because the stored state could not be read: the
        /// first successful read is then a change.
        var answeredUnreadable = false
        /// The `states` streams, by id.
        var streams: [Int: AsyncStream<VaultState<Credentials>>.Continuation] = [:]
        var nextStream = 0
        /// What changed and is not yet told to the observers (`publish()`).
        var unpublished: Set<Observed> = []
        /// When the device last said whether biometrics can be used, and this process's count of
        /// device changes then (`KeychainDevice.availabilityChanges`).
        var availabilityAsked: (at: ContinuousClock.Instant, changes: Int)?

        /// Records `changed` for the observers; the streams get the new state now.
        mutating func changed(_ changed: Set<Observed>) {
            unpublished.formUnion(changed)
            if changed.contains(.state), let state = machine?.state {
                for stream in streams.values { stream.yield(state) }
            }
        }
    }

    /// The observable properties.
    private enum Observed: Sendable, Hashable { case state, biometricsAvailable }

    /// How long reads of `state` and `biometricsAvailable` reuse the device's last answer on
    /// biometrics: a UI bound to them reads at every frame, and each answer costs a TPM command
    /// in-process or a keychaind request (docs/performance.md, "The vault's state").
    static var availabilityLifetime: Duration { .seconds(1) }

    /// Touches nothing yet: the state is read from the keychain, without a prompt, on first use.
    /// - Parameters:
    ///   - key: the item's name in both storages.
    ///   - service: the plain storage's service; the biometric one is `service + ".biometrics"`.
    ///   - prompt: what the fingerprint prompt says.
    public init(key: String, service: String = "biometrics-vault",
                prompt: Prompt = .init(title: "Unlock your account", cancel: "Use password"),
                configuration: KeychainConfiguration = .default) {
        self.key = key
        device = KeychainDevice(configuration: configuration)
        do throws(KeychainError) {
            storages = .success(Storages(
                plain: try createKeychain(.init(service: service, accessible: .afterFirstUnlockThisDeviceOnly),
                                          configuration: configuration),
                biometric: try createKeychain(.init(service: service + ".biometrics", accessible: .whenUnlockedThisDeviceOnly,
                                                    accessControl: .biometryCurrentSet, prompt: prompt),
                                              configuration: configuration)))
        } catch {
            storages = .failure(error)
        }
    }

    deinit {
        for stream in shared.withLock({ $0.streams.values }) { stream.finish() }
    }

    /// The vault's state. The first read asks the keychain what is stored (no prompt); when that
    /// fails (no TPM, before the first unlock) it is `unavailable` and the next read asks again.
    /// In `ready` and `unavailable`, which only say whether biometrics can be used, a read asks the
    /// device again when `biometricsAvailable` would, so a finger enrolled meanwhile turns
    /// `unavailable` into `ready`.
    public var state: VaultState<Credentials> {
        registrar.access(self, keyPath: \.state)
        defer { publish() }
        if let machine = shared.withLock({ $0.machine }), !Self.followsAvailability(machine.state) { return machine.state }
        if let machine = machineWithRecentAvailability() { return machine.state }
        do {
            return try VaultThread.shared.wait { try await self.refreshedMachine() }.state
        } catch {
            // The last state known, or `unavailable` when the stored state was never read.
            return shared.withLock { s in
                if s.machine == nil { s.answeredUnreadable = true }
                return s.machine?.state ?? .unavailable
            }
        }
    }

    /// `ready` and `unavailable` store nothing: they only say whether biometrics can be used.
    private static func followsAvailability(_ state: VaultState<Credentials>) -> Bool {
        switch state {
        case .ready, .unavailable: true
        case .keychainSecured, .biometricsSecured, .locked: false
        }
    }

    /// Every state from now on: the current one first, then each change, in order. The stream ends
    /// when the vault goes or the consumer stops iterating.
    public var states: AsyncStream<VaultState<Credentials>> {
        let current = state
        let (stream, continuation) = AsyncStream<VaultState<Credentials>>.makeStream()
        let id = shared.withLock { s in
            defer { s.nextStream += 1 }
            // Read again under the lock: a change after `current` was read is yielded once, here or by `update`.
            continuation.yield(s.machine?.state ?? current)
            s.streams[s.nextStream] = continuation
            return s.nextStream
        }
        continuation.onTermination = { [weak self] _ in self?.shared.withLock { _ = $0.streams.removeValue(forKey: id) } }
        return stream
    }

    /// Whether the device can protect the credentials with biometrics now (a reader, an enrolled
    /// finger, a passcode, a prompt that reaches the user). Asked again, as the seed's
    /// `LAContext.canEvaluatePolicy`, at a read more than a second after the last answer or after
    /// this process changed the device (`KeychainDevice.enrollFinger`, …): after the user enrolls a
    /// finger the next read is true (within a second when another program enrolled it), and `ready`
    /// and `unavailable` follow. A transition and `refreshAvailability()` always ask. No prompt.
    public var biometricsAvailable: Bool {
        registrar.access(self, keyPath: \.biometricsAvailable)
        defer { publish() }
        if let machine = machineWithRecentAvailability() { return machine.biometricsAvailable }
        do {
            return try VaultThread.shared.wait { try await self.refreshedMachine() }.biometricsAvailable
        } catch {
            return shared.withLock { $0.machine?.biometricsAvailable } ?? false
        }
    }

    /// Whether the credentials are behind biometrics and in memory (seed: `biometricsEnabled`).
    public var biometricsEnabled: Bool { state.isBiometricsSecured }

    /// Asks the device again whether biometrics can be used, and tells the observers when it
    /// changed: for an app that observes the vault without reading it (call it when the app
    /// comes back to the foreground). Reading `biometricsAvailable` or `state` does the same.
    public func refreshAvailability() async {
        defer { publish() }
        _ = try? await refreshedMachine()
    }

    public func enableKeychainVault(saving credentials: Credentials) throws {
        defer { publish() }
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.enableKeychainVault(saving: credentials) }
        }
    }
    /// Stores the credentials behind biometrics "with biometric verification", as the seed's
    /// library: the copy is read back with the user's finger (the prompt) before the plain item is
    /// removed. A touch that fails or is canceled throws its code (`USER_CANCELED`,
    /// `AUTHENTICATION_FAILED`, `LOCKOUT`, …) after the copy was removed: the state stays
    /// `keychainSecured` and the plain item is untouched.
    public func upgradeKeychainWithBiometrics() async throws {
        defer { publish() }
        try await run(needingBiometrics: true) { (m: inout Machine) throws(VaultError) in try m.upgradeKeychainWithBiometrics() }
    }
    /// Stores the credentials behind biometrics and reads them back with the user's finger (the
    /// prompt), as the seed's library verifies first; a touch that fails or is canceled throws its
    /// code after they were removed again: the state stays `ready`.
    public func enableSecureVaultWithBiometrics(saving credentials: Credentials) async throws {
        defer { publish() }
        try await run(needingBiometrics: true) { (m: inout Machine) throws(VaultError) in
            try m.enableSecureVaultWithBiometrics(saving: credentials)
        }
    }
    /// Forgets the credentials in memory; needs no keychain operation.
    /// - Returns: true, as the seed's (which throws instead of returning false).
    @discardableResult
    public func lock() throws -> Bool {
        defer { publish() }
        try VaultThread.shared.wait { try await self.run { (m: inout Machine) throws(VaultError) in try m.lock() } }
        return true
    }
    /// The prompt; the credentials it opened.
    @discardableResult
    public func unlockWithBiometrics() async throws -> Credentials {
        defer { publish() }
        try await run { (m: inout Machine) throws(VaultError) in try m.unlockWithBiometrics() }
        guard let credentials = shared.withLock({ $0.machine?.state.credentials }) else {
            throw KeychainError(.internal, "The vault unlocked without credentials")
        }
        return credentials
    }
    /// Synchronous, as in the seed: the credentials are in memory (`biometricsSecured`), so the plain
    /// write and the removal need no prompt.
    public func downgradeBiometricsToKeychain() throws {
        defer { publish() }
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.downgradeBiometricsToKeychain() }
        }
    }
    /// Synchronous, as in the seed: removes the biometric item, no prompt.
    public func disableBiometricsSecureVault() throws {
        defer { publish() }
        try VaultThread.shared.wait {
            try await self.run { (m: inout Machine) throws(VaultError) in try m.disableBiometricsSecureVault() }
        }
    }
    /// Sign-out, or "change account": removes both items, from any state. It does not throw, as in
    /// the seed: a removal that fails leaves the state matching what is still stored.
    public func resetEverything() {
        defer { publish() }
        try? VaultThread.shared.wait { try await self.run { (m: inout Machine) throws(VaultError) in try m.resetEverything() } }
    }
    /// After a biometric lockout: the device passcode, which ends it; the vault stays `locked`.
    /// - Returns: true once the passcode was accepted.
    @discardableResult
    public func reauthenticateOwner() async throws -> Bool {
        defer { publish() }
        try await run { (m: inout Machine) throws(VaultError) in try m.reauthenticateOwner() }
        return true
    }

    // MARK: Driving the machine

    private func storagesOrThrow() throws(KeychainError) -> Storages {
        switch storages {
        case .success(let storages): storages
        case .failure(let error): throw error
        }
    }

    /// The machine, when the device's last answer on biometrics is recent (`availabilityLifetime`)
    /// and this process changed nothing of the device since.
    private func machineWithRecentAvailability() -> Machine? {
        shared.withLock { s in
            guard let machine = s.machine, let asked = s.availabilityAsked, asked.changes == KeychainDevice.availabilityChanges,
                  asked.at.duration(to: .now) < Self.availabilityLifetime else { return nil }
            return machine
        }
    }

    /// The device's answer on biometrics now, recorded for `machineWithRecentAvailability`.
    private func askAvailability() async throws -> Bool {
        let asked = (at: ContinuousClock.now, changes: KeychainDevice.availabilityChanges)
        let available = try await device.canUseAccessControl(.biometryCurrentSet).available
        shared.withLock { $0.availabilityAsked = asked }
        return available
    }

    /// The machine, started from what is stored (no prompt) on first use.
    private func startedAsync() async throws -> Machine {
        if let current = shared.withLock({ $0.machine }) { return current }
        let storages = try storagesOrThrow()
        let stored = Machine.Stored(
            keychainItem: try await storages.plain.getData(key).map { try JSONDecoder().decode(Credentials.self, from: $0) },
            biometricItemExists: try await storages.biometric.hasItem(key))
        let available = try await askAvailability()
        return shared.withLock { s in
            if s.machine == nil {
                let started = Machine(startupFound: stored, biometricsAvailable: available)
                s.machine = started
                if s.answeredUnreadable && started.state.kind != .unavailable { s.changed([.state]) }
            }
            return s.machine!
        }
    }

    /// The machine after asking the device whether biometrics can be used now (a machine started
    /// here has just asked).
    private func refreshedMachine() async throws -> Machine {
        if shared.withLock({ $0.machine == nil }) { return try await startedAsync() }
        let available = try await askAvailability()
        return try update { $0.biometricsAvailabilityChanged(available) }.machine
    }

    /// Changes the machine under the lock and records what the observers must be told; the
    /// `states` streams get the new state at once, in order.
    @discardableResult
    private func update<T: Sendable>(_ change: (inout Machine) throws(VaultError) -> T) throws(VaultError) -> (result: T, machine: Machine) {
        try shared.withLock { (s: inout Shared) throws(VaultError) in
            let before = s.machine!
            let result = try change(&s.machine!)
            let after = s.machine!
            var changed: Set<Observed> = []
            if after.state.kind != before.state.kind { changed.insert(.state) }
            if after.biometricsAvailable != before.biometricsAvailable { changed.insert(.biometricsAvailable) }
            s.changed(changed)
            return (result, after)
        }
    }

    /// Tells the observers what changed since the last call, outside the lock and off the vault's
    /// thread (each public call ends with it), so a handler may read the vault again.
    private func publish() {
        let changed = shared.withLock { s in
            defer { s.unpublished = [] }
            return s.unpublished
        }
        if changed.contains(.state) { registrar.withMutation(of: self, keyPath: \.state) {} }
        if changed.contains(.biometricsAvailable) { registrar.withMutation(of: self, keyPath: \.biometricsAvailable) {} }
    }

    /// Starts a transition, performs the machine's actions on the keychain, feeding back each
    /// outcome, until `.none`. The first keychain failure is rethrown once the machine has settled.
    /// - Parameter needingBiometrics: ask the device first, as the seed's library does before it
    ///   stores behind biometrics (a finger enrolled since the last read counts).
    private func run(needingBiometrics: Bool = false, _ start: (inout Machine) throws(VaultError) -> Machine.Action) async throws {
        if needingBiometrics { _ = try await refreshedMachine() } else { _ = try await startedAsync() }
        var action = try update(start).result
        func next(_ event: (inout Machine) throws(VaultError) -> Machine.Action) throws(VaultError) {
            action = try update(event).result
        }
        let storages = try storagesOrThrow()
        func storage(_ protection: VaultProtection) -> Keychain { protection == .keychain ? storages.plain : storages.biometric }
        var failure: KeychainError?
        while true {
            if case .none = action {
                if let failure { throw failure }
                return
            }
            do {
                switch action {
                case .none:
                    return
                case .store(let credentials, let protection):
                    try await storage(protection).setItem(key, try JSONEncoder().encode(credentials))
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                case .read(let protection):
                    let data = try await storage(protection).getData(key)
                    let credentials = try data.map { try JSONDecoder().decode(Credentials.self, from: $0) }
                    try next { m throws(VaultError) in try m.credentialsRead(credentials) }
                case .verify(let protection):
                    guard try await storage(protection).getData(key) != nil else {
                        throw KeychainError(.storageError, "The credentials just stored behind \(protection) were gone when read "
                                            + "back (removed by another process?); nothing moved")
                    }
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                case .remove(let protection):
                    try await storage(protection).removeItem(key)
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                case .authenticateOwner:
                    try await device.reauthenticateOwner()
                    try next { m throws(VaultError) in try m.operationSucceeded() }
                }
            } catch let error as KeychainError {
                failure = failure ?? error
                try next { m throws(VaultError) in try m.operationFailed(error.code) }
            } catch let error as DecodingError {
                let corrupted = KeychainError(.dataCorrupted, "The vault's credentials cannot be decoded: \(error)")
                failure = failure ?? corrupted
                try next { m throws(VaultError) in try m.operationFailed(corrupted.code) }
            }
        }
    }
}

/// The thread the synchronous calls wait on: their keychain work runs as a task on this executor
/// (and on the keychain engine's own thread), so waiting never needs a thread of Swift's shared
/// pool, which a caller on that pool may be holding.
enum VaultThread {
    static let name = "biometrics-vault"
    static let shared = SerialThreadExecutor(name: name)
}

extension SerialThreadExecutor {
    /// Runs `body` as a task on this thread and blocks the caller until it ends.
    func wait<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        precondition(!isCurrent, "a synchronous vault call from inside another")
        return try waitFor(on: self, body)
    }
}
