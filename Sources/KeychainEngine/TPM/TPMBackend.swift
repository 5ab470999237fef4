import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainWire

/// The TPM holds the wrapping key: its secret half is sealed to a policy made from the protection
/// (`SealPolicy`: lock state, passcode, reader, PCRs), and the TPM checks that policy at every unseal.
struct TPMBackend: KeyBackend {
    var readerDirectory: String?

    func wrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                     engine: isolated any BackendContext) throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        try engine.tpmWrappingKey(service: service, tag: tag, protection: protection, stored: stored,
                                  readerDirectory: readerDirectory, sealing: nil)
    }

    func openSecret(_ wrapping: WrappingKeyRecord, for record: ItemRecord, store: Store, context: Engine.ReadContext,
                    engine: isolated any BackendContext) async throws(KeychainError) -> SecureBytes {
        try await engine.unsealedSecret(for: wrapping, record: record, store: store, context: context)
    }

    /// Sealed blobs live only in the store: removing their rows destroys them.
    func destroyKeys(service: String, engine: isolated any BackendContext) {}

    func securityLevel(engine: isolated any BackendContext) throws(KeychainError) -> ItemInfo.SecurityLevel {
        let store = try engine.store()
        let manufacturer = try engine.read { try store.meta(StoreMeta.manufacturer) }
        return (manufacturer ?? []).starts(with: Array("IBM".utf8)) ? .softwareTPM : .hardwareTPM
    }
}

extension Engine {
    /// What a TPM write needs: the reader and passcode its access control asks for, and a key that is
    /// not dead (a CurrentSet key of an older enrollment set, a passcode key of an older passcode).
    /// A new key seals a new X25519 secret, or the secret of `pair` when one is given, under `pair`'s
    /// public key (a token's split key: the TPM's part, and the public key of the whole).
    func tpmWrappingKey(service: String, tag: String, protection: ItemProtection, stored: WrappingKeyRecord?,
                        readerDirectory: String?, sealing pair: Sodium.X25519KeyPair? = nil)
        throws(KeychainError) -> (key: WrappingKeyRecord, replaces: [UInt8]?) {
        if protection.accessible.isThisDeviceOnly { try configuration.checkPCRSelection() }
        // The reader's state is read only for writes that need it.
        let reader = protection.accessControl == .none ? nil
            : try readerDirectory.map { (dir: String) throws(KeychainError) in try checkedReader(dir) }
        let requirements = try writeRequirements(protection, reader: reader)
        var wrapping = stored
        var staleKey: [UInt8]?
        if let existing = wrapping, let binding = SealPolicy.decode(existing.policy)?.biometry {
            switch try readerVerdict(for: binding, directory: readerDirectory) {
            case .usable: break  // an Any key survives enrollment changes (even all fingers removed), as the seed says
            case .enrollmentChanged:
                // A CurrentSet key of an older enrollment set of this very reader is dead: it and its items go.
                staleKey = existing.publicKey
                wrapping = nil
            case .unavailable(let why):
                // A missing or other reader never drops items. The existing key's passcode branch serves an
                // …OrPasscode write; another write would go under a key that no reader present opens.
                guard protection.accessControl.allowsPasscode && !protection.accessControl.needsBiometry else {
                    throw why.code != .biometryNotAvailable ? why : KeychainError(.biometryNotAvailable,
                        "The items of service '\(ItemScope.shown(service))' with this protection were written with another fingerprint reader, "
                        + "and \(why.message): nothing was written. Use that reader (--reader, KEYCHAIN_READER), or remove "
                        + "those items first (keychainctl clear)")
                }
            }
        }
        if let existing = wrapping, protection.accessible.requiresPasscode
            || (protection.accessControl != .none && SealPolicy.decode(existing.policy)?.passcodeEpoch != nil) {
            // The passcode may have been removed (by any process) since: that key is dead in the TPM.
            // One command: removing the passcode always bumps the epoch, so an unchanged epoch means
            // the passcode the key was made with is still set; a new key checks the passcode itself.
            let epoch = SealPolicy.decode(existing.policy)?.passcodeEpoch
            let current: UInt64 = try withKeyring { keyring throws(KeychainError) in
                do throws(TPMError) { return try keyring.currentPasscodeEpoch() }
                catch { throw keyring.diagnose(error, doing: "read the passcode epoch") }
            }
            if epoch != current { staleKey = existing.publicKey; wrapping = nil }
        }
        if wrapping == nil {
            let pair = pair ?? Sodium.generateX25519()
            let (blob, policy) = try withKeyring { keyring throws(KeychainError) in
                try keyring.seal(pair.secretKey, accessible: protection.accessible, pcrs: keyring.pcrSelection,
                                 biometry: requirements.biometry, passcode: requirements.passcode,
                                 keyRef: SealPolicy.keyRef(service: service, protection: tag, publicKey: pair.publicKey),
                                 authValidity: protection.accessControl.takesWindow ? protection.authValidity : nil)
            }
            wrapping = WrappingKeyRecord(service: service, protection: tag, publicKey: pair.publicKey,
                                         sealedPublic: blob.publicArea, sealedPrivate: blob.privateArea,
                                         policy: policy.encoded(), created: Self.now())
        }
        return (wrapping!, staleKey)
    }

