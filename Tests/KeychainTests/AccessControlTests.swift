import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// The six AccessControl values, each a TPM policy, with the simulated reader and scripted answers.
@Suite("Access control on a real TPM", .offThePool)
struct AccessControlTests {
    static let pin = "2468"

    struct Device {
        let simulated: SimulatedDevice
        var tpm: SoftwareTPM { simulated.tpm }
        var answers: ScriptedAuthenticator { simulated.answers }
        var configuration: KeychainConfiguration { simulated.configuration }
        var device: KeychainDevice { simulated.device }
        func storeService(_ service: String) -> String { simulated.storeService(service) }

        init(reader: Bool = true, passcode: Bool = true, fingers: [String] = ["thumb"]) async throws {
            simulated = try await SimulatedDevice(passcode: passcode ? bytes(AccessControlTests.pin) : nil,
                                                  fingers: fingers, reader: reader)
        }

        func storage(_ control: AccessControl, accessible: Accessible = .whenUnlockedThisDeviceOnly,
                     authValidity: Int = 0, service: String? = nil) throws -> Keychain {
            try createKeychain(.init(service: service ?? "svc.\(control.rawValue)", accessible: accessible,
                                     accessControl: control, authValidity: authValidity,
                                     prompt: .init(title: "Unlock", cancel: "Use password")),
                               configuration: configuration)
        }
    }

    static let biometric: [AccessControl] = [.biometryAny, .biometryCurrentSet, .biometryAnyOrPasscode, .biometryCurrentSetOrPasscode]

    @Test(arguments: AccessControl.allCases.filter { $0 != .none })
    func eachValueOpensWithTheRightAnswerAndRefusesTheWrongOnes(control: AccessControl) async throws {
        let d = try await Device()
        let store = try d.storage(control)
        try await store.setItem("k", "secret")
        #expect(d.answers.requests.isEmpty, "a write must never prompt")

        if control.usesBiometry {
            d.answers.push(.finger("thumb"))
            #expect(try await store.getItem("k") == "secret")
            d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
            #expect(await code { try await store.getItem("k") } == .authenticationFailed)
        }
        if control.allowsPasscode {
            d.answers.push(.passcode(bytes(Self.pin)))
            #expect(try await store.getItem("k") == "secret")
            d.answers.push(.passcode(bytes("0000")), .passcode(bytes("0000")), .passcode(bytes("0000")))
            #expect(await code { try await store.getItem("k") } == .authenticationFailed)
        } else {
            // The passcode is not an answer for a biometric-only item.
            d.answers.push(.passcode(bytes(Self.pin)), .passcode(bytes(Self.pin)), .passcode(bytes(Self.pin)))
            #expect(await code { try await store.getItem("k") } == .authenticationFailed)
        }
        if !control.usesBiometry {
            d.answers.push(.finger("thumb"), .finger("thumb"), .finger("thumb"))
            #expect(await code { try await store.getItem("k") } == .authenticationFailed)
        }
        d.answers.push(.cancel)
        #expect(await code { try await store.getItem("k") } == .userCanceled)
        d.answers.push(.fallback)
        #expect(await code { try await store.getItem("k") } == .userFallback)
        d.answers.push(.interrupted)
        #expect(await code { try await store.getItem("k") } == .systemCanceled)
        #expect(try await store.hasItem("k"))
        // The prompt carried the storage's fields, and the methods the item allows.
        let request = try #require(d.answers.requests.first)
        #expect(request.prompt.title == "Unlock" && request.prompt.cancel == "Use password")
        #expect(request.methods.contains(.fingerprint) == control.usesBiometry)
        #expect(request.methods.contains(.passcode) == control.allowsPasscode)
    }

    /// Access control with every level, `always` included (a policy of the access-control branch alone).
    @Test(arguments: Accessible.allCases)
    func eachLevelCombinesWithAccessControl(level: Accessible) async throws {
        let d = try await Device()
        let any = try d.storage(.biometryAnyOrPasscode, accessible: level, service: "lvl.any")
        let pin = try d.storage(.passcode, accessible: level, service: "lvl.pin")
        try await any.setItem("k", "finger or pin")
        try await pin.setItem("k", "pin")
        d.answers.push(.finger("thumb"))
        #expect(try await any.getItem("k") == "finger or pin")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await pin.getItem("k") == "pin")
    }

