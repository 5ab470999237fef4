import Glibc
internal import CTSS2
import SecureMemory
import FoundationEssentials
import Synchronization
import KeychainBasics

/// A handle to a TPM entity, as ESAPI knows it. `mustFlush` is true for transient objects and sessions.
public struct TPMHandle: Sendable, Hashable {
    public let tr: UInt32
    public let mustFlush: Bool
}

/// What this process's TPM connections are doing, for a progress line on a terminal (keychainctl): read
/// from another thread while an operation runs, which the engine's actor would make wait.
public enum TPMActivity {
    private static let state = Mutex<(sent: Int, current: String?)>((0, nil))

    /// The commands sent since the process started, and the one the TPM is working on (nil between two).
    public static var now: (sent: Int, current: String?) { state.withLock { $0 } }

    static func begin(_ command: String) { state.withLock { $0 = ($0.sent + 1, command) } }
    static func end() { state.withLock { $0.current = nil } }
}

/// One connection to a TPM: owns the TCTI and ESAPI contexts and is the only place that calls ESAPI.
///
/// - Important: not thread-safe. Confine it to one actor; the keychain's engine does.
public final class TPMContext {
    let esys: OpaquePointer
    private(set) var tcti: OpaquePointer?
    public let device: TPMDevice
    /// TPM commands sent on this connection; the benchmark reads it.
    public private(set) var commandCount = 0
    private let deadline: AnswerDeadline
    /// ESAPI resources of persistent objects and NV indices made since the last `endOperation`
    /// (ReadPublic, TR_Deserialize): closed there, so a context holds none with a name the TPM may
    /// have changed since (an NV index written, a TPM reset), and does not grow.
    private var resources: [ESYS_TR] = []
    /// The command whose deadline the TPM let pass: the connection is then given up, and every later
    /// command fails at once instead of waiting again.
    public private(set) var unanswered: TPMError?
    /// The exchange that failed below the TPM (the connection, or ESAPI's own state): ESAPI accepts no
    /// command after a failed receive ("called in the wrong order"), so every later command fails at
    /// once with this error, and the connection is not kept for another operation.
    public private(set) var broken: TPMError?
    /// Whether this connection may serve another operation: every command it was sent was answered.
    public var isUsable: Bool { unanswered == nil && broken == nil }
    /// keychaind on a chip: a salted HMAC session kept from one operation to the next, the Unseal's
    /// second session (`keptSession`); nil until first used and after it is dropped.
    var kept: TPMHandle?
    /// Whether Unseals use the kept session (set by keychaind's engine for each operation).
    public var keepsSession = false
    /// Set while keychaind saves its wrapping keys' contexts after "ready": those commands are not
    /// the crash-atomicity tests' count (`KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS`), which is of the
    /// commands of the requests they send. Nothing in a release build.
    public var outsideCrashPoints = false
    /// The shortest salted StartAuthSession on this connection: on a chip an ECDH of 33–100 ms, on
    /// swtpm about one (keychaind's `--tpm-session auto` decides by it).
    public internal(set) var saltedSessionTime: Duration?
    /// The transient objects and sessions made on this connection and not yet flushed.
    var handles = HandleManager()

    /// - Parameter timeout: how long one command may wait for the TPM's answer (see `AnswerDeadline`).
    public init(device: TPMDevice, timeout: Duration = .seconds(30)) throws(TPMError) {
        setenv("TSS2_LOG", "all+none", 0)
        self.device = device
        deadline = AnswerDeadline(device: device, timeout: timeout)
        var tctiContext: OpaquePointer?
        // The swtpm TCTI talks to the TPM's control socket already here (it sets the locality).
        let (rc, timedOut) = deadline.run { Tss2_TctiLdr_Initialize(device.tctiConfiguration, &tctiContext) }
        // Past its deadline the set-up failed whatever it returned: an exchange cut short is no answer.
        guard rc == 0, !timedOut, let tctiContext else {
            if rc == 0 { Tss2_TctiLdr_Finalize(&tctiContext) }
            throw TPMError(command: "connect to \(device)", code: TPMReturnCode(rawValue: rc), timedOut: timedOut)
        }
        var ctx: OpaquePointer?
        let rc2 = Esys_Initialize(&ctx, tctiContext, nil)
        guard rc2 == 0, let ctx else {
            var t: OpaquePointer? = tctiContext
            Tss2_TctiLdr_Finalize(&t)
            throw TPMError(command: "Esys_Initialize", code: TPMReturnCode(rawValue: rc2))
        }
        self.tcti = tctiContext
        self.esys = ctx
    }

