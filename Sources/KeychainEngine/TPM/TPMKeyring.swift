import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2

/// The TPM side of the keychain: the SRK, the device lock, and sealing/unsealing wrapping keys.
///
/// Owned by the engine actor (ESAPI contexts are not thread-safe). Every transient object and
/// session is flushed on every path: a TPM without a resource manager (swtpm) has 3 object slots.
final class TPMKeyring {
    static let srkHandle: UInt32 = 0x8100_0001

    let context: TPMContext
    let store: Store
    private(set) var srk: TPMHandle
    private(set) var stateNV: TPMHandle
    private(set) var epochNV: TPMHandle
    /// The descriptor as this operation last read or wrote it (its mark may be an interrupted change's).
    var descriptor: LockDescriptor
    /// Set when this operation finished an interrupted passcode removal (the engine drops its caches).
    var finishedRemoval = false
    /// The passcode state as this operation read or wrote it.
    var knownPasscodeSet: Bool?
    /// Manufacturer 'IBM ' is the reference implementation that swtpm runs: a software TPM.
    let isSoftwareTPM: Bool
    /// The PCRs `ThisDeviceOnly` keys are bound to: the selection the store recorded when it was set up.
    let pcrSelection: [Int]
    /// keychaind's saved contexts of wrapping keys (`Engine.savedContexts`): a Load becomes a ContextLoad.
    var savedContexts: [TPMContext.SealedBlob: TPMContext.SavedContext] = [:]
    /// Set when the TPM refused a saved context (it was reset since): the engine drops them all.
    var refusedContext = false
    /// The ticket the last `unseal` obtained, if its authorization asked for one (set in TPMKeyringSealing.swift).
    var issuedTicket: StoredTicket?

    /// - Parameters:
    ///   - answerTimeout: how long one TPM exchange may wait (the call's deadline less what it spent
    ///     before); errors name `configuration.tpmTimeout`, the call's whole deadline.
    ///   - flushLeftovers: flush what killed processes left (only while holding the TPM's turn).
    convenience init(device: TPMDevice, store: Store, configuration: KeychainConfiguration, answerTimeout: Duration? = nil,
                     flushLeftovers: Bool = false) throws(KeychainError) {
        try self.init(context: Self.connect(device, configuration: configuration, answerTimeout: answerTimeout),
                      store: store, configuration: configuration, flushLeftovers: flushLeftovers)
    }

    /// A new connection to the TPM at `device`.
    static func connect(_ device: TPMDevice, configuration: KeychainConfiguration,
                        answerTimeout: Duration? = nil) throws(KeychainError) -> TPMContext {
        do {
            return try TPMContext(device: device, timeout: answerTimeout ?? configuration.tpmTimeout)
        } catch {
            if error.timedOut { throw .tpmDidNotAnswer(device, timeout: configuration.tpmTimeout, error) }
            throw KeychainError(.hardwareUnavailable,
                                "Cannot reach the TPM at \(device): check that it exists and that this user may open it "
                                + "(or pass --tcti / set KEYCHAIN_TCTI)", underlying: .tpm(error))
        }
    }

