import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import SignInFlow
import Testing

/// A token server in-process: each refresh revokes the old refresh token.
actor FakeServer: TokenServer {
    private var valid: Set<String> = ["rt-1"]
    private var serial = 1
    func refresh(_ refreshToken: String) async throws -> Tokens {
        guard valid.remove(refreshToken) != nil else { throw URLError(.userAuthenticationRequired) }
        serial += 1
        valid.insert("rt-\(serial)")
        return Tokens(accessToken: "at-\(serial)", refreshToken: "rt-\(serial)", username: "ivan@example.com")
    }
}

@Suite("The sign-in guide's flow, every fallback path", .offThePool)
struct SignInFlowTests {
    static let pin = SecureBytes(copying: Array("2468".utf8))

    struct App {
        let simulated: SimulatedDevice
        var answers: ScriptedAuthenticator { simulated.answers }
        var device: KeychainDevice { simulated.device }
        let flow: SignInFlow
        init() async throws {
            simulated = try await SimulatedDevice(passcode: SignInFlowTests.pin, fingers: ["thumb"])
            flow = try SignInFlow(server: FakeServer(), configuration: simulated.configuration)
            #expect(try await flow.biometricOffer().name == "fingerprint")
            #expect(try await flow.completeSignIn(Tokens(accessToken: "at-1", refreshToken: "rt-1", username: "ivan@example.com"),
                                                  withBiometrics: true))
            #expect(answers.requests.isEmpty, "signing in never prompts")
        }
        /// The next launch: the access token has expired.
        func launch() async throws -> SignInFlow.Outcome { try await flow.restoreSession { _ in true } }
    }

    @Test func aFingerUnlocksRefreshesAndRotatesTheRefreshToken() async throws {
        let app = try await App()
        #expect(try await app.flow.continueAs() == "ivan@example.com")
        app.answers.push(.finger("thumb"))
        #expect(try await app.launch() == .signedIn(accessToken: "at-2"))
        #expect(app.answers.requests.first?.prompt.title == "Sign in to Example")
        // The rotated token is what the next launch unlocks: the server revoked rt-1.
        app.answers.push(.finger("thumb"))
        #expect(try await app.launch() == .signedIn(accessToken: "at-3"))
        #expect(try await app.flow.continueAs() == "ivan@example.com", "the label survives the rotation")
    }

    @Test func aValidAccessTokenNeedsNoPrompt() async throws {
        let app = try await App()
        #expect(try await app.flow.restoreSession { _ in false } == .signedIn(accessToken: "at-1"))
        #expect(app.answers.requests.isEmpty)
    }

    @Test(arguments: [(AuthenticationAnswer.cancel, KeychainError.Code.userCanceled), (.fallback, .userFallback)])
    func cancelAndFallbackGoToThePasswordFormAndKeepTheToken(answer: AuthenticationAnswer, code: KeychainError.Code) async throws {
        let app = try await App()
        app.answers.push(answer)
        #expect(try await app.launch() == .password(after: code))
        #expect(try await app.flow.vault.hasItem("refreshToken"))
    }

    @Test func lockoutsGoToThePasswordForm() async throws {
        let app = try await App()
        app.answers.push(.finger("pinky"), .finger("pinky"), .finger("pinky"))
        #expect(try await app.launch() == .password(after: .authenticationFailed))
        app.answers.push(.finger("pinky"), .finger("pinky"))
        #expect(try await app.launch() == .password(after: .lockout))
        var endings: [KeychainError.Code] = []
        for _ in 0..<5 {
            app.answers.push(.finger("thumb"))
            if case .password(let code) = try await app.launch() { endings.append(code) }
        }
        #expect(endings.first == .lockout && endings.last == .lockoutPermanent, "\(endings)")
        #expect(try await app.flow.vault.hasItem("refreshToken"))
    }

    @Test func anInterruptedPromptAsksAgainLater() async throws {
        let app = try await App()
        app.answers.push(.interrupted)
        #expect(try await app.launch() == .askAgain(after: .systemCanceled))
        app.answers.push(.finger("thumb"))
        #expect(try await app.launch() == .signedIn(accessToken: "at-2"))
    }

    @Test func aNewFingerInvalidatesTheVaultAndSendsToSignIn() async throws {
        let app = try await App()
        try await app.device.enrollFinger("index", passcode: Self.pin)
        #expect(try await app.launch() == .signIn(biometricsChanged: true))
        #expect(try await app.flow.vault.hasItem("refreshToken") == false)
        #expect(app.answers.requests.isEmpty, "invalidation is found before any prompt")
        #expect(try await app.launch() == .signIn(biometricsChanged: false))
    }

    /// The guide: any KeychainError of the vault write turns fingerprint sign-in off.
    @Test func aVaultWriteThatFailsTurnsFingerprintSignInOffAndKeepsTheSession() async throws {
        let app = try await App()
        try await app.device.removeFinger("thumb", passcode: Self.pin)
        let on = try await app.flow.completeSignIn(Tokens(accessToken: "at-5", refreshToken: "rt-5", username: "ivan@example.com"),
                                                   withBiometrics: true)
        #expect(!on)
        #expect(try await app.flow.vault.getAllKeys() == [], "the old refresh token went with it")
        #expect(try await app.flow.session.getItem("accessToken") == "at-5")
    }

    /// The access token lives in the default storage, as in the guide: the app identifier's service.
    @Test func theSessionIsTheDefaultStorageOfTheApplicationIdentifier() async throws {
        let device = try await SimulatedDevice()
        var configuration = device.configuration
        configuration.applicationIdentifier = "com.example.app"
        let flow = try SignInFlow(server: FakeServer(), configuration: configuration)
        #expect(flow.session.service == "com.example.app")
        try await flow.completeSignIn(Tokens(accessToken: "at-1", refreshToken: "rt-1", username: "u"), withBiometrics: false)
        #expect(try await createKeychain(configuration: configuration).getItem("accessToken") == "at-1")
        withExtendedLifetime(device) {}
    }

    @Test func signOutClearsEverythingWithoutAPrompt() async throws {
        let app = try await App()
        try await app.flow.signOut()
        #expect(try await app.flow.session.hasItem("accessToken") == false)
        #expect(try await app.flow.vault.getAllKeys() == [])
        #expect(app.answers.requests.isEmpty)
        #expect(try await app.launch() == .signIn(biometricsChanged: false))
    }
}