    /// How long each later command may wait for the TPM's answer: a context kept between operations
    /// takes each operation's own deadline.
    /// - Parameter callDeadline: the deadline of the call the commands serve: no command is sent
    ///   after it, and none waits past it (`AnswerDeadline.until`).
    public func setAnswerTimeout(_ timeout: Duration, until callDeadline: ContinuousClock.Instant? = nil) {
        deadline.timeout = timeout
        deadline.until = callDeadline
    }

    /// Ends one operation: the owner's session (and anything made outside a scope) is flushed and the
    /// ESAPI resources of persistent handles closed.
    public func endOperation() {
        flush(handles.unscoped())
        ownerSession = nil
        ownerSaltKey = nil  // the SRK's resource is closed below; the next operation sets it again
        closeResources(resources)
        resources.removeAll()
    }

    /// Once set (to the SRK), owner-authorized commands prove the owner's authorization in an HMAC
    /// session salted to it, started on first use and flushed with the connection, instead of a
    /// password session that would carry the authorization itself in clear.
    public var ownerSaltKey: TPMHandle?
    private var ownerSession: TPMHandle?

    /// The session for the owner hierarchy's authorization: salted HMAC when `ownerSaltKey` is set.
    func ownerAuthorization() throws(TPMError) -> ESYS_TR {
        guard let ownerSaltKey else { return Self.password }
        if let ownerSession { return ownerSession.tr }
        let session = try startSession(.hmac, saltKey: ownerSaltKey, continueSession: true)
        keep(session)
        ownerSession = session
        return session.tr
    }

    deinit {
        flush(handles.all())
        if let kept { flush([kept.tr]) }  // the kept session is in no scope (`keptSession`)
        var ctx: OpaquePointer? = esys
        Esys_Finalize(&ctx)
        Tss2_TctiLdr_Finalize(&tcti)
    }

    /// The one call point: counts the command and turns a non-zero code into a `TPMError`.
    /// TPM "retry" warnings are retried a few times, as the spec asks of callers.
    /// - Parameter sessions: the sessions authorizing the command: those started with continueSession
    ///   clear are closed by its success (the handle manager forgets them).
    func call(_ command: String, sessions: [ESYS_TR] = [], _ body: () -> UInt32) throws(TPMError) {
        var attempt = 0
        while true {
            if let unanswered { throw unanswered }
            if let broken { throw TPMError(command: command, code: broken.code, timedOut: false) }
            if let until = deadline.until, until <= .now {
                // The call's deadline passed before this command was sent (the TPM answered each
                // earlier one, slowly): it fails as one the TPM did not answer in time would.
                let error = TPMError(command: command, code: .success, timedOut: true)
                unanswered = error
                throw error
            }
            commandCount += 1
            TPMActivity.begin(command)
            let (raw, timedOut) = deadline.run(body)
            TPMActivity.end()
            let rc = TPMReturnCode(rawValue: raw)
            #if DEBUG
            if !outsideCrashPoints { Self.crashPointReached() }
            #endif
            if timedOut {
                let error = TPMError(command: command, code: rc, timedOut: true)
                unanswered = error
                throw error
            }
            if rc == .success {
                if !sessions.isEmpty { closeResources(handles.authorized(sessions)) }
                return
            }
            if rc.isRetryable && attempt < 50 {
                attempt += 1
                usleep(useconds_t(min(100_000, 1_000 * attempt)))
                continue
            }
            let error = TPMError(command: command, code: rc)
            if error.isConnectionFailure { broken = error }
            throw error
        }
    }

    /// Flushes that failed on this connection: the TPM may still hold what they were for.
    public internal(set) var failedFlushes = 0

    // MARK: Resources by TPM handle

    /// Makes an ESAPI resource for a persistent object or NV index (one ReadPublic/NV_ReadPublic).
    public func resource(forPersistent tpmHandle: UInt32) throws(TPMError) -> TPMHandle {
        var tr: ESYS_TR = 0
        try call("ReadPublic(0x\(Hex.encode(tpmHandle, digits: 1)))") {
            Esys_TR_FromTPMPublic(esys, tpmHandle, KC_ESYS_TR_NONE, KC_ESYS_TR_NONE, KC_ESYS_TR_NONE, &tr)
        }
        resources.append(tr)
        return TPMHandle(tr: tr, mustFlush: false)
    }

    /// Serializes a resource so a later process can use it without a ReadPublic.
    public func serialize(_ handle: TPMHandle) throws(TPMError) -> [UInt8] {
        var buffer: UnsafeMutablePointer<UInt8>?
        var size = 0
        let rc = Esys_TR_Serialize(esys, handle.tr, &buffer, &size)
        guard rc == 0, let buffer else { throw TPMError(command: "TR_Serialize", code: .init(rawValue: rc)) }
        defer { free(buffer) }
        return Array(UnsafeBufferPointer(start: buffer, count: size))
    }

