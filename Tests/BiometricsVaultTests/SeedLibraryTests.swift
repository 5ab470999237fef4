import BiometricsVault
import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Observation
import SecureMemory
import Synchronization
import Testing

/// What the seed's library and its example app do that the seed's page does not say (issue 21 item 3):
/// the finger is verified before the credentials go behind it, `biometricsAvailable` is asked again at
/// each read, and a UI bound to `state` is told of each change. A real swtpm, the simulated reader,
/// scripted answers.
@Suite("BiometricsVault as the seed's library", .offThePool)
struct SeedLibraryTests {
    typealias Credentials = VaultIntegrationTests.Credentials
    typealias Device = VaultIntegrationTests.Device
    static let alice = VaultIntegrationTests.alice
    static let pin = VaultIntegrationTests.pin

    /// A touch that does not give a finger the reader knows, and the code the seed's library reports for it.
    struct Touch: Sendable, CustomTestStringConvertible {
        let answers: [AuthenticationAnswer]
        let code: KeychainError.Code
        var testDescription: String { code.rawValue }
    }
    static let failedTouches = [
        Touch(answers: [.cancel], code: .userCanceled),
        Touch(answers: [.fallback], code: .userFallback),
        Touch(answers: [.finger("pinky"), .finger("pinky"), .finger("pinky")], code: .authenticationFailed),
        Touch(answers: [], code: .systemCanceled),  // the script ran out: the prompt is interrupted
    ]

    /// The vault's two items, seen through the public API, not through the vault.
    static func stored(_ d: Device) async throws -> (plain: Credentials?, biometric: Bool) {
        let plain = try createKeychain(.init(service: "biometrics-vault"), configuration: d.configuration)
        let biometric = try createKeychain(.init(service: "biometrics-vault.biometrics"), configuration: d.configuration)
        return (try await plain.getData("credentials").map { try JSONDecoder().decode(Credentials.self, from: $0) },
                try await biometric.hasItem("credentials"))
    }

    // MARK: The finger is verified first

