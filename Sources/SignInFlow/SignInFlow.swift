public import Keychain

/// The tokens a sign-in returns.
public struct Tokens: Sendable, Equatable {
    public var accessToken: String
    public var refreshToken: String
    public var username: String
    public init(accessToken: String, refreshToken: String, username: String) {
        self.accessToken = accessToken; self.refreshToken = refreshToken; self.username = username
    }
}

/// The app's server: exchanges a refresh token for new tokens (and revokes the old refresh token).
public protocol TokenServer: Sendable {
    func refresh(_ refreshToken: String) async throws -> Tokens
}

/// The seed's "Sign in with Face ID" guide on Linux, as code that runs: the access token in the
/// default storage (the app's service, afterFirstUnlock, no prompt), the refresh token in a vault
/// behind the fingerprint reader (`whenUnlockedThisDeviceOnly`, `biometryCurrentSet`), every
/// fallback path of the guide.
public struct SignInFlow: Sendable {
    public let session: Keychain
    public let vault: Keychain
    let device: KeychainDevice
    let server: any TokenServer

    public init(server: any TokenServer, configuration: KeychainConfiguration = .default) throws(KeychainError) {
        session = try createKeychain(configuration: configuration)  // the guide's `keychain`
        vault = try createKeychain(.init(service: "auth.vault", accessible: .whenUnlockedThisDeviceOnly,
                                         accessControl: .biometryCurrentSet,
                                         prompt: .init(title: "Sign in to Example", cancel: "Use password")),
                                   configuration: configuration)
        device = KeychainDevice(configuration: configuration)
        self.server = server
    }

    /// Step 2: offer fingerprint sign-in only when the device can lock an item with it (no prompt).
    /// - Returns: the name of the switch ("fingerprint"), or nil and the reason it can't be offered.
    /// - Throws: `HARDWARE_UNAVAILABLE` when keychaind cannot be reached: ask again later.
    public func biometricOffer() async throws(KeychainError) -> (name: String?, reason: AccessControlCheck.Reason?) {
        let check = try await vault.canUseAccessControl(.biometryCurrentSet)
        guard check.available else { return (nil, check.reason) }
        return (device.biometryTypes() == [.fingerprint] ? "fingerprint" : "biometrics", nil)
    }

    /// Step 3: after a password or SSO sign-in, store both tokens; the vault write shows no prompt.
    /// As the guide: any `KeychainError` of the vault write (the device changed since the check,
    /// most often `BIOMETRY_NOT_ENROLLED` or `PASSCODE_NOT_SET`) turns fingerprint sign-in off,
    /// which also removes what the vault held.
    /// - Returns: whether fingerprint sign-in is on.
    @discardableResult
    public func completeSignIn(_ tokens: Tokens, withBiometrics: Bool) async throws -> Bool {
        try await session.setItem("accessToken", tokens.accessToken)
        guard withBiometrics else { return false }
        do {
            try await vault.setItem("refreshToken", tokens.refreshToken, options: .init(label: tokens.username))
            return true
        } catch {
            try await turnOffBiometricSignIn()
            return false
        }
    }

    /// "Continue as …" for the sign-in screen, from the item's label: no prompt.
    public func continueAs() async throws -> String? {
        try await vault.getItemInfo("refreshToken")?.label
    }

    /// Whether the vault's prompt can reach a person (a terminal, a password agent):
    /// without one, `INTERACTION_NOT_ALLOWED` is not "the device is locked, ask again" but "nobody can
    /// be asked here", and the password form is the way in.
    private var promptReachesUser: Bool {
        get async {
            guard let authenticator = vault.configuration.authenticator else { return false }
            return await authenticator.reachability() == .reachable
        }
    }

    /// Where the app goes at launch or after an unlock attempt.
    public enum Outcome: Sendable, Equatable {
        /// Signed in with this access token.
        case signedIn(accessToken: String)
        /// Show the password form; the refresh token stays. `after`: the code that led here
        /// (`USER_CANCELED`, `USER_FALLBACK`, `AUTHENTICATION_FAILED`, `LOCKOUT`, `LOCKOUT_PERMANENT`,
        /// or `INTERACTION_NOT_ALLOWED` when no prompt can reach the user: `reachability()`).
        case password(after: KeychainError.Code)
        /// Show the sign-in screen; with `biometricsChanged` (after `KEY_INVALIDATED`), say so
        /// ("fingerprints changed, sign in again").
        case signIn(biometricsChanged: Bool)
        /// The prompt could not finish: show the fingerprint screen again when the app is back.
        /// `after`: `SYSTEM_CANCELED` (the guide's text: ask again on return) or
        /// `INTERACTION_NOT_ALLOWED` with a prompt that can reach the user (the device is locked: ask
        /// again after the unlock).
        case askAgain(after: KeychainError.Code)
    }

    /// Step 4: at launch. `hasItem` first, so the app chooses between the sign-in screen and the
    /// fingerprint screen without bothering the user.
    public func restoreSession(isExpired: (String) -> Bool) async throws -> Outcome {
        if let accessToken = try await session.getItem("accessToken"), !isExpired(accessToken) {
            return .signedIn(accessToken: accessToken)
        }
        guard try await vault.hasItem("refreshToken") else { return .signIn(biometricsChanged: false) }
        return try await unlockAndRefresh()
    }

    /// Step 5: unlock the refresh token (the prompt), refresh, and map each ending to its next step.
    public func unlockAndRefresh() async throws -> Outcome {
        let refreshToken: String?
        do {
            refreshToken = try await vault.getItem("refreshToken")
        } catch {  // every Keychain call throws KeychainError only
            switch error.code {
            case .userCanceled, .userFallback, .lockout, .lockoutPermanent, .authenticationFailed:
                return .password(after: error.code)
            case .keyInvalidated:
                try await turnOffBiometricSignIn()
                return .signIn(biometricsChanged: true)
            case .interactionNotAllowed where await !promptReachesUser:
                return .password(after: error.code)
            case .systemCanceled, .interactionNotAllowed:
                return .askAgain(after: error.code)
            default:
                throw error
            }
        }
        guard let refreshToken else { return .signIn(biometricsChanged: false) }
        return .signedIn(accessToken: try await refresh(refreshToken))
    }

    /// The rotation: the new refresh token is written back at once, atomically and without a prompt;
    /// if the write fails the old one stays and the app can retry.
    public func refresh(_ refreshToken: String) async throws -> String {
        let tokens = try await server.refresh(refreshToken)
        try await session.setItem("accessToken", tokens.accessToken)
        try await vault.setItem("refreshToken", tokens.refreshToken)
        return tokens.accessToken
    }

    public func turnOffBiometricSignIn() async throws {
        try await vault.clear()
    }

    /// Sign-out: the access token and the whole vault; no prompt.
    public func signOut() async throws {
        try await session.removeItem("accessToken")
        try await vault.clear()
    }
}