    /// One operation's keyring on `context`, a new connection or one kept from an earlier operation
    /// (keychaind's, `Engine.withKeyring`); the handles it uses are read from the store again.
    init(context: TPMContext, store: Store, configuration: KeychainConfiguration, flushLeftovers: Bool = false) throws(KeychainError) {
        self.context = context
        let device = context.device
        self.store = store
        if flushLeftovers {
            // Another process had a turn: its leftover check flushed every session, ours too, or this
            // one will. Forgotten, not flushed: the handle may be someone else's session by now.
            context.forgetKeptSession()
            do { try context.flushLeftovers() } catch {
                throw KeychainError(.hardwareUnavailable, "The TPM at \(device) refused to list or flush the sessions "
                                    + "and objects left by killed processes (\(error.command))", underlying: .tpm(error))
            }
        }
        // The owner authorization (device provisioning's), for what needs the owner hierarchy:
        // provisioning, the reader's persistent key, resetting the passcode count.
        do { try context.setAuth(TPMContext.owner, configuration.ownerAuthorization) } catch {
            throw KeychainError.invalidArgument("The owner authorization is longer than the TPM accepts")
        }
        let given = configuration.validPCRSelection
        var recorded = try Self.recordedPCRSelection(store)
        // A store that knows its TPM needs no TPM command to start: its handles are deserialized.
        if let srkTR = try Self.meta(store, StoreMeta.srkTR), let stateTR = try Self.meta(store, StoreMeta.stateTR),
           let epochTR = try Self.meta(store, StoreMeta.epochTR),
           let desc = try Self.meta(store, StoreMeta.lockDescriptor).flatMap(LockDescriptor.init(decoding:)),
           let manufacturer = try Self.meta(store, StoreMeta.manufacturer) {
            do {
                srk = try context.deserialize(srkTR)
                stateNV = try context.deserialize(stateTR)
                epochNV = try context.deserialize(epochTR)
                context.ownerSaltKey = srk  // owner commands in a session salted to the pinned SRK
            } catch {
                throw KeychainError(.dataCorrupted, "The store's TPM handles cannot be read", underlying: .tpm(error))
            }
            descriptor = desc
            isSoftwareTPM = manufacturer.starts(with: Array("IBM".utf8))
            if recorded == nil {
                // Set up before the selection was recorded: the PCRs it approved, else the given ones.
                let approved = (try Self.meta(store, StoreMeta.bootApproved)).flatMap(BootState.init(decoding:))?.values.keys.sorted()
                recorded = approved?.isEmpty == false ? approved : given ?? [7]
                do { try store.write { tx in try tx.setMeta(StoreMeta.pcrSelection, recorded!.map(UInt8.init)) } }
                catch let error as StoreError { throw KeychainError(store: error) } catch { throw KeychainError(.internal, "\(error)") }
            }
            pcrSelection = try Self.selection(recorded: recorded!, given: given)
            return
        }
        let selection = try Self.selection(recorded: recorded ?? given ?? [7], given: given)
        pcrSelection = selection
        (srk, stateNV, epochNV, descriptor, isSoftwareTPM) = try Self.provision(
            context: context, store: store, configuration: configuration, pcrSelection: selection)
        // The boot-state approval index, approving the boot state just recorded (BootApproval.swift).
        _ = try ensureBootApproval(selection: selection, initial: recordedBootState(selection))
    }

    /// The selection recorded at set-up, nil before it is (a new store, or one of an older version).
    static func recordedPCRSelection(_ store: Store) throws(KeychainError) -> [Int]? {
        guard let bytes = try meta(store, StoreMeta.pcrSelection), !bytes.isEmpty else { return nil }
        return bytes.map(Int.init)
    }

    /// The recorded selection, unless another was given: that is refused, naming both.
    static func selection(recorded: [Int], given: [Int]?) throws(KeychainError) -> [Int] {
        if let given, given != recorded {
            let (was, now) = (recorded.map(String.init).joined(separator: ","), given.map(String.init).joined(separator: ","))
            throw KeychainError.invalidArgument(
                "This keychain's PCR selection is \(was) (recorded when it was set up), not \(now): leave --pcrs out (or give "
                + "--pcrs \(was)); a keychain's ThisDeviceOnly items are bound to the one selection it was set up with")
        }
        return recorded
    }

    static func meta(_ store: Store, _ name: String) throws(KeychainError) -> [UInt8]? {
        do { return try store.meta(name) } catch { throw KeychainError(store: error) }
    }

