import Foundation
import KeychainStore
import PKCS11
import SecureMemory
import TPM2

/// The TPM connection of one operation, and the embedded TPM's first use.
extension Engine {
    /// Connects to the TPM for one operation; the connection closes when `body` returns, so a software
    /// TPM (one client at a time) is free for other processes between operations. keychaind
    /// (`tpmConnectionLinger`) keeps it, its turn and its salted transport session for the next
    /// operation instead, and releases them when idle (`KeptTPM`).
    ///
    /// Without a resource manager (swtpm, `/dev/tpm0`) the operation is this process's turn at the
    /// TPM (`TPMTurn`): no other process's commands interleave, and it starts by flushing what killed
    /// processes left (each kill mid-operation leaks a session; three make every read fail).
    func withKeyring<T>(_ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        let store = try store()
        let device: TPMDevice
        var started = false
        switch configuration.tpm {
        case .tcti(let conf):
            do { device = try TPMDevice(parsing: conf) } catch { throw .invalidArgument(error.description) }
        case .embedded:
            (device, started) = try EmbeddedTPM.ensureRunning(storeDirectory: configuration.storeDirectory)
            if started { startedTPMNeedsUnlock = true }
            try pinStoreInEmbeddedTPM(store)
        }
        if let kept = keptTPM, kept.device != device || started || kept.context?.unanswered != nil {
            releaseKeptTPM()  // another TPM, a restarted one, or one that stopped answering
        }
        // The call's deadline counts from when it was made: time queued behind other calls (a frozen
        // TPM's included) is part of it, so no call waits longer than the timeout its error names.
        func answerTimeout() throws(KeychainError) -> Duration {
            let left = configuration.tpmTimeout - executor.waitedSinceEnqueued()
            guard left > .zero else {
                throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout,
                                       TPMError(command: "wait for earlier calls' TPM commands", code: .success, timedOut: true))
            }
            return left
        }
        if let kept = keptTPM, let context = kept.context {
            // keychaind's connection from the last operation: this process has held the TPM's turn since,
            // so no keychain process ran (or was killed) on it meanwhile, and there is no leftover check.
            // Other programs may have (the swtpm TCTI connects for each command): a session of ours they
            // flushed is replaced at its first use (TPMKeyring.unseal, seal), objects they left are theirs.
            context.setAnswerTimeout(try answerTimeout())
            let before = context.commandCount
            do {
                defer { kept.lastUsed = .now }
                return try withConnection(context, store: store, flushLeftovers: false, body)
            } catch where context.commandCount - before == 1 && context.lastFailure.map(Self.isStale) == true {
                // The first command found the connection broken or the TPM just started (swtpm restarted:
                // a reboot): nothing was done. The operation runs again on a new connection below.
                releaseKeptTPM()
            } catch {
                if context.unanswered != nil { releaseKeptTPM() }
                throw error
            }
        }
        let turn = try TPMTurn.take(device, configuration: configuration)
        if case .embedded = configuration.tpm, started || !embeddedTPMChecked {
            embeddedOwnerAuthorization = try prepareEmbeddedTPM(device, started: started)
            embeddedTPMChecked = true
        }
        let context = try TPMKeyring.connect(device, configuration: configuration, answerTimeout: try answerTimeout())
        defer { withExtendedLifetime(turn) {} }
        guard let linger = configuration.tpmConnectionLinger else {
            return try withConnection(context, store: store, flushLeftovers: turn != nil, body)
        }
        context.keepsTransport = true
        let kept = KeptTPM(device: device, context: context, turn: turn)
        keptTPM = kept
        defer {
            if context.unanswered != nil { releaseKeptTPM() } else { scheduleRelease(of: kept, linger: linger) }
        }
        return try withConnection(context, store: store, flushLeftovers: turn != nil, body)
    }

    /// A failure that says a kept connection is no longer the TPM's: the socket closed under it
    /// (swtpm stopped or restarted), or the TPM was started again and waits for TPM2_Startup.
    private static func isStale(_ error: TPMError) -> Bool {
        (error.isConnectionFailure && !error.timedOut) || error.code.is(.initialize)
    }

    /// Closes the kept connection: the transport session is flushed, and the TPM's turn given back.
    func releaseKeptTPM() {
        keptTPM?.close()
        keptTPM = nil
    }

    /// Releases `kept` once no operation came for `linger`, or once held for five times that (so a
    /// steady stream of operations cannot keep other processes from the TPM). A TPM with a resource
    /// manager shares itself: its connection is kept for the engine's life.
    private func scheduleRelease(of kept: KeptTPM, linger: Duration) {
        guard !kept.device.hasResourceManager else { return }
        let seconds = Double(linger.components.seconds) + Double(linger.components.attoseconds) / 1e18
        let id = ObjectIdentifier(kept)
        DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [weak self] in
            guard let self else { return }
            Task { await self.releaseIfIdle(id, linger: linger) }
        }
    }

    private func releaseIfIdle(_ id: ObjectIdentifier, linger: Duration) {
        guard let kept = keptTPM, ObjectIdentifier(kept) == id else { return }
        let now = ContinuousClock.now
        if now - kept.lastUsed >= linger || now - kept.since >= linger * 5 {
            releaseKeptTPM()
        } else {
            scheduleRelease(of: kept, linger: linger - (now - kept.lastUsed))
        }
    }

    /// One operation on `context`: the keyring reads the store's handles again, and when the
    /// operation ends the context keeps no handle of it but the transport session (`endOperation`).
    /// - Parameter flushLeftovers: flush what killed processes left (a new connection in the TPM's turn).
    func withConnection<T>(_ context: TPMContext, store: Store, flushLeftovers: Bool,
                           _ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        var configuration = configuration
        if case .embedded = configuration.tpm, configuration.ownerAuthorization == nil {
            configuration.ownerAuthorization = embeddedOwnerAuthorization
        }
        let before = context.commandCount
        defer {
            context.endOperation()
            tpmCommands += context.commandCount - before
        }
        let keyring = try TPMKeyring(context: context, store: store, configuration: configuration, flushLeftovers: flushLeftovers)
        defer {
            if keyring.finishedRemoval {
                unsealed = unsealed.filter { !$0.key.protection.hasPrefix(Accessible.whenPasscodeSetThisDeviceOnly.rawValue + "/") }
                forgetSecrets(keepingLongLived: true)
            }
        }
        let device = context.device
        do {
            // A passcode change that a killed process left half-done is finished before anything else.
            if !checkedPasscodeChange {
                do {
                    _ = try keyring.passcodeIsSet()
                    checkedPasscodeChange = true
                } catch where error.code == .lockout {
                    // The PIN is at its limit, so the question has no answer yet; resetting the
                    // count must stay possible. Operations that need the answer get LOCKOUT.
                }
            }
            return try body(keyring)
        } catch {
            // Whatever the step made of it: a TPM that stopped answering is the cause.
            if let unanswered = keyring.context.unanswered {
                throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout, unanswered)
            }
            throw error
        }
    }


    /// The embedded software TPM is taken on first use: random owner and lockout authorizations, kept
    /// in its own 0700 directory (see `EmbeddedTPM.takeOwnership`). A just-started one also gets small
    /// dictionary-attack settings: nothing here is subject to DA (our objects are noDA), but other
    /// tools on it should not lock it out for 1000 s.
    func prepareEmbeddedTPM(_ device: TPMDevice, started: Bool) throws(KeychainError) -> SecureBytes? {
        let context: TPMContext
        do { context = try TPMContext(device: device, timeout: configuration.tpmTimeout) } catch {
            throw KeychainError(.hardwareUnavailable, "The embedded software TPM does not answer", underlying: .tpm(error))
        }
        defer { tpmCommands += context.commandCount }
        let owner = try EmbeddedTPM.takeOwnership(context, storeDirectory: configuration.storeDirectory)
        // Best effort: after a wrong lockout authorization (anyone may try one) the TPM refuses it for
        // lockoutRecovery, and that must not stop the keychain from starting.
        if started { try? context.setDictionaryAttackParameters(maxTries: 32, recoveryTime: 10, lockoutRecovery: 10) }
        return owner
    }
}

/// keychaind's TPM connection between operations: the ESAPI context (with its transport session) and
/// the TPM's turn, held as long as the context is kept, so that no other keychain process flushes
/// the session as a killed process's leftover; released when idle (`scheduleRelease`) so that they
/// get their turn, and the TPM its session slot back.
final class KeptTPM {
    let device: TPMDevice
    private(set) var context: TPMContext?
    private var turn: TPMTurn?
    let since = ContinuousClock.now
    var lastUsed = ContinuousClock.now

    init(device: TPMDevice, context: TPMContext, turn: TPMTurn?) {
        self.device = device
        self.context = context
        self.turn = turn
    }

    /// Flushes the transport session and closes the connection, then gives the turn back.
    func close() {
        context?.dropTransport()
        context = nil
        turn = nil
    }

    deinit { close() }
}