    /// The key's secret, opened by the TPM (and kept as its level allows).
    func unsealedSecret(for wrapping: WrappingKeyRecord, record: ItemRecord, store: Store,
                        context: ReadContext) async throws(KeychainError) -> SecureBytes {
        let id = WrappingKeyID(service: wrapping.service, protection: wrapping.protection, publicKey: wrapping.publicKey)
        let window = context.window(tag: record.protection)
        // The warm path: no policy decoding, one meta read for whenUnlocked keys only.
        if let cached = try cachedSecret(id, window: window, store: store) { return cached }
        let policy = try sealPolicy(of: wrapping)
        let generation: UInt64? = policy.availability == .whenUnlocked ? try lockGeneration(store) : nil
        let secret: SecureBytes
        var opened: ContinuousClock.Instant?
        if policy.branches.isEmpty {
            secret = try unsealedUnattended(wrapping, policy: policy, store: store)
        } else {
            let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
            secret = try await unsealWithUser(blob, policy: policy, record: record, window: window, context: context)
            if policy.isLiteralBootBinding { migrateBootBinding(secret, wrapping, policy, store: store) }
            if policy.keyRef == nil, (try? checked(secret, wrapping)) != nil { rebind(secret, wrapping, policy, store: store) }
            else if let upgraded = withReaderBranch(policy, wrapping, readerDirectory: context.readerDirectory) {
                reseal(secret, wrapping, upgraded, store: store)  // an enrollment that ended before its re-seal
            }
            // authValidity: the window in which reads of this key skip the prompt (this process);
            // never for the CurrentSet values, whatever storage reads them (seed: AccessControl).
            guard window > 0, policy.biometry?.currentSet != true else { return try checked(secret, wrapping) }
            opened = .now
        }
        let checkedSecret = try checked(secret, wrapping)
        unsealed[id] = (checkedSecret, generation, opened)
        return checkedSecret
    }

    /// The window of one read: the item's own (stored in its tag, bound in its key's policy), shortened
    /// when the reading storage asks for less (a storage's 0, the default, asks for nothing). Items

    /// The policy `wrapping`'s blob was sealed under, checked to be this key's (its reference, its window).
    func sealPolicy(of wrapping: WrappingKeyRecord) throws(KeychainError) -> SealPolicy {
        let tag = Self.liveTag(wrapping.protection)
        guard let policy = SealPolicy.decode(wrapping.policy),
              policy.keyRef.map({ $0 == SealPolicy.keyRef(service: wrapping.service, protection: tag,
                                                          publicKey: wrapping.publicKey) }) ?? true,
              policy.authValidity == nil || policy.authValidity == ItemProtection.storedWindow(ofTag: tag) else {
            throw KeychainError(.dataCorrupted, "The wrapping key of service '\(ItemScope.shown(wrapping.service))' has an unreadable policy, "
                                + "or one made for another key")
        }
        return policy
    }

    /// What the TPM sealed for `wrapping` under a `policy` that names no user (no prompt), a literal boot
    /// binding moved to the approval index; neither checked against the public key nor kept: the
    /// caller does both (a token's split key combines it with the token's part first).
    func unsealedUnattended(_ wrapping: WrappingKeyRecord, policy: SealPolicy, store: Store) throws(KeychainError) -> SecureBytes {
        let blob = TPMContext.SealedBlob(publicArea: wrapping.sealedPublic, privateArea: wrapping.sealedPrivate)
        let secret = try unsealWithoutUser(blob, policy: policy)
        if policy.isLiteralBootBinding { migrateBootBinding(secret, wrapping, policy, store: store) }
        return secret
    }