    @Test(arguments: failedTouches)
    func anUpgradeWhoseTouchFailsMovesNothingAndThrowsTheSeedsCode(touch: Touch) async throws {
        let d = try await Device()
        let vault = d.vault()
        try vault.enableKeychainVault(saving: Self.alice)
        for answer in touch.answers { d.answers.push(answer) }
        await #expect(throws: KeychainError(touch.code)) { try await vault.upgradeKeychainWithBiometrics() }
        #expect(d.answers.requests.map(\.methods) == Array(repeating: [.fingerprint], count: max(1, touch.answers.count)),
                "the upgrade asked for the finger")
        #expect(vault.state == .keychainSecured(Self.alice))
        let stored = try await Self.stored(d)
        #expect(stored.plain == Self.alice, "the plain item is where it was")
        #expect(!stored.biometric, "nothing is left behind the finger the user could not give")
        #expect(d.vault().state == .keychainSecured(Self.alice), "a restart finds the same")
        // The user can still turn it on with the right finger.
        d.answers.push(.finger("thumb"))
        try await vault.upgradeKeychainWithBiometrics()
        #expect(vault.state == .biometricsSecured(Self.alice))
        #expect(try await Self.stored(d) == (nil, true))
    }

    @Test(arguments: failedTouches)
    func enablingBiometricsWhoseTouchFailsStoresNothing(touch: Touch) async throws {
        let d = try await Device()
        let vault = d.vault()
        for answer in touch.answers { d.answers.push(answer) }
        await #expect(throws: KeychainError(touch.code)) { try await vault.enableSecureVaultWithBiometrics(saving: Self.alice) }
        #expect(!d.answers.requests.isEmpty, "enabling asked for the finger")
        #expect(vault.state == .ready)
        #expect(try await Self.stored(d) == (nil, false))
        #expect(d.vault().state == .ready)
    }

    // MARK: Availability is asked again

    /// The seed's example app shows "Upgrade to biometrics" when `biometricsAvailable`: after the user
    /// enrolls a finger (in another program: keychainctl reader enroll), the button appears at the next
    /// read, without a restart and without `refreshAvailability()`.
    @Test func aFingerEnrolledMidLifeMakesBiometricsAvailableAtTheNextRead() async throws {
        let d = try await Device(enroll: false)
        let signedIn = d.vault()
        let signedOut = BiometricsVault<Credentials>(key: "other", configuration: d.configuration)
        try signedIn.enableKeychainVault(saving: Self.alice)
        #expect(!signedIn.biometricsAvailable)
        #expect(signedOut.state == .unavailable)
        try await KeychainDevice(configuration: d.configuration).enrollFinger("thumb", passcode: Self.pin)
        #expect(signedIn.biometricsAvailable, "the enable button appears")
        #expect(signedOut.state == .ready, "the signed-out screen offers biometrics")
        d.answers.push(.finger("thumb"))
        try await signedIn.upgradeKeychainWithBiometrics()
        #expect(signedIn.state == .biometricsSecured(Self.alice))
        try await d.device.removeFinger("thumb", passcode: Self.pin)
        #expect(!signedOut.biometricsAvailable)
        #expect(signedOut.state == .unavailable)
    }

    /// A UI bound to `state` reads it at every frame: reads close together reuse the device's last
    /// answer (each one cost a TPM command in-process, a keychaind request through it), and a
    /// change this process makes to the device still shows at the next read. Counted by the prompt's
    /// reachability, which `canUseAccessControl` asks in this process in both modes.
    @Test func readsCloseTogetherReuseTheDevicesAnswerAndADeviceChangeShowsAtTheNextRead() async throws {
        let d = try await Device()
        let reach = CountedReachability(d.answers)
        var configuration = d.configuration
        configuration.authenticator = reach
        let vault = BiometricsVault<Credentials>(key: "credentials", configuration: configuration)
        #expect(vault.state == .ready)
        let before = reach.asked
        for _ in 0..<100 {
            #expect(vault.state == .ready)
            #expect(vault.biometricsAvailable)
        }
        // One more answer a second (the reuse's lifetime): a loaded machine may stretch 200 reads over a few.
        #expect(reach.asked - before < 20, "200 reads asked the device \(reach.asked - before) times")
        try await d.device.removeFinger("thumb", passcode: Self.pin)
        #expect(vault.state == .unavailable, "the finger removed in this process shows at the next read")
        #expect(!vault.biometricsAvailable)
    }

    /// The scripted answers, counting how often the keychain asks whether a prompt can reach anyone.
    final class CountedReachability: Authenticator {
        let answers: ScriptedAuthenticator
        private let count = Mutex(0)
        init(_ answers: ScriptedAuthenticator) { self.answers = answers }
        var asked: Int { count.withLock { $0 } }
        func reachability() async -> PromptReach {
            count.withLock { $0 += 1 }
            return .reachable
        }
        func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer { await answers.authenticate(request) }
    }

    @Test func refreshAvailabilityTellsAnObserverThatNeverReadsAgain() async throws {
        let d = try await Device(enroll: false)
        let vault = d.vault()
        try vault.enableKeychainVault(saving: Self.alice)
        let told = try await Self.changes(of: { #expect(!vault.biometricsAvailable) }) {
            try await d.device.enrollFinger("thumb", passcode: Self.pin)
            await vault.refreshAvailability()
        }
        #expect(told == 1)
        #expect(await Self.changes(of: { _ = vault.biometricsAvailable }) { await vault.refreshAvailability() } == 0,
                "nothing changed the second time")
    }

    // MARK: The state is observable

    /// How many times an observer of what `read` reads was told while `change` ran (withObservationTracking
    /// tells once per registration: each step registers again).
    static func changes(of read: () -> Void, during change: () async throws -> Void) async rethrows -> Int {
        let told = Count()
        withObservationTracking { read() } onChange: { told.value.withLock { $0 += 1 } }
        try await change()
        return told.value.withLock { $0 }
    }
    final class Count: Sendable { let value = Mutex(0) }

    /// Every transition of the seed's two diagrams and the ones it leaves open, each seen by an observer
    /// of `state` (withObservationTracking, as SwiftUI does) and on `states`; a step that changes
    /// nothing tells no one.
    @Test func anObserverOfStateIsToldOfEachTransition() async throws {
        let d = try await Device()
        var vault: BiometricsVault<Credentials>? = d.vault()
        let states = vault!.states
        let seen = Task { await states.reduce(into: [VaultStateKind]()) { $0.append($1.kind) } }
        var expected: [VaultStateKind] = [.ready]

        func step(_ name: String, to kind: VaultStateKind, changes: Bool = true, _ body: () async throws -> Void) async {
            let told = await Self.changes(of: { _ = vault!.state }, during: {
                do { try await body() } catch { Issue.record("\(name): \(error)") }
            })
            #expect(told == (changes ? 1 : 0), "\(name)")
            #expect(vault!.state.kind == kind, "\(name)")
            if changes { expected.append(kind) }
        }
        func push(_ answer: AuthenticationAnswer) { d.answers.push(answer) }

        await step("enableKeychainVault", to: .keychainSecured) { try vault!.enableKeychainVault(saving: Self.alice) }
        await step("upgradeKeychainWithBiometrics", to: .biometricsSecured) {
            push(.finger("thumb")); try await vault!.upgradeKeychainWithBiometrics()
        }
        await step("lock", to: .locked) { try vault!.lock() }
        await step("a canceled unlock", to: .locked, changes: false) {
            push(.cancel); await #expect(throws: KeychainError(.userCanceled)) { try await vault!.unlockWithBiometrics() }
        }
        await step("unlockWithBiometrics", to: .biometricsSecured) { push(.finger("thumb")); try await vault!.unlockWithBiometrics() }
        await step("downgradeBiometricsToKeychain", to: .keychainSecured) { try vault!.downgradeBiometricsToKeychain() }
        await step("an upgrade whose touch is canceled", to: .keychainSecured, changes: false) {
            push(.cancel); await #expect(throws: KeychainError(.userCanceled)) { try await vault!.upgradeKeychainWithBiometrics() }
        }
        await step("upgradeKeychainWithBiometrics again", to: .biometricsSecured) {
            push(.finger("thumb")); try await vault!.upgradeKeychainWithBiometrics()
        }
        await step("disableBiometricsSecureVault", to: .ready) { try vault!.disableBiometricsSecureVault() }
        await step("a refused lock", to: .ready, changes: false) { #expect(throws: VaultError.self) { try vault!.lock() } }
        await step("enableSecureVaultWithBiometrics", to: .biometricsSecured) {
            push(.finger("thumb")); try await vault!.enableSecureVaultWithBiometrics(saving: Self.alice)
        }
        await step("resetEverything from biometricsSecured", to: .ready) { vault!.resetEverything() }
        await step("enableKeychainVault", to: .keychainSecured) { try vault!.enableKeychainVault(saving: Self.alice) }
        await step("resetEverything from keychainSecured", to: .ready) { vault!.resetEverything() }
        await step("enableSecureVaultWithBiometrics", to: .biometricsSecured) {
            push(.finger("thumb")); try await vault!.enableSecureVaultWithBiometrics(saving: Self.alice)
        }
        await step("lock", to: .locked) { try vault!.lock() }
        await step("reauthenticateOwner", to: .locked, changes: false) { push(.passcode(Self.pin)); try await vault!.reauthenticateOwner() }
        await step("resetEverything from locked", to: .ready) { vault!.resetEverything() }
        await step("enableSecureVaultWithBiometrics", to: .biometricsSecured) {
            push(.finger("thumb")); try await vault!.enableSecureVaultWithBiometrics(saving: Self.alice)
        }
        await step("lock", to: .locked) { try vault!.lock() }
        await step("an unlock after an enrollment change", to: .ready) {
            try await d.device.enrollFinger("index", passcode: Self.pin)
            await #expect(throws: KeychainError(.keyInvalidated)) { try await vault!.unlockWithBiometrics() }
        }
        await step("the last fingers removed", to: .unavailable) {
            try await d.device.removeFinger("thumb", passcode: Self.pin)
            try await d.device.removeFinger("index", passcode: Self.pin)
            await vault!.refreshAvailability()
        }
        await step("a finger enrolled", to: .ready) {
            try await d.device.enrollFinger("thumb", passcode: Self.pin)
            await vault!.refreshAvailability()
        }
        await step("enableKeychainVault", to: .keychainSecured) { try vault!.enableKeychainVault(saving: Self.alice) }

        vault = nil  // the stream ends with the vault
        #expect(await seen.value == expected)
    }
}
