import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// Issue 10: the seed's authValidity as a property of the item, CurrentSet siblings after an
/// enrollment change, and a locked device that fails before any prompt.
///
/// Run in-process and, with `KEYCHAIN_TEST_THROUGH_DAEMON=1` (`ContractThroughDaemonTests`), through
/// keychaind: the store files the tests inspect are then the daemon's, its services `uid:N/…`
/// (`d.storeService`), and "another store on the TPM" is a second daemon (`otherStore`).
@Suite("Seed contract: item windows, CurrentSet siblings, lock before prompt", .offThePool)
struct SeedContractTests {
    static let pin = AccessControlTests.pin
    typealias Device = AccessControlTests.Device

    func storage(_ d: Device, _ control: AccessControl, accessible: Accessible = .whenUnlocked, authValidity: Int = 0,
                 service: String = "svc") throws -> Keychain {
        try createKeychain(.init(service: service, accessible: accessible, accessControl: control, authValidity: authValidity),
                           configuration: d.configuration)
    }

    func wrappingKey(_ d: Device, service: String = "svc") throws -> WrappingKeyRecord {
        try #require(try Store(directory: d.configuration.storeDirectory).wrappingKeys(service: d.storeService(service)).first)
    }

    func ticketName(_ d: Device, service: String = "svc") throws -> String {
        StoreMeta.ticket(service: d.storeService(service), protection: try wrappingKey(d, service: service).protection)
    }

    func storedTicket(_ d: Device, service: String = "svc") throws -> TPMKeyring.StoredTicket? {
        let store = try Store(directory: d.configuration.storeDirectory)
        return try store.meta(try ticketName(d, service: service)).map { try JSONDecoder().decode(TPMKeyring.StoredTicket.self, from: Data($0)) }
    }

    /// Another store on the same TPM (and reader, when given), with `d`'s answers: in-process, or a
    /// second keychaind serving it when `d` is served by one. Keep `daemon` while it is used.
    struct OtherStore {
        let configuration: KeychainConfiguration
        let daemon: KeychainDaemon?
    }

    func otherStore(_ d: Device, reader: String?) throws -> OtherStore {
        let directory = d.tpm.directory + "/second"
        if d.simulated.daemon != nil {
            let daemon = try KeychainDaemon(tpm: d.tpm, store: directory, reader: reader)
            return OtherStore(configuration: daemon.configuration(authenticator: d.answers), daemon: daemon)
        }
        var second = d.tpm.configuration(store: directory)
        second.readerDirectory = reader
        second.authenticator = d.answers
        return OtherStore(configuration: second, daemon: nil)
    }

    // MARK: Item 1: the window is the item's

    /// Written with a per-call authValidity of 600 by a storage without a window; read by a storage
    /// without one: asked once, then not again, in this process or in a new one (a TPM ticket).
    /// Ten minutes, so that the whole suite's load never ends the window between the reads.
    @Test(arguments: [AccessControl.biometryAny, .passcode])
    func aWindowGivenAtTheWriteIsHonouredByAReaderWithoutOne(control: AccessControl) async throws {
        let d = try await Device()
        let writer = try storage(d, control)
        try await writer.setItem("k", "v", options: .init(authValidity: 600))
        let reader = try storage(d, control)
        d.answers.push(control == .passcode ? .passcode(bytes(Self.pin)) : .finger("thumb"))
        #expect(try await reader.getItem("k") == "v")
        #expect(d.answers.requests.count == 1)
        #expect(try await reader.getItem("k") == "v")
        await d.device.dropCaches()  // a new process: the ticket in the store stands in for the prompt
        #expect(try await reader.getItem("k") == "v")
        #expect(d.answers.requests.count == 1, "a read inside the item's window asked again")
        let ticket = try #require(try storedTicket(d))
        #expect(ticket.expires - (ticket.issued ?? 0) == 600_000, "the ticket's window is the item's")
        #expect(try wrappingKey(d).protection.hasSuffix("/600"))
        #expect(SealPolicy.decode(try wrappingKey(d).policy)?.authValidity == 600)
    }

    /// Written without a window: a reading storage of 300 s cannot widen it; every read asks.
    @Test func aReaderCannotWidenAnItemsWindow() async throws {
        let d = try await Device()
        try await storage(d, .biometryAnyOrPasscode).setItem("k", "v")
        let wide = try storage(d, .biometryAnyOrPasscode, authValidity: 300)
        for round in 1...2 {
            d.answers.push(.finger("thumb"))
            #expect(try await wide.getItem("k") == "v")
            #expect(d.answers.requests.count == round)
        }
        await d.device.dropCaches()
        d.answers.push(.cancel)
        #expect(await code { try await wide.getItem("k") } == .userCanceled)
        #expect(try storedTicket(d) == nil, "a ticket was made for an item without a window")
    }