    @Test func aCallsPromptIsMergedFieldByField() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryAny)
        try await store.setItem("k", "v")
        d.answers.push(.finger("thumb"))
        _ = try await store.getItem("k", options: .init(prompt: .init(title: "Confirm the payment")))
        let prompt = try #require(d.answers.requests.last?.prompt)
        #expect(prompt.title == "Confirm the payment" && prompt.cancel == "Use password")
    }

    @Test func withoutAnAuthenticatorAReadIsInteractionNotAllowedAndChangesNothing() async throws {
        let d = try await Device()
        var configuration = d.configuration
        configuration.authenticator = nil
        let store = try createKeychain(.init(service: "quiet", accessControl: .passcode), configuration: configuration)
        try await store.setItem("k", "v")
        #expect(await code { try await store.getItem("k") } == .interactionNotAllowed)
        #expect(try await store.hasItem("k"))
    }

    // MARK: The seed's write matrix

    struct Cell: Sendable, CustomStringConvertible {
        let device: String, control: AccessControl, expected: KeychainError.Code?
        var description: String { "\(device) × \(control.rawValue) → \(expected?.rawValue ?? "written")" }
    }

    static let matrix: [Cell] = [
        .init(device: "noReader", control: .biometryAny, expected: .biometryNotAvailable),
        .init(device: "noReader", control: .biometryCurrentSet, expected: .biometryNotAvailable),
        .init(device: "noReader", control: .biometryCurrentSetOrPasscode, expected: .biometryNotAvailable),
        .init(device: "noReader", control: .biometryAnyOrPasscode, expected: nil),
        .init(device: "noReader", control: .passcode, expected: nil),
        .init(device: "noFingers", control: .biometryAny, expected: .biometryNotEnrolled),
        .init(device: "noFingers", control: .biometryCurrentSet, expected: .biometryNotEnrolled),
        .init(device: "noFingers", control: .biometryCurrentSetOrPasscode, expected: .biometryNotEnrolled),
        .init(device: "noFingers", control: .biometryAnyOrPasscode, expected: nil),
        .init(device: "noFingers", control: .passcode, expected: nil),
        .init(device: "noPasscode", control: .biometryAny, expected: .passcodeNotSet),
        .init(device: "noPasscode", control: .biometryCurrentSet, expected: .passcodeNotSet),
        .init(device: "noPasscode", control: .biometryCurrentSetOrPasscode, expected: .passcodeNotSet),
        .init(device: "noPasscode", control: .biometryAnyOrPasscode, expected: .passcodeNotSet),
        .init(device: "noPasscode", control: .passcode, expected: .passcodeNotSet),
    ]

    @Test(arguments: matrix)
    func theWriteMatrixOfTheSeed(cell: Cell) async throws {
        let d = try await Device(reader: cell.device != "noReader", passcode: cell.device != "noPasscode",
                                 fingers: cell.device == "noFingers" ? [] : ["thumb"])
        let store = try d.storage(cell.control)
        let check = try await store.canUseAccessControl(cell.control)
        #expect(await code { try await store.setItem("k", "v") } == cell.expected)
        #expect(try await store.hasItem("k") == (cell.expected == nil))
        #expect(check.available == (cell.expected == nil))
        switch cell.expected {
        case .biometryNotAvailable?: #expect(check.reason == .notAvailable)
        case .biometryNotEnrolled?: #expect(check.reason == .notEnrolled)
        case .passcodeNotSet?: #expect(check.reason == .passcodeNotSet)
        default: #expect(check.reason == nil)
        }
        if cell.expected == nil {
            d.answers.push(.passcode(bytes(Self.pin)))
            #expect(try await store.getItem("k") == "v", "the passcode opens it")
        }
        #expect(d.answers.requests.count == (cell.expected == nil ? 1 : 0))
    }

    // MARK: Enrollment changes

    @Test func currentSetItemsAreInvalidatedByAnEnrollmentChangeAndAnyItemsAreNot() async throws {
        let d = try await Device()
        let current = try d.storage(.biometryCurrentSet)
        let any = try d.storage(.biometryAny)
        try await current.setItem("k", "current")
        try await any.setItem("k", "any")
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        #expect(await code { try await current.getItem("k") } == .keyInvalidated)
        #expect(try await current.hasItem("k") == false, "the invalidated item is gone")
        d.answers.push(.finger("index"))
        #expect(try await any.getItem("k") == "any", "a finger enrolled later opens Any items")
        // A new CurrentSet item written after the change opens; a removal invalidates it again.
        try await current.setItem("k", "current 2")
        d.answers.push(.finger("thumb"))
        #expect(try await current.getItem("k") == "current 2")
        try await d.device.removeFinger("index", passcode: bytes(Self.pin))
        #expect(await code { try await current.getItem("k") } == .keyInvalidated)
        d.answers.push(.finger("thumb"))
        #expect(try await any.getItem("k") == "any")
        let store = try Store(directory: d.configuration.storeDirectory)
        #expect(try store.wrappingKeys(service: d.storeService("svc.biometryCurrentSet")).isEmpty, "its wrapping key went with it")
    }

    @Test func anyOrPasscodeItemsSurviveRemovingEveryFinger() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryAnyOrPasscode)
        try await store.setItem("a", "1")
        try await d.device.removeFinger("thumb", passcode: bytes(Self.pin))
        try await store.setItem("b", "2")  // written with the passcode branch: the old items stay
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await store.getItem("a") == "1")
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await store.getItem("b") == "2")
    }

    @Test func unlockingWithThePasscodeEndsAReaderLockout() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryAny)
        try await store.setItem("k", "v")
        d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        _ = await code { try await store.getItem("k") }
        d.answers.push(.finger("pinky"), .finger("pinky"))
        #expect(await code { try await store.getItem("k") } == .lockout)
        try await d.device.unlock(passcode: bytes(Self.pin))
        d.answers.push(.finger("thumb"))
        #expect(try await store.getItem("k") == "v")
    }

    @Test func enrollingNeedsThePasscode() async throws {
        let d = try await Device()
        #expect(await code { try await d.device.enrollFinger("index", passcode: nil) } == .authenticationFailed)
        #expect(await code { try await d.device.enrollFinger("index", passcode: bytes("0000")) } == .authenticationFailed)
        #expect(try await d.device.enrolledFingers() == ["thumb"])
    }

    // MARK: Lockouts

    @Test func theReaderLocksOutAfterFiveFailuresAndPermanentlyAfterTenUntilThePasscode() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryAnyOrPasscode)
        try await store.setItem("k", "v")
        d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        #expect(await code { try await store.getItem("k") } == .authenticationFailed)  // 3 failures
        d.answers.push(.finger("pinky"), .finger("pinky"))
        #expect(await code { try await store.getItem("k") } == .lockout)  // the 5th
        d.answers.push(.finger("thumb"))
        #expect(await code { try await store.getItem("k") } == .lockout, "even an enrolled finger is refused")
        // The passcode opens the item and ends the lockout.
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await store.getItem("k") == "v")
        d.answers.push(.finger("thumb"))
        #expect(try await store.getItem("k") == "v")
        // Touches during the lockout keep counting: the 10th failure makes it permanent.
        d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        #expect(await code { try await store.getItem("k") } == .authenticationFailed)  // 3
        d.answers.push(.finger("pinky"), .finger("pinky"))
        #expect(await code { try await store.getItem("k") } == .lockout)  // 5
        for _ in 6...9 {
            d.answers.push(.finger("thumb"))
            #expect(await code { try await store.getItem("k") } == .lockout)
        }
        d.answers.push(.finger("thumb"))
        #expect(await code { try await store.getItem("k") } == .lockoutPermanent)  // 10
        let readerOnly = try d.storage(.biometryAny)
        try await readerOnly.setItem("k", "v")
        d.answers.push(.finger("thumb"))
        #expect(await code { try await readerOnly.getItem("k") } == .lockoutPermanent)
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await store.getItem("k") == "v")
        d.answers.push(.finger("thumb"))
        #expect(try await readerOnly.getItem("k") == "v")
    }

    // MARK: Never a prompt but for reads

    @Test(arguments: AccessControl.allCases)
    func nothingButAReadEverPrompts(control: AccessControl) async throws {
        let d = try await Device()
        var configuration = d.configuration
        configuration.authenticator = FailingAuthenticator { request in
            Issue.record("prompted for \(request.key) outside a read")
        }
        let store = try createKeychain(.init(service: "never", accessControl: control), configuration: configuration)
        try await store.setItem("a", "1")
        try await store.setItem("a", "2")
        #expect(try await store.hasItem("a"))
        #expect(try await store.getAllKeys() == ["a"])
        #expect(try await store.getItemInfo("a")?.accessControl == control)
        try await store.removeItem("a")
        try await store.setItem("b", "3")
        try await store.clear()
        #expect(try await store.getAllKeys() == [])
        _ = try await store.canUseAccessControl(control)
    }

    // MARK: authValidity

    @Test func authValiditySkipsThePromptWithinTheWindow() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryAny, authValidity: 300)
        try await store.setItem("k", "v")
        d.answers.push(.finger("thumb"))
        #expect(try await store.getItem("k") == "v")
        #expect(try await store.getItem("k") == "v")
        #expect(d.answers.requests.count == 1)
        let every = try d.storage(.biometryAny, service: "every")
        try await every.setItem("k", "v")
        d.answers.push(.finger("thumb"), .finger("thumb"))
        _ = try await every.getItem("k")
        _ = try await every.getItem("k")
        #expect(d.answers.requests.count == 3)
    }

    /// `endAuthenticationWindow` ends the storage's window: the next read asks again, and only that
    /// storage's (another service's window stays open). Through keychaind as well: this suite runs again
    /// through it (ContractThroughDaemonTests), where the window is the daemon's and the call its storage call 9.
    @Test func endingTheWindowMakesTheNextReadAskAgain() async throws {
        let d = try await Device()
        let store = try d.storage(.passcode, authValidity: 300)
        let other = try d.storage(.passcode, authValidity: 300, service: "other")
        try await store.setItem("k", "v")
        try await other.setItem("k", "w")
        d.answers.push(.passcode(bytes(Self.pin)), .passcode(bytes(Self.pin)))
        #expect(try await store.getItem("k") == "v")
        #expect(try await other.getItem("k") == "w")
        #expect(try await store.getItem("k") == "v")
        #expect(d.answers.requests.count == 2, "inside the windows: no question after the first of each")
        try await store.endAuthenticationWindow()
        d.answers.push(.passcode(bytes(Self.pin)))
        #expect(try await store.getItem("k") == "v")
        #expect(d.answers.requests.count == 3, "the read after the window ended did not ask")
        #expect(try await other.getItem("k") == "w")
        #expect(d.answers.requests.count == 3, "ending one storage's window ended another's")
    }

    // MARK: Bypass with the stored blobs and direct ESAPI

    @Test func aBiometricKeyDoesNotUnsealWithoutTheReadersSignatureOverTheCurrentSet() async throws {
        let d = try await Device()
        let store = try d.storage(.biometryCurrentSet, accessible: .always)
        try await store.setItem("k", "v")
        let raw = try Store(directory: d.configuration.storeDirectory)
        let record = try #require(try raw.wrappingKeys(service: d.storeService("svc.biometryCurrentSet")).first)
        let policy = try #require(SealPolicy.decode(record.policy))
        let binding = try #require(policy.biometry)
        let reader = try FingerprintReader(directory: d.configuration.readerDirectory!)
        let blob = TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate)

        // Each attempt has its own connection: swtpm serves one client at a time, and the library
        // connects for each of its own operations in between.
        func attempt(_ sign: (_ nonce: [UInt8]) -> (hmac: [UInt8], ref: [UInt8])?) throws -> Bool {
            let context = try TPMContext(device: d.tpm.device)
            let srk = try context.resource(forPersistent: 0x8100_0001)
            let readerKey = try context.resource(forPersistent: binding.tpmHandle)
            let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
            defer { context.flush(session) }
            let object = try context.load(blob, parent: srk)
            defer { context.flush(object) }
            // The common steps first: the key is bound to the passcode epoch (a removal ends it).
            try context.run(policy.steps, on: session, nvIndex: { _ throws(TPMError) in
                try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            })
            do {
                if let (hmac, ref) = sign(try context.nonceTPM(session)) {
                    try context.policySigned(session, authObject: readerKey, nonceTPM: try context.nonceTPM(session),
                                             policyRef: ref, hmac: hmac)
                }
                _ = try context.unseal(object, session: session)
                return true
            } catch { return false }
        }
        // The control: the reader's fresh signature over today's set (and this key) opens it.
        let ref = policy.signedRef
        #expect(try attempt { nonce in (reader.sign(nonceTPM: nonce, for: binding, keyRef: policy.keyRef)!, ref) })
        #expect(try !attempt { _ in nil }, "no signature")
        #expect(try !attempt { nonce in (Sodium.hmacSHA256(key: SecureBytes(random: 32), message: TPMContext.policySignedDigest(nonceTPM: nonce, policyRef: ref)), ref) }, "a forged signature")
        // A signature captured from an earlier session is refused: it covers that session's nonce.
        var captured: [UInt8] = []
        _ = try attempt { nonce in captured = reader.sign(nonceTPM: nonce, for: binding, keyRef: policy.keyRef)!; return (captured, ref) }
        #expect(try !attempt { _ in (captured, ref) }, "a replayed signature")
        // After an enrollment change the reader signs the new set only: the old set's policy fails.
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        let changed = try FingerprintReader(directory: d.configuration.readerDirectory!)
        #expect(changed.sign(nonceTPM: [1], for: binding, keyRef: policy.keyRef) == nil)
        var today = binding
        today.enrollmentSet = changed.enrollmentSet
        let todayRef = FingerprintReader.policyRef(currentSet: true, enrollmentSet: today.enrollmentSet, keyRef: policy.keyRef)
        #expect(try !attempt { nonce in (changed.sign(nonceTPM: nonce, for: today, keyRef: policy.keyRef)!, todayRef) })
    }

    @Test func aPasscodeKeyDoesNotUnsealWithoutThePIN() async throws {
        let d = try await Device()
        let store = try d.storage(.passcode, accessible: .always)
        try await store.setItem("k", "v")
        let raw = try Store(directory: d.configuration.storeDirectory)
        let record = try #require(try raw.wrappingKeys(service: d.storeService("svc.passcode")).first)
        let context = try TPMContext(device: d.tpm.device)
        let srk = try context.resource(forPersistent: 0x8100_0001)
        let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
        let blob = TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate)
        let keyRef = try #require(SealPolicy.decode(record.policy)?.keyRef)
        let policy = try #require(SealPolicy.decode(record.policy))
        func attempt(_ guess: String?) throws -> Bool {
            let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
            defer { context.flush(session) }
            let object = try context.load(blob, parent: srk)
            defer { context.flush(object) }
            // The common steps first: the key is bound to the passcode epoch (a removal ends it).
            try context.run(policy.steps, on: session, nvIndex: { _ throws(TPMError) in
                try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            })
            do {
                if let guess {
                    try context.setAuth(pin, bytes(guess))
                    let auth = try context.startSession(.hmac, saltKey: srk, continueSession: true)
                    defer { context.flush(auth) }
                    try context.policySecret(session, entity: pin, authSession: auth, policyRef: keyRef)
                }
                _ = try context.unseal(object, session: session)
                return true
            } catch { return false }
        }
        #expect(try attempt(Self.pin), "the control: the right PIN opens it")
        #expect(try !attempt(nil))
        #expect(try !attempt("0000"))
    }

    /// After `passcode remove` the PIN index's authValue is empty, so anyone passes its PolicySecret:
    /// the key's policy also asserts the passcode epoch of its seal, which the removal bumped, so the
    /// TPM refuses the stored blob even with every other step satisfied (issue 21).
    @Test func aPasscodeKeyDoesNotUnsealWithTheEmptyPINAfterThePasscodeIsRemoved() async throws {
        let d = try await Device()
        let store = try d.storage(.passcode, accessible: .always)
        try await store.setItem("k", "v")
        let raw = try Store(directory: d.configuration.storeDirectory)
        let record = try #require(try raw.wrappingKeys(service: d.storeService("svc.passcode")).first)
        let policy = try #require(SealPolicy.decode(record.policy))
        let blob = TPMContext.SealedBlob(publicArea: record.sealedPublic, privateArea: record.sealedPrivate)
        /// The policy as sealed (the epoch the key was made at, the PIN's PolicySecret), then Unseal.
        func attempt(_ guess: String) throws -> Bool {
            let context = try TPMContext(device: d.tpm.device)
            let srk = try context.resource(forPersistent: 0x8100_0001)
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
            defer { context.flush(session) }
            let object = try context.load(blob, parent: srk)
            defer { context.flush(object) }
            do {
                try context.run(policy.steps, on: session, nvIndex: { _ throws(TPMError) in
                    try context.resource(forPersistent: DeviceLockLayout.epochIndex)
                })
                try context.setAuth(pin, guess.isEmpty ? nil : bytes(guess))
                let auth = try context.startSession(.hmac, saltKey: srk, continueSession: true)
                defer { context.flush(auth) }
                try context.policySecret(session, entity: pin, authSession: auth, policyRef: policy.keyRef ?? [])
                _ = try context.unseal(object, session: session)
                return true
            } catch { return false }
        }
        #expect(try attempt(Self.pin), "the control: the right PIN opens it while the passcode is set")
        #expect(policy.passcodeEpoch != nil, "the key is bound to the passcode epoch")
        try await d.device.removePasscode(current: bytes(Self.pin))
        #expect(try !attempt(""), "the empty PIN opened the key of a removed passcode")
    }
}