    func unsealWithoutUser(_ blob: TPMContext.SealedBlob, policy: SealPolicy) throws(KeychainError) -> SecureBytes {
        try withKeyring { keyring throws(KeychainError) -> SecureBytes in
            if startedTPMNeedsUnlock && policy.availability != .always {
                // This process just started the embedded TPM: the Unseal's PolicyNV would fail (StartAuthSession,
                // Load, PolicyNV and two flushes for nothing) before the unlock below, so without a passcode
                // unlock first. Once: after it the state index says whatever unlocks and locks made it say.
                startedTPMNeedsUnlock = false
                _ = try keyring.unlockIfNoPasscode()
            }
            do throws(KeychainError) {
                return try keyring.unseal(blob, policy: policy)
            } catch where error.code == .interactionNotAllowed {
                guard try keyring.unlockIfNoPasscode() else { throw error }
                return try keyring.unseal(blob, policy: policy)
            }
        }
    }

    /// Asks the user (the authenticator) and proves the answer to the TPM: the reader signs the
    /// session nonce after a match, or the TPM checks the passcode. At most three tries per read.
    func unsealWithUser(_ blob: TPMContext.SealedBlob, policy: SealPolicy, record: ItemRecord, window: Int,
                                context: ReadContext) async throws(KeychainError) -> SecureBytes {
        // iOS never asks for an item the lock state cannot open: fail before any prompt or ticket.
        try refuseWhileLocked(policy.availability)
        try refuseAfterPasscodeRemoval(policy, record: record)
        let (methods, reader) = try methodsAndReader(policy, record: record, context: context)
        // authValidity across processes: a TPM ticket from an earlier read of this key, which opens no other.
        let window = Int32(clamping: policy.acceptsTickets ? window : 0)
        let ticketName = StoreMeta.ticket(service: record.service, protection: record.protection)
        if let secret = try unsealWithTicket(blob, policy: policy, name: ticketName, window: window, methods: methods) {
            return secret
        }
        guard let authenticator = context.authenticator else {
            throw KeychainError(.interactionNotAllowed,
                                "Reading '\(record.key)' needs the user (\(methods.map(\.rawValue).joined(separator: " or "))), "
                                + "and no authenticator can ask: pass --touch FINGER or --passcode-stdin, or run on a terminal")
        }
        return try await authenticator.ask(prompt: context.prompt, methods: methods, service: record.service, key: record.key,
                                           unnamedFailure: "no match") { answer throws(KeychainError) in
            switch answer {
            case .finger(let finger):
                guard methods.contains(.fingerprint), let reader else { return .failed("a fingerprint does not open this item") }
                switch try touch(reader, finger: finger, account: context.caller?.readerAccount) {
                case .match:
                    return .opened(try withKeyring { keyring throws(KeychainError) in
                        let secret = try keyring.unseal(blob, policy: policy, authorization: .finger(reader, window: window))
                        saveTicket(keyring.issuedTicket, name: ticketName)
                        return secret
                    })
                case .noMatch:
                    return .failed("no match")
                case .lockout:
                    throw KeychainError(.lockout, "Too many failed fingerprint matches: enter the passcode to use the reader again")
                case .permanentLockout:
                    throw KeychainError(.lockoutPermanent, "The fingerprint reader is locked until the passcode is entered")
                }
            case .passcode(let pin):
                guard methods.contains(.passcode) else { return .failed("the passcode does not open this item") }
                do throws(KeychainError) {
                    let secret = try spendingPasscodeBudget(of: context.caller) { () throws(KeychainError) in
                        try withKeyring { keyring throws(KeychainError) in
                            let secret = try keyring.unseal(blob, policy: policy, authorization: .passcode(pin, window: window))
                            saveTicket(keyring.issuedTicket, name: ticketName)
                            return secret
                        }
                    }
                    if let reader { try resetLockout(of: reader, account: context.caller?.readerAccount) }
                    return .opened(secret)
                } catch where error.code == .authenticationFailed {
                    return .failed("wrong passcode")
                }
            }
        }
    }