    /// A read may ask for a shorter window than the item's: its ticket and its cache are that short,
    /// and a ticket made for the item's longer window is used only within the shorter one.
    @Test func aReaderMayShortenTheWindow() async throws {
        let d = try await Device()
        try await storage(d, .biometryAny, authValidity: 300).setItem("k", "v")
        d.answers.push(.finger("thumb"))
        #expect(try await storage(d, .biometryAny, authValidity: 5).getItem("k") == "v")
        let ticket = try #require(try storedTicket(d))
        #expect(ticket.expires - (ticket.issued ?? 0) == 5_000)
        // A 300 s ticket made 10 s ago is inside the item's window but outside a 5 s read's.
        var old = ticket
        old.issued = Engine.now() - 10_000
        old.expires = old.issued! + 300_000
        let store = try Store(directory: d.configuration.storeDirectory)
        let name = try ticketName(d)
        try store.write { try $0.setMeta(name, Array(try JSONEncoder().encode(old))) }
        await d.device.dropCaches()
        d.answers.push(.cancel)
        #expect(await code { try await storage(d, .biometryAny, authValidity: 5).getItem("k") } == .userCanceled)
        #expect(d.answers.requests.count == 2)
    }

    /// The window is bound in the key: the reader signs no expiration beyond the window in the
    /// policyRef it signs, and a signature made for a longer window (the same key, another policyRef)
    /// does not satisfy the key's policy in the TPM. The stored window edited is DATA_CORRUPTED.
    @Test func theWindowIsBoundInTheKeysPolicy() async throws {
        let d = try await Device()
        try await storage(d, .biometryAny, accessible: .always, authValidity: 60).setItem("k", "v")
        let record = try wrappingKey(d)
        let policy = try #require(SealPolicy.decode(record.policy))
        let binding = try #require(policy.biometry)
        let reader = try FingerprintReader(directory: d.configuration.readerDirectory!)
        #expect(reader.sign(nonceTPM: [1], for: binding, keyRef: policy.keyRef, window: 60, expiration: -60) != nil)
        #expect(reader.sign(nonceTPM: [1], for: binding, keyRef: policy.keyRef, window: 60, expiration: -61) == nil)

        /// Raw ESAPI: PolicySigned with the reader's signature for `window`, Unseal; the ticket if it opened.
        func attempt(window: Int) throws -> (opened: Bool, ticket: PolicyTicket?) {
            let context = try TPMContext(device: d.tpm.device)
            let srk = try context.resource(forPersistent: 0x8100_0001)
            let session = try context.startSession(.policy, saltKey: srk, encryptResponse: true, continueSession: true)
            defer { context.flush(session) }
            let object = try context.load(.init(publicArea: record.sealedPublic, privateArea: record.sealedPrivate), parent: srk)
            defer { context.flush(object) }
            // The common steps first: the key is bound to the passcode epoch (a removal ends it).
            try context.run(policy.steps, on: session, nvIndex: { _ throws(TPMError) in
                try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            })
            var claimed = policy
            claimed.authValidity = window
            let nonce = try context.nonceTPM(session)
            let hmac = try #require(reader.sign(nonceTPM: nonce, for: binding, keyRef: policy.keyRef, window: window,
                                                expiration: Int32(-window)))
            let readerKey = try context.deserialize(try #require(reader.state?.keyTR))
            let ticket = try context.policySigned(session, authObject: readerKey, nonceTPM: nonce, policyRef: claimed.signedRef,
                                                  hmac: hmac, expiration: Int32(-window))
            do { _ = try context.unseal(object, session: session); return (true, ticket) } catch { return (false, ticket) }
        }
        let control = try attempt(window: 60)
        #expect(control.opened && control.ticket != nil, "the control: the key's own window opens it")
        #expect(try attempt(window: 3600).opened == false, "a signature for a longer window opened the key")

