import Keychain

/// The app's tokens, with no configuration in sight: the access token in the default `keychain`,
/// the refresh token behind the owner's current fingers, readable only while the device is unlocked.
public struct Accounts: Sendable {
    public init() {}

    public func signIn(accessToken: String, refreshToken: String) async throws {
        try await keychain.setItem("accessToken", accessToken)
        try await vault().setItem("refreshToken", refreshToken)
    }

    /// Never prompts.
    public func accessToken() async throws -> String? {
        try await keychain.getItem("accessToken")
    }

    /// Asks for a finger.
    public func refreshToken() async throws -> String? {
        try await vault().getItem("refreshToken", options: .init(prompt: .init(title: "Sign in to Accounts")))
    }

    public func signOut() async throws {
        try await keychain.removeItem("accessToken")
        try await vault().clear()
    }

    private func vault() throws -> Keychain {
        try createKeychain(.init(service: "accounts.vault", accessible: .whenUnlockedThisDeviceOnly,
                                 accessControl: .biometryCurrentSet))
    }
}
