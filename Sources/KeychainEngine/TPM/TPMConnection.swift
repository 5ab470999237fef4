import KeychainCore
import KeychainStore
import SecureMemory
import TPM2

/// The TPM connection of one operation, and the embedded TPM's first use.
extension Engine {
    /// Runs one TPM operation. Its connection is kept for the next one where that leaves the TPM free
    /// for other processes between operations (`TPMDevice.allowsAKeptConnection`: swtpm's TCTI
    /// connects for each command, a resource manager serves many connections); elsewhere (`/dev/tpm0`)
    /// it closes when `body` returns. A kept connection holds no TPM handle between operations
    /// (`endOperation`), and is given up after an operation that failed.
    ///
    /// Without a resource manager (swtpm, `/dev/tpm0`) the operation is this process's turn at the
    /// TPM (`TPMTurn`): no other process's commands interleave, and it starts by flushing what killed
    /// processes left (each kill mid-operation leaks a session; three make every read fail), unless
    /// the turn directly follows this engine's last, which ended well (`lastTurnMark`).
    func withKeyring<T>(_ body: (TPMKeyring) throws(KeychainError) -> T) throws(KeychainError) -> T {
        let store = try store()
        let device: TPMDevice
        var started = false
        switch configuration.tpm {
        case .tcti(let conf):
            do { device = try TPMDevice(parsing: conf) } catch { throw .invalidArgument(error.description) }
        case .embedded:
            (device, started) = try EmbeddedTPM.ensureRunning(storeDirectory: configuration.storeDirectory)
            if started {
                keptConnection = nil
                savedContexts = [:]  // a new TPM: they would not load
                startedTPMNeedsUnlock = true
                // A TPM restart: the counter may have moved, and its clock counts did.
                (rollbackKnown, rollbackClock) = (nil, nil)
            }
            try pinStoreInEmbeddedTPM(store)
        }
        let turn = try TPMTurn.take(device, configuration: configuration)
        // Nobody took a turn since this engine's last ended well: nothing was left to flush.
        let followsOurLastTurn = turn.map { lastTurnMark != nil && $0.previousMark == lastTurnMark } ?? false
        lastTurnMark = nil
        if case .embedded = configuration.tpm, started || !embeddedTPMChecked {
            embeddedOwnerAuthorization = try prepareEmbeddedTPM(device, started: started)
            embeddedTPMChecked = true
        }
        // The call's deadline counts from when it was made: time queued behind other calls (a frozen
        // TPM's included) is part of it, so no call waits longer than the timeout its error names.
        // The call's own earlier operations are not: the TPM answered them, and on a loaded machine
        // a cold read's several operations took the whole deadline of a TPM that answered each.
        let call = executor.callMadeAt
        let ownTime = callTPMTime.flatMap { $0.call == call ? $0.spent : nil } ?? .zero
        // keychaind's calls have a deadline of their own, which bounds each TPM command (`CallDeadline`).
        let callDeadline = CallDeadline.current?.instant
        let answerTimeout = min(configuration.tpmTimeout - (executor.waitedSinceEnqueued() - ownTime),
                                callDeadline.map { $0 - .now } ?? configuration.tpmTimeout)
        guard answerTimeout > .zero else {
            throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout,
                                   TPMError(command: "wait for earlier calls' TPM commands", code: .success, timedOut: true))
        }
        let began = ContinuousClock.now
        defer { callTPMTime = (call, ownTime + (ContinuousClock.now - began)) }
        let context: TPMContext
        if let kept = keptConnection, kept.device == device, kept.isUsable {
            context = kept
        } else {
            keptConnection = nil
            context = try TPMKeyring.connect(device, configuration: configuration, answerTimeout: answerTimeout)
        }
        context.setAnswerTimeout(answerTimeout, until: callDeadline)
        context.keepsSession = keepsTPMSession
        defer { withExtendedLifetime(turn) {} }
        let failedFlushes = context.failedFlushes
        do {
            let result = try withConnection(context, store: store, flushLeftovers: turn != nil && !followsOurLastTurn, body)
            keptConnection = device.allowsAKeptConnection && context.isUsable ? context : nil
            if context.failedFlushes == failedFlushes { lastTurnMark = turn?.mark }
            return result
        } catch {
            keptConnection = nil
            throw error
        }
    }

    /// One operation on `context`: the keyring reads the store's handles, and when the operation ends
    /// the context keeps no handle of it (`endOperation`).
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
        let keyring: TPMKeyring
        do {
            keyring = try TPMKeyring(context: context, store: store, configuration: configuration, flushLeftovers: flushLeftovers)
        } catch {
            // On a kept connection the leftover check is the first command: a TPM that stopped
            // answering is the cause, as below.
            if let unanswered = context.unanswered { throw .tpmDidNotAnswer(context.device, timeout: configuration.tpmTimeout, unanswered) }
            throw error
        }
        keyring.savedContexts = savedContexts
        defer {
            // A context the TPM refused was saved before its reset (or a restart of swtpm): so were the others.
            if keyring.refusedContext { savedContexts = [:] }
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
            activeKeyring = keyring
            defer { activeKeyring = nil }
            if !rollbackCheckSuspended { try checkRollback(keyring) }
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