/// A process where no prompt can reach anyone (a service without a terminal, a desktop or an agent).
@Suite("The sign-in guide's flow where no prompt reaches anyone", .offThePool)
struct SignInFlowWithoutAPromptTests {
    /// Prompters that can reach no one: a terminal that is not there, an agents' directory that is not.
    static let nobody = SystemAuthenticator(prompters: [TerminalAuthenticator(path: "/nonexistent/tty"),
                                                        AskPasswordAuthenticator(directory: "/nonexistent/ask-password")])

    @Test func theSwitchIsNotOfferedAndAStoredVaultGoesToThePasswordForm() async throws {
        let simulated = try await SimulatedDevice(passcode: SignInFlowTests.pin, fingers: ["thumb"])
        var configuration = simulated.configuration
        // Signed in while a prompt could reach the user: the vault holds the refresh token.
        let before = try SignInFlow(server: FakeServer(), configuration: configuration)
        #expect(try await before.completeSignIn(Tokens(accessToken: "at-1", refreshToken: "rt-1", username: "ivan@example.com"),
                                                withBiometrics: true))
        configuration.authenticator = Self.nobody
        let flow = try SignInFlow(server: FakeServer(), configuration: configuration)
        let offer = try await flow.biometricOffer()
        #expect(offer.name == nil && offer.reason == .noPrompt, "\(offer)")
        // The read cannot ask anyone: the password form, not "ask again" (which would loop forever).
        #expect(try await flow.restoreSession { _ in true } == .password(after: .interactionNotAllowed))
        #expect(try await flow.vault.hasItem("refreshToken"), "the refresh token stays for a launch that can ask")
        #expect(simulated.answers.requests.isEmpty)
    }
}
