import BiometricsVault
import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory
import Testing

/// The vault end to end: a real swtpm, the simulated reader, scripted answers.
@Suite("BiometricsVault against swtpm")
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
        func vault() async throws -> BiometricsVault<Credentials> {
            try await BiometricsVault<Credentials>(key: "credentials", configuration: configuration)
        }
    }

    @Test func everyTransitionOfTheFirstDiagramAndARestartInBetween() async throws {
        let d = try await Device()
        var vault = try await d.vault()
        #expect(await vault.state == .ready)
        try await vault.enableKeychainVault(saving: Self.alice)
        #expect(await vault.state == .keychainSecured(Self.alice))
        vault = try await d.vault()  // restart
        #expect(await vault.state == .keychainSecured(Self.alice))
        try await vault.upgradeKeychainWithBiometrics()
        #expect(await vault.state == .biometricsSecured(Self.alice))
        #expect(d.answers.requests.isEmpty, "storing behind biometrics never prompts")
        try await vault.lock()
        #expect(await vault.state == .locked)
        vault = try await d.vault()  // restart: found locked, without a prompt
        #expect(await vault.state == .locked)
        d.answers.push(.finger("thumb"))
        try await vault.unlockWithBiometrics()
        #expect(await vault.state == .biometricsSecured(Self.alice))
        try await vault.downgradeBiometricsToKeychain()
        #expect(await vault.state == .keychainSecured(Self.alice))
        try await vault.upgradeKeychainWithBiometrics()
        try await vault.disableBiometricsSecureVault()
        #expect(await vault.state == .ready)
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        #expect(await vault.state == .biometricsSecured(Self.alice))
        try await vault.resetEverything()
        #expect(await vault.state == .ready)
        vault = try await d.vault()
        #expect(await vault.state == .ready)
    }

    @Test func aDisallowedTransitionThrowsAndChangesNothing() async throws {
        let d = try await Device()
        let vault = try await d.vault()
        await #expect(throws: VaultError.self) { try await vault.unlockWithBiometrics() }
        #expect(await vault.state == .ready)
    }

    @Test func aCanceledUnlockStaysLockedAndACanceledPromptIsReported() async throws {
        let d = try await Device()
        let vault = try await d.vault()
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try await vault.lock()
        d.answers.push(.cancel)
        await #expect(throws: KeychainError(.userCanceled)) { try await vault.unlockWithBiometrics() }
        #expect(await vault.state == .locked)
    }

    @Test func aLockoutIsEndedByReauthenticatingTheOwner() async throws {
        let d = try await Device()
        let vault = try await d.vault()
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try await vault.lock()
        d.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        await #expect(throws: KeychainError(.authenticationFailed)) { try await vault.unlockWithBiometrics() }
        d.answers.push(.finger("pinky"), .finger("pinky"))
        await #expect(throws: KeychainError(.lockout)) { try await vault.unlockWithBiometrics() }
        #expect(await vault.state == .locked)
        d.answers.push(.passcode(SecureBytes(copying: Array("0000".utf8))), .passcode(Self.pin))
        try await vault.reauthenticateOwner()
        d.answers.push(.finger("thumb"))
        try await vault.unlockWithBiometrics()
        #expect(await vault.state == .biometricsSecured(Self.alice))
    }

    @Test func anEnrollmentChangeWhileBiometricsSecuredEndsInReadyAfterKeyInvalidated() async throws {
        let d = try await Device()
        let vault = try await d.vault()
        try await vault.enableSecureVaultWithBiometrics(saving: Self.alice)
        try await d.device.enrollFinger("index", passcode: Self.pin)
        try await vault.lock()
        await #expect(throws: KeychainError(.keyInvalidated)) { try await vault.unlockWithBiometrics() }
        #expect(await vault.state == .ready)
        let restarted = try await d.vault()
        #expect(await restarted.state == .ready)
    }

    @Test func withoutAnEnrolledFingerTheVaultIsUnavailableButCanKeepAKeychainCopy() async throws {
        let d = try await Device(enroll: false)
        let vault = try await d.vault()
        #expect(await vault.state == .unavailable)
        try await vault.enableKeychainVault(saving: Self.alice)
        await #expect(throws: VaultError.self) { try await vault.upgradeKeychainWithBiometrics() }
        #expect(await vault.state == .keychainSecured(Self.alice))
        try await d.device.enrollFinger("thumb", passcode: Self.pin)
        await vault.refreshAvailability()
        try await vault.upgradeKeychainWithBiometrics()
        #expect(await vault.state == .biometricsSecured(Self.alice))
    }
}