    /// A key of an epoch before this store's last passcode removal is dead in the TPM (its PolicyNV
    /// fails): said before a prompt the user may have no way to answer (the fingers went too).
    private func refuseAfterPasscodeRemoval(_ policy: SealPolicy, record: ItemRecord) throws(KeychainError) {
        if let epoch = policy.passcodeEpoch, let removed = try? store().meta(StoreMeta.passcodeRemovedEpoch),
           let removedEpoch = UInt64(bigEndianBytes: removed), epoch < removedEpoch {
            throw KeychainError(.keyInvalidated, "The device passcode was removed since item '\(record.key)' was written, which "
                                + "ends every item behind an access control (and the enrolled fingers); the item was removed")
        }
    }

    /// The ways the user may open the item here, and the fingerprint reader (also to end its lockout after a passcode).
    private func methodsAndReader(_ policy: SealPolicy, record: ItemRecord,
                                  context: ReadContext) throws(KeychainError) -> ([AuthenticationMethod], FingerprintReader?) {
        var methods: [AuthenticationMethod] = []
        var reader: FingerprintReader?
        var readerProblem: KeychainError?
        if let binding = policy.biometry {
            switch try readerVerdict(for: binding, directory: context.readerDirectory) {
            case .usable(let present):
                reader = present
                if try lockState(of: present, account: context.caller?.readerAccount) != .permanentLockout || policy.passcode != true {
                    methods.append(.fingerprint)
                }
            case .enrollmentChanged:
                // Before any prompt, as the seed says for CurrentSet; Engine.get removes the item.
                throw KeychainError(.keyInvalidated,
                                    "The enrolled fingers changed since item '\(record.key)' was written; the item was removed")
            case .unavailable(let why):
                readerProblem = why.code == .biometryNotAvailable
                    ? KeychainError(.biometryNotAvailable, "Item '\(record.key)' needs the fingerprint reader it was written with, "
                                    + "and \(why.message); the item is kept") : why
            }
        } else {
            // Only to end a reader lockout after the passcode: a broken reader does not stop a passcode read.
            reader = context.readerDirectory.flatMap { try? FingerprintReader(directory: $0) }
        }
        if policy.passcode == true { methods.append(.passcode) }
        guard !methods.isEmpty else {
            throw readerProblem ?? KeychainError(.biometryNotAvailable, "Item '\(record.key)' has no way to be opened here")
        }
        return (methods, reader)
    }

    /// The read through a TPM ticket of an earlier read of this key, within this read's window; nil when there is
    /// none (or it ended: then it is deleted, and the user is asked).
    private func unsealWithTicket(_ blob: TPMContext.SealedBlob, policy: SealPolicy, name ticketName: String, window: Int32,
                                  methods: [AuthenticationMethod]) throws(KeychainError) -> SecureBytes? {
        // A ticket made for a longer window than this read's is used only within this read's window.
        if window > 0, let saved = try? store().meta(ticketName),
           let stored = try? JSONDecoder().decode(TPMKeyring.StoredTicket.self, from: Data(saved)),
           stored.expires > Self.now(), (stored.issued ?? stored.expires) + Int64(window) * 1000 > Self.now(),
           methods.contains(stored.branch == "biometry" ? .fingerprint : .passcode) {
            do throws(KeychainError) {
                return try withKeyring { keyring throws(KeychainError) in
                    try keyring.unseal(blob, policy: policy, authorization: .ticket(stored))
                }
            } catch where error.code == .authenticationFailed {
                _ = try? store().write { try $0.deleteMeta(ticketName) }  // the window ended: ask again
            }
        }
        return nil
    }

    /// One NV_Read of the state index before a prompt: a locked device (or one not unlocked since the
    /// TPM started, for `afterFirstUnlock`) fails at once. Only a guard against a useless prompt: the
    /// TPM's PolicyNV still decides at unseal. Without a passcode the device counts as unlocked.
    /// Skipped, with no TPM connection, while this process last saw the device unlocked and no `lock`
    /// went through this store since (its lock generation): a lock by another store on the TPM, or a
    /// TPM reset under a running process, then costs a useless prompt, never an item.
    func refuseWhileLocked(_ availability: SealPolicy.Availability) throws(KeychainError) {
        guard availability != .always else { return }
        let generation = try lockGeneration(try store())
        if seenUnlocked == generation { return }
        let unlocked = try withKeyring { keyring throws(KeychainError) -> Bool in
            let state = try keyring.lockState()
            if state == .unlocked { return true }
            if state == .locked && availability == .afterFirstUnlock { return false }
            if try keyring.unlockIfNoPasscode() { return true }
            throw state == .beforeFirstUnlock
                ? KeychainError(.interactionNotAllowed,
                                "The device has not been unlocked since the TPM started: unlock it first (keychainctl unlock)")
                : KeychainError(.interactionNotAllowed, "The device is locked: unlock it first (keychainctl unlock)")
        }
        if unlocked { seenUnlocked = generation }
    }