        // The store's copy of the window edited to an hour: refused before any prompt.
        var edited = policy
        edited.authValidity = 3600
        var tampered = record
        tampered.policy = edited.encoded()
        try Store(directory: d.configuration.storeDirectory).write { try $0.putWrappingKey(tampered) }
        await d.device.dropCaches()
        #expect(await code { try await storage(d, .biometryAny, accessible: .always).getItem("k") } == .dataCorrupted)
        #expect(d.answers.requests.isEmpty)
    }

    /// An item written before windows were stored keeps the reading storage's window.
    @Test func anItemWithoutAStoredWindowTakesTheReadersAsBefore() {
        #expect(Engine.window(tag: "whenUnlocked/biometryAny", asked: 30) == 30)
        #expect(Engine.window(tag: "whenUnlocked/biometryAny/60", asked: 0) == 60)
        #expect(Engine.window(tag: "whenUnlocked/biometryAny/60", asked: 30) == 30)
        #expect(Engine.window(tag: "whenUnlocked/biometryAny/60", asked: 600) == 60)
        #expect(Engine.window(tag: "whenUnlocked/passcode/0@strongbox", asked: 600) == 0)
    }

    // MARK: Item 2: biometryAnyOrPasscode written before any finger

    /// Written while no finger was enrolled (the passcode branch alone); enrolling a finger seals the
    /// key again with both branches: the finger opens the item written before, with no passcode read
    /// in between, and later writes of the service too; the passcode still opens them.
    @Test func anAnyOrPasscodeItemWrittenBeforeAnyFingerOpensWithTheFingerEnrolledLater() async throws {
        let d = try await Device(fingers: [])
        let store = try storage(d, .biometryAnyOrPasscode)
        try await store.setItem("k", "before")
        let before = try wrappingKey(d)
        #expect(SealPolicy.decode(before.policy)?.biometry == nil, "written with the passcode branch alone")
        try await d.device.enrollFinger("thumb", passcode: bytes(Self.pin))
        let after = try wrappingKey(d)
        #expect(after.publicKey == before.publicKey && after.sealedPrivate != before.sealedPrivate)
        #expect(SealPolicy.decode(after.policy)?.biometry != nil)
        d.answers.push(.finger("thumb"))
        #expect(try await store.getItem("k") == "before")
        #expect(d.answers.requests.last?.methods == [.fingerprint, .passcode])
        try await store.setItem("k2", "after")
        d.answers.push(.finger("thumb"), .passcode(bytes(Self.pin)))
        #expect(try await store.getItem("k2") == "after")
        #expect(try await store.getItem("k") == "before")
    }

    /// A key the enrollment did not reach (another store on the TPM; or a killed enrollment, below)
    /// gets the reader's branch at its next read with the passcode.
    @Test func aKeyTheEnrollmentMissedGetsTheFingerAtItsNextPasscodeRead() async throws {
        let d = try await Device(fingers: [])
        let second = try otherStore(d, reader: d.configuration.readerDirectory)
        let other = try createKeychain(.init(service: "svc", accessControl: .biometryAnyOrPasscode), configuration: second.configuration)
        try await other.setItem("k", "v")
        try await d.device.enrollFinger("thumb", passcode: bytes(Self.pin))
        d.answers.push(.finger("thumb"), .finger("thumb"), .finger("thumb"))
        #expect(await code { try await other.getItem("k") } == .authenticationFailed, "the finger opened a passcode-only key")
        d.answers.push(.passcode(bytes(Self.pin)), .finger("thumb"))
        #expect(try await other.getItem("k") == "v")
        #expect(try await other.getItem("k") == "v")
        #expect(d.answers.requests.last?.methods.contains(.fingerprint) == true)
    }

    /// `reader enroll` killed after each of its TPM commands in turn: the item written before never
    /// stops opening with the passcode, and whenever the finger is enrolled it opens the item too
    /// (after that passcode read, when the kill came before the key was sealed again).
    /// In-process the killed process is keychainctl; through keychaind it is the daemon (keychainctl
    /// is its client), started again on its socket after each kill.
    @Test func anEnrollmentKilledAtEveryTPMCommandNeverLosesTheItemAndTheFingerEndsUpOpeningIt() throws {
        let tpm = try SoftwareTPM()
        let dir = tpm.directory + "/store"
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let daemon = SimulatedDevice.throughDaemonByDefault ? try KeychainDaemon(tpm: tpm, store: dir, reader: dir + ".reader") : nil
        func cli(_ args: [String], _ input: String = "", abortAfter: Int? = nil) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            let abort = abortAfter.map { ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\($0)"] } ?? [:]
            guard let daemon else {
                return try run(ctl, ["--store", dir, "--tcti", tpm.tcti] + args, input: Array(input.utf8), environment: abort)
            }
            guard abortAfter != nil else { return try run(ctl, args, input: Array(input.utf8), environment: daemon.environment) }
            daemon.kill()
            try daemon.start(environment: abort)
            var result = try run(ctl, args, input: Array(input.utf8), environment: daemon.environment)
            if result.status != 0 && result.stderr.contains("stopped during the call") {
                // The daemon's abort, seen by its client as the service stopping mid-call.
                result.status = daemon.waitForExit() ?? 0
            } else {
                daemon.kill()
            }
            try daemon.start()
            return result
        }
        #expect(try cli(["passcode", "set"], Self.pin + "\n").status == 0)
        /// Whether the reader's file lists the finger (read directly: no process, no TPM).
        func enrolled() throws -> Bool {
            guard let data = FileManager.default.contents(atPath: dir + ".reader/reader.json") else { return false }
            let state = try JSONSerialization.jsonObject(with: data) as? [String: Any]
            return (state?["fingers"] as? [String: Any])?["thumb"] != nil
        }
        var service = ""
        var killed = 0
        for n in 1...60 {
            if service.isEmpty {  // a new passcode-only item (no finger is enrolled)
                service = "s\(n)"
                #expect(try cli(["set", service, "k", "--access-control", "biometryAnyOrPasscode"], service).status == 0)
            }
            let enroll = try cli(["reader", "enroll", "thumb"], Self.pin + "\n", abortAfter: n)
            #expect(enroll.status == 134 || enroll.status == 0, "kill \(n): \(enroll.stderr)")
            if enroll.status == 134 { killed += 1 }
            let byPasscode = try cli(["get", service, "k", "--passcode-stdin"], Self.pin + "\n")
            #expect(byPasscode.stdout == Array(service.utf8), "kill \(n): \(byPasscode.stderr)")
            if try enrolled() {
                let byFinger = try cli(["get", service, "k", "--touch", "thumb"])
                #expect(byFinger.stdout == Array(service.utf8), "kill \(n): the enrolled finger: \(byFinger.stderr)")
                #expect(try cli(["reader", "remove", "thumb"], Self.pin + "\n").status == 0)
                service = ""
            }
            if enroll.status == 0 {
                #expect(n > 1 && killed == n - 1, "every earlier enrollment was killed by the hook")
                return
            }
            if n % 4 == 0 { #expect(try cli(["passcode", "reset-tries"]).status == 0) }
        }
        Issue.record("reader enroll never completed")
    }

    // MARK: Item 3: CurrentSet siblings after an enrollment change

    /// Three CurrentSet items, a new finger, a write of one: each other item reports KEY_INVALIDATED
    /// once, before any prompt, then is gone; getAllKeys and hasItem keep their answers until then.
    /// Twice, so items of two dead keys are told apart; the dead keys leave with their last item.
    @Test(arguments: [AccessControl.biometryCurrentSet, .biometryCurrentSetOrPasscode])
    func aWriteAfterANewFingerLeavesEachSiblingToReportKeyInvalidatedOnce(control: AccessControl) async throws {
        let d = try await Device()
        let store = try storage(d, control)
        for key in ["a", "b", "c"] { try await store.setItem(key, "old \(key)") }
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        try await store.setItem("a", "new a")
        #expect(try await store.getAllKeys() == ["a", "b", "c"])
        #expect(try await store.hasItem("b"))
        #expect(try await store.hasItem("c"))
        #expect(await code { try await store.getItem("b") } == .keyInvalidated)
        #expect(try await store.getAllKeys() == ["a", "c"])
        #expect(try await store.getItem("b") == nil)

        try await d.device.enrollFinger("ring", passcode: bytes(Self.pin))
        try await store.setItem("d", "new d")
        #expect(try await store.getAllKeys() == ["a", "c", "d"])
        #expect(await code { try await store.getItem("a") } == .keyInvalidated)
        #expect(await code { try await store.getItem("c") } == .keyInvalidated)
        #expect(try await store.getItem("a") == nil)
        #expect(try await store.getItem("c") == nil)
        #expect(d.answers.requests.isEmpty, "an invalidated item prompted")
        d.answers.push(.finger("ring"))
        #expect(try await store.getItem("d") == "new d")
        #expect(try await store.getAllKeys() == ["d"])
        let keys = try Store(directory: d.configuration.storeDirectory).wrappingKeys(service: d.storeService("svc"))
        #expect(keys.map(\.protection) == ["whenUnlocked/\(control.rawValue)"], "dead keys outlived their items")
    }

    /// A dead key's item overwritten or removed releases it: nothing of the old key is left behind.
    @Test func overwritingOrRemovingTheLastOldItemDropsTheDeadKey() async throws {
        let d = try await Device()
        let store = try storage(d, .biometryCurrentSet)
        for key in ["a", "b", "c"] { try await store.setItem(key, key) }
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        try await store.setItem("a", "new")
        try await store.setItem("b", "new")
        try await store.removeItem("c")
        let raw = try Store(directory: d.configuration.storeDirectory)
        #expect(try raw.wrappingKeys(service: d.storeService("svc")).count == 1)
        for key in ["a", "b", "c"] { #expect(try raw.meta(StoreMeta.retired(service: d.storeService("svc"), key: key)) == nil) }
        d.answers.push(.finger("index"), .finger("thumb"))
        #expect(try await store.getItem("b") == "new")
        #expect(try await store.getItem("a") == "new")
    }

    /// The same for a passcode removal seen by another store on the TPM: its whenPasscodeSet key is
    /// dead (the epoch moved), and a write there leaves the other items to report KEY_INVALIDATED.
    @Test func aWriteAfterThePasscodeEpochMovedLeavesTheOtherItemsToReportKeyInvalidated() async throws {
        let d = try await Device(fingers: [])
        let second = try otherStore(d, reader: nil)
        let other = try createKeychain(.init(service: "svc", accessible: .whenPasscodeSetThisDeviceOnly), configuration: second.configuration)
        for key in ["a", "b"] { try await other.setItem(key, key) }
        try await d.device.removePasscode(current: bytes(Self.pin))
        try await d.device.setPasscode(bytes(Self.pin))
        await KeychainDevice(configuration: second.configuration).dropCaches()
        try await other.setItem("a", "new")
        #expect(try await other.getAllKeys() == ["a", "b"])
        #expect(await code { try await other.getItem("b") } == .keyInvalidated)
        #expect(try await other.getItem("b") == nil)
        #expect(try await other.getItem("a") == "new")
    }

    // MARK: Item 9: a locked device fails before any prompt

    @Test(arguments: [AccessControl.biometryAny, .biometryAnyOrPasscode, .passcode])
    func aLockedDeviceFailsBeforeAnyPromptAndKeepsTheAnswer(control: AccessControl) async throws {
        let d = try await Device()
        let store = try storage(d, control, accessible: .whenUnlockedThisDeviceOnly)
        try await store.setItem("k", "v")
        try await d.device.lock()
        let answer: AuthenticationAnswer = control == .passcode ? .passcode(bytes(Self.pin)) : .finger("thumb")
        d.answers.push(answer)
        #expect(await code { try await store.getItem("k") } == .interactionNotAllowed)
        #expect(d.answers.requests.isEmpty, "a locked device asked for the user")
        // The queued answer was not used up: after the unlock it opens the item.
        try await d.device.unlock(passcode: bytes(Self.pin))
        #expect(try await store.getItem("k") == "v")
        #expect(d.answers.requests.count == 1)
        // Locked again after this process saw it unlocked: the check asks the TPM again, still no prompt.
        try await d.device.lock()
        d.answers.push(answer)
        #expect(await code { try await store.getItem("k") } == .interactionNotAllowed)
        #expect(d.answers.requests.count == 1, "a device locked since the last read asked for the user")
    }

    @Test func beforeTheFirstUnlockAfterFirstUnlockItemsFailBeforeAnyPrompt() async throws {
        let d = try await Device()
        let after = try storage(d, .biometryAny, accessible: .afterFirstUnlock, service: "after")
        let always = try storage(d, .biometryAny, accessible: .always, service: "always")
        try await after.setItem("k", "after")
        try await always.setItem("k", "always")
        try d.tpm.reboot()
        await d.device.dropCaches()
        #expect(await code { try await after.getItem("k") } == .interactionNotAllowed)
        #expect(d.answers.requests.isEmpty)
        d.answers.push(.finger("thumb"))
        #expect(try await always.getItem("k") == "always")
        // Locked again after the first unlock: afterFirstUnlock items read.
        try await d.device.unlock(passcode: bytes(Self.pin))
        try await d.device.lock()
        d.answers.push(.finger("thumb"))
        #expect(try await after.getItem("k") == "after")
        #expect(d.answers.requests.count == 2)
    }

    /// Without a passcode the device counts as unlocked (as on iOS): the lock check does not refuse.
    /// An item behind an access control does not outlive the passcode (issue 21): after the removal
    /// and a reboot its read is KEY_INVALIDATED, not INTERACTION_NOT_ALLOWED, and asks nothing.
    @Test func withoutAPasscodeAfterARebootTheItemIsInvalidatedNotRefusedAsLocked() async throws {
        let d = try await Device()
        let store = try storage(d, .biometryAny, accessible: .whenUnlocked)
        try await store.setItem("k", "v")
        try await d.device.removePasscode(current: bytes(Self.pin))
        try d.tpm.reboot()
        await d.device.dropCaches()
        d.answers.push(.finger("thumb"))
        #expect(await code { try await store.getItem("k") } == .keyInvalidated)
        #expect(d.answers.requests.isEmpty)
        #expect(try await !store.hasItem("k"))
    }
}
