import Glibc
import FoundationEssentials
import Keychain
import SecureMemory
import SignInFlow
import KeychainCLIText
import KeychainBasics

/// `keychainctl demo`: the seed's sign-in flow on a fresh store, a fresh embedded software TPM and
/// the simulated fingerprint reader, printing each step, what the user answered, and what the TPM did.
struct Demo {
    /// The default service of the demo's session storage without `KEYCHAIN_APP_ID`.
    static let applicationIdentifier = "com.example.keychain-demo"
    private let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("keychain-demo-\(getpid())").path

    /// The demo's token server: each refresh revokes the old refresh token.
    actor Server: TokenServer {
        private var serial = 1
        private var valid: Set<String> = ["rt-1"]
        func refresh(_ refreshToken: String) async throws -> Tokens {
            guard valid.remove(refreshToken) != nil else { throw KeychainError(.authenticationFailed, "revoked refresh token") }
            serial += 1
            valid.insert("rt-\(serial)")
            return Tokens(accessToken: "at-\(serial)", refreshToken: "rt-\(serial)", username: "ivan@example.com")
        }
    }

    func run() async throws -> Exit {
        defer {
            EmbeddedTPM.stop(storeDirectory: directory)
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: directory + ".reader")
        }
        let user = ScriptedAuthenticator()
        var configuration = KeychainConfiguration(storeDirectory: directory, tpm: .embedded)
        configuration.readerDirectory = directory + ".reader"
        configuration.authenticator = user
        // The demo is an app of its own: its session storage is its service, not the binary's name.
        configuration.applicationIdentifier = configuration.applicationIdentifier ?? Self.applicationIdentifier
        let device = KeychainDevice(configuration: configuration)
        let flow = try SignInFlow(server: Server(), configuration: configuration)
        let pin = SecureBytes(copying: Array("2468".utf8))

        say("Keychain for Linux: the sign-in flow on a fresh store (\(directory)),")
        say("an embedded software TPM (swtpm: the same TPM commands, no hardware protection)")
        say("and a simulated fingerprint reader (\(directory).reader).\n")