    enum ReaderVerdict {
        case usable(FingerprintReader)
        /// The reader the key was sealed to, its key still in the TPM, with another enrollment set.
        case enrollmentChanged
        case unavailable(KeychainError)
    }

    /// How the configured reader stands to a key sealed to `binding`. Only the reader the key was
    /// sealed to, present and holding its key in the TPM, can show that its enrollment changed; a
    /// missing, unreadable or other reader keeps the key and its items.
    func readerVerdict(for binding: SealPolicy.BiometryBinding, directory: String?) throws(KeychainError) -> ReaderVerdict {
        guard let directory else {
            return .unavailable(KeychainError(.biometryNotAvailable, "no fingerprint reader is configured (KEYCHAIN_READER=none)"))
        }
        let reader: FingerprintReader
        do { reader = try checkedReader(directory) } catch { return .unavailable(error) }
        guard let keyName = reader.keyName else {
            return .unavailable(KeychainError(.biometryNotAvailable, "there is no fingerprint reader at \(directory)"))
        }
        guard keyName == binding.keyName else {
            return .unavailable(KeychainError(.biometryNotAvailable, "the reader at \(directory) is another one"))
        }
        guard binding.currentSet, reader.enrollmentSet != binding.enrollmentSet else { return .usable(reader) }
        let inTPM = try withKeyring { keyring throws(KeychainError) in
            keyring.holdsPersistent(binding.tpmHandle, named: binding.keyName)
        }
        guard inTPM else {
            return .unavailable(KeychainError(.biometryNotAvailable, "the TPM no longer holds the key of the reader at "
                                                                               + "\(directory) (\(upperHex(UInt64(binding.tpmHandle))))"))
        }
        return .enrollmentChanged
    }

    /// Keys sealed before tickets named their key share one empty policyRef, so a ticket made for one
    /// would open them all: none is ever asked for them, and once one opens it is sealed again with its
    /// own reference (the same secret: its items stay). Best effort: a failure leaves the old blob,
    /// which still opens. Copies of the old blob keep the old policy.
    func rebind(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        var policy = policy
        policy.keyRef = SealPolicy.keyRef(service: wrapping.service, protection: Self.liveTag(wrapping.protection),
                                          publicKey: wrapping.publicKey)
        reseal(secret, wrapping, policy, store: store)
    }

    /// Seals a wrapping key's secret again under `policy` and stores it over the blob that was opened,
    /// in one transaction: the secret is the same, so its items open with either blob, and a process
    /// killed at any point leaves one of the two. Best effort: a failure leaves the old blob.
    func reseal(_ secret: SecureBytes, _ wrapping: WrappingKeyRecord, _ policy: SealPolicy, store: Store) {
        guard (try? checked(secret, wrapping)) != nil,
              let blob = try? withKeyring({ keyring throws(KeychainError) in try keyring.seal(secret, policy: policy) }) else { return }
        var updated = wrapping
        var policy = policy
        policy.creation = blob.creation
        updated.sealedPublic = blob.publicArea
        updated.sealedPrivate = blob.privateArea
        updated.policy = policy.encoded()
        // Only over the blob we opened: another process may have rebound or replaced it meanwhile.
        try? writeStore(store) { tx in
            guard try tx.wrappingKey(service: wrapping.service, protection: wrapping.protection)?.sealedPrivate
                    == wrapping.sealedPrivate else { return }
            try tx.putWrappingKey(updated)
        }
    }

    /// Keeps a ticket for the window: the TPM refuses it after the window or a reset, so it is no
    /// secret; failing to save it only means the next read asks again.
    func saveTicket(_ ticket: TPMKeyring.StoredTicket?, name: String) {
        guard let ticket, let data = try? JSONEncoder().encode(ticket), let store = try? store() else { return }
        _ = try? store.write { try $0.setMeta(name, Array(data)) }
    }

}
