import Accounts
import Keychain
import KeychainTestSupport
import Testing

// Each test makes its own SimulatedDevice: tests run in parallel, and a device has one answer queue.
@Suite struct AccountsTests {
    @Test func theRefreshTokenNeedsAnEnrolledFingerAndAnUnlockedDevice() async throws {
        // A private TPM in $TMPDIR/keychain-swtpm-<UUID>; passcode set, unlocked, "thumb" enrolled.
        let d = try await SimulatedDevice(passcode: SecureBytes(copying: Array("2468".utf8)), fingers: ["thumb"])
        try await d.asDefault {  // `keychain` and `createKeychain` in here use d
            let accounts = Accounts()
            try await accounts.signIn(accessToken: "at-1", refreshToken: "rt-1")
            #expect(try await accounts.accessToken() == "at-1")
            #expect(d.answers.requests.isEmpty)  // no prompt so far

            d.answers.push(.finger("thumb"))
            #expect(try await accounts.refreshToken() == "rt-1")
            #expect(d.answers.requests.map(\.prompt.title) == ["Sign in to Accounts"])

            d.answers.push(.cancel)
            await #expect(throws: KeychainError(.userCanceled)) { try await accounts.refreshToken() }

            try await d.lock()  // whenUnlocked items fail before any prompt
            await #expect(throws: KeychainError(.interactionNotAllowed)) { try await accounts.refreshToken() }
            #expect(d.answers.requests.count == 2)
            try await d.unlock()
            #expect(try await accounts.accessToken() == "at-1")
        }
    }

    @Test func aNewFingerInvalidatesTheRefreshToken() async throws {
        let d = try await SimulatedDevice(passcode: SecureBytes(copying: Array("2468".utf8)), fingers: ["thumb"])
        try await d.asDefault {
            let accounts = Accounts()
            try await accounts.signIn(accessToken: "at-1", refreshToken: "rt-1")
            try await d.enrollFinger("index")  // biometryCurrentSet: the item is gone for good
            d.answers.push(.finger("index"))
            await #expect(throws: KeychainError(.keyInvalidated)) { try await accounts.refreshToken() }
            #expect(try await accounts.refreshToken() == nil)  // reported once, then removed
            try await accounts.signOut()
            #expect(try await accounts.accessToken() == nil)
        }
    }
}