        try await signInSteps(device, flow, pin)
        try await launchSteps(device, flow, user)
        try await lockSteps(device, flow, user, pin)
        say("\nThe user was asked \(user.requests.count) times; every prompt was a read of the refresh token.")
        say("Done. The store, the reader and the software TPM of this demo were removed.")
        return .ok
    }

    /// Provisioning, the passcode, a finger, and the first sign-in with fingerprint sign-in on.
    private func signInSteps(_ device: KeychainDevice, _ flow: SignInFlow, _ pin: SecureBytes) async throws {
        try await step("Provision the TPM: SRK at 0x81000001, the device-lock NV indices", device) {
            let status = try await device.initialize()
            return "TPM \(status.tpm), security level \(status.securityLevel.rawValue)"
        }
        try await step("Set the device passcode (a PIN index in the TPM, with its own retry limit)", device) {
            try await device.setPasscode(pin)
            return "passcode set"
        }
        try await step("Offer fingerprint sign-in before any finger is enrolled", device) {
            let offer = try await flow.biometricOffer()
            return "offer: \(offer.name ?? "none"), reason: \(offer.reason?.rawValue ?? "-")"
        }
        try await step("Enroll a finger on the reader (needs the passcode)", device) {
            try await device.enrollFinger("right-thumb", passcode: pin)
            let offer = try await flow.biometricOffer()
            return "enrolled right-thumb; offer: \(offer.name ?? "none")"
        }
        try await step("Sign in with a password; turn on fingerprint sign-in (no prompt)", device) {
            let on = try await flow.completeSignIn(Tokens(accessToken: "at-1", refreshToken: "rt-1", username: "ivan@example.com"),
                                                   withBiometrics: true)
            return "access token in the default storage (service '\(flow.session.service)', afterFirstUnlock); "
                + "refresh token in auth.vault (whenUnlockedThisDeviceOnly, biometryCurrentSet): \(on)"
        }
    }

    /// The app launched again: a finger, a cancelled prompt, wrong fingers.
    private func launchSteps(_ device: KeychainDevice, _ flow: SignInFlow, _ user: ScriptedAuthenticator) async throws {
        try await step("Restart the app: 'Continue as …' from the label, hasItem first (no prompt)", device) {
            await device.dropCaches()
            return "Continue as \(try await flow.continueAs() ?? "?"); vault has a refresh token: \(try await flow.vault.hasItem("refreshToken"))"
        }
        try await step("Unlock with a finger, refresh, rotate the refresh token", device) {
            user.push(.finger("right-thumb"))
            let outcome = try await flow.restoreSession { _ in true }
            return "user touches right-thumb → \(describe(outcome))\n    rotated: the vault now holds the server's new refresh token"
        }
        try await step("Launch again, the user cancels the prompt ('Use password')", device) {
            user.push(.cancel)
            let outcome = try await flow.restoreSession { _ in true }
            return "\(describe(outcome)); the refresh token stays: \(try await flow.vault.hasItem("refreshToken"))"
        }
        try await step("A wrong finger three times, then the right one", device) {
            user.push(.finger("left-index"), .finger("left-index"), .finger("left-index"))
            let wrong = try await flow.restoreSession { _ in true }
            user.push(.finger("right-thumb"))
            let right = try await flow.restoreSession { _ in true }
            return "wrong finger: \(describe(wrong))\n    right finger: \(describe(right))"
        }
    }

    /// The device locked, unlocked, rebooted; a new finger; sign-out.
    private func lockSteps(_ device: KeychainDevice, _ flow: SignInFlow, _ user: ScriptedAuthenticator,
                           _ pin: SecureBytes) async throws {
        try await step("Lock the device: the vault is whenUnlocked; the session token afterFirstUnlock", device) {
            try await device.lock()
            user.push(.finger("right-thumb"))
            let vault = await outcome { try await flow.vault.getItem("refreshToken") }
            let session = await outcome { try await flow.session.getItem("accessToken") }
            return "vault: \(vault)\n    session: \(session)"
        }
        try await step("Unlock the device: a wrong passcode, then the right one", device) {
            let wrong = await outcome { try await device.unlock(passcode: SecureBytes(copying: Array("1111".utf8))); return "unlocked" }
            try await device.unlock(passcode: pin)
            return "wrong: \(wrong)\n    right: unlocked"
        }
        try await step("Reboot the TPM (restart swtpm) and start the app", device) {
            EmbeddedTPM.reboot(storeDirectory: directory)
            await device.dropCaches()
            let session = await outcome { try await flow.session.getItem("accessToken") }
            try await device.unlock(passcode: pin)
            let after = await outcome { try await flow.session.getItem("accessToken") }
            return "before the first unlock: \(session)\n    after the first unlock: \(after)"
        }
        try await step("A new finger is enrolled: the vault is invalidated (KEY_INVALIDATED), back to sign-in", device) {
            try await device.enrollFinger("left-index", passcode: pin)
            let outcome = try await flow.restoreSession { _ in true }
            return "\(describe(outcome)), with no prompt; the vault is empty: \(try await flow.vault.getAllKeys().isEmpty)"
        }
        try await step("Sign in again, then sign out (no prompt)", device) {
            _ = try await flow.completeSignIn(Tokens(accessToken: "at-9", refreshToken: "rt-9", username: "ivan@example.com"),
                                              withBiometrics: true)
            try await flow.signOut()
            return "session has accessToken: \(try await flow.session.hasItem("accessToken")); vault keys: \(try await flow.vault.getAllKeys())"
        }
    }

    private func say(_ text: String) { print(text); fflush(nil) }

    /// The code each fallback comes from and what the app does, as the guide's table.
    private func describe(_ outcome: SignInFlow.Outcome) -> String {
        switch outcome {
        case .signedIn(let accessToken): "signed in (new access token \(accessToken))"
        case .password(let code): "\(code.rawValue) → the password form"
        case .signIn(biometricsChanged: true): "KEY_INVALIDATED → \"fingerprints changed, sign in again\" (the item was removed)"
        case .signIn(biometricsChanged: false): "no refresh token → the sign-in screen"
        case .askAgain(let code): "\(code.rawValue) → ask again when the app is back"
        }
    }

    private func step(_ title: String, _ device: KeychainDevice, _ body: () async throws -> String) async throws {
        _ = await device.takeTPMCommandCount()
        let start = Date()
        let result = try await body()
        let ms = Date().timeIntervalSince(start) * 1000
        let commands = await device.takeTPMCommandCount()
        say("• \(title)\n    \(result)\n    [\(commands) TPM commands, \(oneDecimal(ms)) ms]")
    }

    private func outcome(_ body: () async throws -> String?) async -> String {
        do { return "read \(try await body() ?? "nil")" } catch let error as KeychainError {
            return "\(error.code.rawValue): \(error.message)"
        } catch { return "\(error)" }
    }
}