    public func deserialize(_ bytes: [UInt8]) throws(TPMError) -> TPMHandle {
        var tr: ESYS_TR = 0
        let rc = Esys_TR_Deserialize(esys, bytes, bytes.count, &tr)
        guard rc == 0 else { throw TPMError(command: "TR_Deserialize", code: .init(rawValue: rc)) }
        resources.append(tr)
        return TPMHandle(tr: tr, mustFlush: false)
    }

    /// The TPM name (nameAlg || digest of the public area) ESAPI holds for a resource.
    public func name(of handle: TPMHandle) throws(TPMError) -> [UInt8] {
        var name: UnsafeMutablePointer<TPM2B_NAME>?
        let rc = Esys_TR_GetName(esys, handle.tr, &name)
        guard rc == 0, let name else { throw TPMError(command: "TR_GetName", code: .init(rawValue: rc)) }
        defer { Esys_Free(name) }
        return TPM2B.bytes(name.pointee.name, size: name.pointee.size)
    }

    /// Sets the authorization value ESAPI uses for an entity (a PIN, the owner's auth).
    public func setAuth(_ handle: TPMHandle, _ auth: SecureBytes?) throws(TPMError) {
        var value = TPM2B_AUTH()
        defer { TPM2B.wipe(&value.buffer) }
        if let auth {
            guard auth.count <= MemoryLayout.size(ofValue: value.buffer) else {
                throw TPMError(command: "TR_SetAuth", code: .size)
            }
            auth.withUnsafeBytes { value.size = TPM2B.set(&value.buffer, $0) }
        }
        let rc = Esys_TR_SetAuth(esys, handle.tr, &value)
        guard rc == 0 else { throw TPMError(command: "TR_SetAuth", code: .init(rawValue: rc)) }
    }

    #if DEBUG
    /// Test hook for crash-atomicity tests: with `KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS=N` the process
    /// ends right after its Nth TPM command has been answered, without any cleanup, as `kill -9` there would.
    /// Debug builds only: no environment variable can end a release build.
    private static let abortAfter: Int? = ProcessInfo.processInfo.environment["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS"]
        .flatMap { Int($0) }.flatMap { $0 > 0 ? $0 : nil }
    private static let processCommands = Atomic<Int>(0)
    private static let crashPointsPaused = Atomic<Bool>(false)

    private static func crashPointReached() {
        guard let abortAfter, !crashPointsPaused.load(ordering: .sequentiallyConsistent) else { return }
        if processCommands.add(1, ordering: .relaxed).newValue == abortAfter { _exit(134) }
    }
    #endif

    /// keychaind's start, before it says it is ready: the crash-atomicity tests' count
    /// (`KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS`) is of the commands of the requests they send, not the
    /// start's own. Nothing in a release build.
    public static func pausingCrashPoints<T>(_ body: () async -> T) async -> T {
        #if DEBUG
        crashPointsPaused.store(true, ordering: .sequentiallyConsistent)
        defer { crashPointsPaused.store(false, ordering: .sequentiallyConsistent) }
        #endif
        return await body()
    }

    /// The password session (TPM_RS_PW), for an entity whose authValue is empty.
    public static let passwordSession = TPMHandle(tr: KC_ESYS_TR_PASSWORD, mustFlush: false)
    public static let owner = TPMHandle(tr: KC_ESYS_TR_RH_OWNER, mustFlush: false)
    public static let lockout = TPMHandle(tr: KC_ESYS_TR_RH_LOCKOUT, mustFlush: false)
    static let none = KC_ESYS_TR_NONE
    static let password = KC_ESYS_TR_PASSWORD
}

/// Copying between Swift bytes and the fixed arrays of TPM2B structures (imported as tuples).
enum TPM2B {
    static func bytes<T>(_ buffer: T, size: UInt16) -> [UInt8] {
        withUnsafeBytes(of: buffer) { Array($0.prefix(Int(size))) }
    }
    @discardableResult
    static func set<T>(_ buffer: inout T, _ source: UnsafeRawBufferPointer) -> UInt16 {
        withUnsafeMutableBytes(of: &buffer) { dest in
            precondition(source.count <= dest.count, "TPM2B overflow")
            dest.copyMemory(from: source)
        }
        return UInt16(source.count)
    }
    static func set<T>(_ buffer: inout T, _ source: [UInt8]) -> UInt16 {
        source.withUnsafeBytes { set(&buffer, $0) }
    }
    static func wipe<T>(_ buffer: inout T) {
        withUnsafeMutableBytes(of: &buffer) { raw in _ = raw.initializeMemory(as: UInt8.self, repeating: 0) }
    }
}