    /// `body`'s errors as the keychain tells them: a `TPMError` diagnosed as failing to do `what`, a
    /// `KeychainError` as it is.
    func diagnosing<T>(_ what: String, _ body: () throws -> T) throws(KeychainError) -> T {
        do {
            return try body()
        } catch let error as KeychainError {
            throw error
        } catch let error as TPMError {
            throw diagnose(error, doing: what)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// For failures that may mean the TPM is not the one we provisioned: check the SRK's name.
    func diagnose(_ error: TPMError, doing what: String) -> KeychainError {
        if error.isConnectionFailure {
            return KeychainError(.hardwareUnavailable, "Lost the connection to the TPM at \(context.device) while trying to \(what)",
                                 underlying: .tpm(error))
        }
        if error.code.is(.commandCode) {
            return KeychainError(.unsupported, "The TPM does not implement \(error.command), needed to \(what) (TPM_RC_COMMAND_CODE: "
                                 + "a TPM of an older spec revision)", underlying: .tpm(error))
        }
        if let full = Self.noRoom(error, doing: what) { return full }
        if srkChanged() { return srkError(error) }
        if error.command.hasPrefix("EvictControl"), error.code.is(.badAuth) || error.code.is(.authFail) {
            // A reader's persistent key needs the owner authorization init set; keychaind has it only when given.
            return KeychainError(.authenticationFailed,
                                 "The TPM refused the owner authorization to \(what) (\(error.command)): init set one, and this "
                                 + "process was not given it. Give the file init wrote (--owner-auth-out): keychainctl "
                                 + "--owner-auth-file FILE reader …; through keychaind, start it with --owner-auth-file FILE "
                                 + "(under systemd: LoadCredential=owner.auth:FILE in keychaind.service)", underlying: .tpm(error))
        }
        return KeychainError(.hardwareUnavailable, "The TPM refused to \(what) (\(error.command))", underlying: .tpm(error))
    }

    /// OBJECT_MEMORY or SESSION_MEMORY: from the TPM (other programs hold its slots), or from a resource
    /// manager that allows one client fewer than the keychain holds at once. Nil for other codes.
    static func noRoom(_ error: TPMError, doing what: String) -> KeychainError? {
        guard error.code.is(.objectMemory) || error.code.is(.sessionMemory) else { return nil }
        let kind = error.code.is(.objectMemory) ? "objects" : "sessions"
        if error.code.isResourceManagerRefusal {
            return KeychainError(.hardwareUnavailable, "The TPM's resource manager allows this process fewer \(kind) at once than it "
                                 + "needs to \(what) (\(error.command)): the keychain holds up to 3 objects and 3 sessions at once, "
                                 + "as the kernel's /dev/tpmrm0 allows; start tpm2-abrmd with --max-transients and --max-sessions "
                                 + "of 3 or more", underlying: .tpm(error))
        }
        return KeychainError(.hardwareUnavailable, "The TPM has no room for more \(kind) to \(what) (\(error.command)): "
                             + "other programs hold its slots", underlying: .tpm(error))
    }

    func srkError(_ error: TPMError) -> KeychainError {
        KeychainError(.hardwareUnavailable,
                      "The TPM's storage root key at 0x81000001 is missing or not the one this store was made with: "
                      + "the TPM was cleared or replaced, and items sealed to the old one cannot be opened",
                      underlying: .tpm(error))
    }

    func srkChanged() -> Bool { srkState() != .pinned }

    /// The persistent SRK compared with the name pinned in the store at provisioning.
    func srkState() -> DeviceStatus.StorageRootKey {
        guard let pinned = try? store.meta(StoreMeta.srkName) else { return .pinned }
        do throws(TPMError) {
            let current = try context.resource(forPersistent: Self.srkHandle)
            return (try? context.name(of: current)) == pinned ? .pinned : .replaced
        } catch {
            // The TPM's HANDLE error: nothing there. Anything else: ESAPI, which already holds the pinned
            // SRK (deserialized from the store), refused a second name for the same handle: replaced.
            return error.code.is(.handle) ? .missing : .replaced
        }
    }
}

/// PCR values (SHA-256 bank) by index: the boot state a `ThisDeviceOnly` key may be sealed to.
struct BootState: Codable, Equatable {
    var values: [Int: [UInt8]]

    static func read(_ context: TPMContext, _ pcrs: [Int]) throws(TPMError) -> BootState {
        let selection = PCRSelection(pcrs)
        let values = try context.readPCRs(selection)
        return BootState(values: Dictionary(uniqueKeysWithValues: zip(selection.indices, values)))
    }

    init(values: [Int: [UInt8]]) { self.values = values }
    init?(decoding bytes: [UInt8]) {
        guard let state = try? JSONDecoder().decode(BootState.self, from: Data(bytes)) else { return nil }
        self = state
    }
    func encoded() -> [UInt8] { Array((try? JSONEncoder().encode(self)) ?? Data()) }
}
