import BiometricsVault
import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// The vault end to end: a real swtpm, the simulated reader, scripted answers.
@Suite("BiometricsVault against swtpm", .offThePool)
struct VaultIntegrationTests {
    struct Credentials: Codable, Sendable, Equatable { var user: String; var token: String }
    static let alice = Credentials(user: "alice", token: "t-1")
    static let pin = SecureBytes(copying: Array("2468".utf8))

    struct Device {
        let simulated: SimulatedDevice
        var answers: ScriptedAuthenticator { simulated.answers }
        var configuration: KeychainConfiguration { simulated.configuration }
        var device: KeychainDevice { simulated.device }
        init(enroll: Bool = true) async throws {
            simulated = try await SimulatedDevice(passcode: VaultIntegrationTests.pin, fingers: enroll ? ["thumb"] : [])
        }
        func vault() -> BiometricsVault<Credentials> {
            BiometricsVault<Credentials>(key: "credentials", configuration: configuration)
        }
    }

    @Test func everyTransitionOfTheFirstDiagramAndARestartInBetween() async throws {
        let d = try await Device()
        var vault = d.vault()
        #expect(vault.state == .ready)
        try vault.enableKeychainVault(saving: Self.alice)
        #expect(vault.state == .keychainSecured(Self.alice))
        vault = d.vault()  // restart
        #expect(vault.state == .keychainSecured(Self.alice))
        d.answers.push(.finger("thumb"))
        try await vault.upgradeKeychainWithBiometrics()
        #expect(vault.state == .biometricsSecured(Self.alice))
        #expect(d.answers.requests.map(\.methods) == [[.fingerprint]], "the upgrade asks for the finger once")
        let locked: Bool = try vault.lock()  // the seed's `lock() throws -> Bool`
        #expect(locked)
        #expect(vault.state == .locked)
        vault = d.vault()  // restart: found locked, without a prompt
        #expect(vault.state == .locked)
        d.answers.push(.finger("thumb"))
        let savedCredentials = try await vault.unlockWithBiometrics()
        #expect(savedCredentials == Self.alice)
        #expect(vault.state == .biometricsSecured(Self.alice))
        try Self.turnBiometricsOff(vault, keepingACopy: true)
        #expect(vault.state == .keychainSecured(Self.alice))
        d.answers.push(.finger("thumb"))
        try await vault.upgradeKeychainWithBiometrics()
        try Self.turnBiometricsOff(vault, keepingACopy: false)
        #expect(vault.state == .ready)
        d.answers.push(.finger("thumb"))
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        #expect(vault.state == .biometricsSecured(Self.alice))
        vault.resetEverything()
        #expect(vault.state == .ready)
        vault = d.vault()
        #expect(vault.state == .ready)
    }

    /// A settings switch's synchronous handler, as the seed's example app calls these two: it would not
    /// compile if they were `async` (issue 21, item 3).
    static func turnBiometricsOff(_ vault: BiometricsVault<Credentials>, keepingACopy: Bool) throws {
        if keepingACopy { try vault.downgradeBiometricsToKeychain() } else { try vault.disableBiometricsSecureVault() }
    }

    @Test func aDisallowedTransitionThrowsAndChangesNothing() async throws {
        let d = try await Device()
        let vault = d.vault()
        await #expect(throws: VaultError.self) { try await vault.unlockWithBiometrics() }
        #expect(vault.state == .ready)
    }

    @Test func aCanceledUnlockStaysLockedAndACanceledPromptIsReported() async throws {
        let d = try await Device()
        let vault = d.vault()
        d.answers.push(.finger("thumb"))
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try vault.lock()
        d.answers.push(.cancel)
        await #expect(throws: KeychainError(.userCanceled)) { try await vault.unlockWithBiometrics() }
        #expect(vault.state == .locked)
    }

    @Test func aLockoutIsEndedByReauthenticatingTheOwner() async throws {
        let d = try await Device()
        let vault = d.vault()
        d.answers.push(.finger("thumb"))
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try vault.lock()
        d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        await #expect(throws: KeychainError(.authenticationFailed)) { try await vault.unlockWithBiometrics() }
        d.answers.push(.finger("pinky"), .finger("pinky"))
        await #expect(throws: KeychainError(.lockout)) { try await vault.unlockWithBiometrics() }
        #expect(vault.state == .locked)
        d.answers.push(.passcode(SecureBytes(copying: Array("0000".utf8))), .passcode(Self.pin))
        #expect(try await vault.reauthenticateOwner())
        d.answers.push(.finger("thumb"))
        try await vault.unlockWithBiometrics()
        #expect(vault.state == .biometricsSecured(Self.alice))
    }

    @Test func anEnrollmentChangeWhileBiometricsSecuredEndsInReadyAfterKeyInvalidated() async throws {
        let d = try await Device()
        let vault = d.vault()
        d.answers.push(.finger("thumb"))
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try await d.device.enrollFinger("index", passcode: Self.pin)
        try vault.lock()
        await #expect(throws: KeychainError(.keyInvalidated)) { try await vault.unlockWithBiometrics() }
        #expect(vault.state == .ready)
        let restarted = d.vault()
        #expect(restarted.state == .ready)
    }

    @Test func withoutAnEnrolledFingerTheVaultIsUnavailableButCanKeepAKeychainCopy() async throws {
        let d = try await Device(enroll: false)
        let vault = d.vault()
        #expect(vault.state == .unavailable)
        try vault.enableKeychainVault(saving: Self.alice)
        await #expect(throws: VaultError.self) { try await vault.upgradeKeychainWithBiometrics() }
        #expect(vault.state == .keychainSecured(Self.alice))
        try await d.device.enrollFinger("thumb", passcode: Self.pin)
        await vault.refreshAvailability()
        d.answers.push(.finger("thumb"))
        try await vault.upgradeKeychainWithBiometrics()
        #expect(vault.state == .biometricsSecured(Self.alice))
    }

    /// The synchronous calls wait on the vault's own thread: called from more tasks at once than
    /// the shared pool has threads, each still completes (none needs a pool thread to finish).
    @Test func synchronousCallsFromEveryPoolThreadAtOnceComplete() async throws {
        let d = try await Device()
        let vaults = (0..<8).map { i in
            BiometricsVault<Credentials>(key: "credentials-\(i)", configuration: d.configuration)
        }
        let states = try await withThrowingTaskGroup(of: VaultStateKind.self) { group in
            for vault in vaults {
                group.addTask {
                    try vault.enableKeychainVault(saving: Self.alice)
                    return vault.state.kind
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(states == Array(repeating: .keychainSecured, count: 8))
        for vault in vaults { vault.resetEverything() }
        #expect(vaults.allSatisfy { $0.state == .ready })
    }

    /// An unreadable store leaves the state `unavailable` rather than a wrong `ready`, and the next
    /// read asks again.
    @Test func aStateThatCannotBeReadIsUnavailableAndReadAgainLater() async throws {
        let d = try await Device()
        d.vault().resetEverything()
        try d.vault().enableKeychainVault(saving: Self.alice)
        try d.simulated.tpm.reboot()
        await d.device.dropCaches()  // as a new process would
        let vault = d.vault()
        #expect(vault.state == .unavailable, "before the first unlock the keychain item cannot be read")
        try await d.device.unlock(passcode: Self.pin)
        #expect(vault.state == .keychainSecured(Self.alice))
    }
}
