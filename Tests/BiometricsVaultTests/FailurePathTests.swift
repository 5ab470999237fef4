import Testing
@testable import BiometricsVault
import Keychain

@Suite struct UnlockFailureTests {
    @Test(arguments: seedCodes.filter { $0 != .keyInvalidated })
    func anUnlockThatEndsWithoutAValueLeavesTheItemAndStaysLocked(code: KeychainError.Code) throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        #expect(try subject.operationFailed(code) == .none)
        #expect(subject.state == .locked)
        #expect(subject.pending == nil)
        #expect(subject.biometricsAvailable)
    }

    @Test func anUnlockThatFindsTheKeyInvalidatedEndsReadyBecauseTheItemIsGone() throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        #expect(try subject.operationFailed(.keyInvalidated) == .none)
        #expect(subject.state == .ready)
    }

    @Test func anUnlockThatFindsNoItemEndsReady() throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        #expect(try subject.credentialsRead(nil) == .none)
        #expect(subject.state == .ready)
    }

    @Test func afterALockoutTheOwnerReauthenticatesAndUnlocksAgain() throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        _ = try subject.operationFailed(.lockout)
        #expect(try subject.reauthenticateOwner() == .authenticateOwner)
        _ = try subject.operationSucceeded()
        #expect(try subject.unlockWithBiometrics() == .read(.biometrics))
        _ = try subject.credentialsRead(token)
        #expect(subject.state == .biometricsSecured(token))
    }

    @Test(arguments: unavailabilityCodes)
    func anUnlockThatFindsNoUsableBiometricsStaysLockedAndMarksThemUnavailable(code: KeychainError.Code) throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        _ = try subject.operationFailed(code)
        #expect(subject.state == .locked)
        #expect(!subject.biometricsAvailable)
    }
}

@Suite struct UpgradeFailureTests {
    @Test(arguments: seedCodes + unavailabilityCodes)
    func anUpgradeWhoseBiometricWriteFailsStaysKeychainSecured(code: KeychainError.Code) throws {
        var subject = try machine(in: .keychainSecured)
        _ = try subject.upgradeKeychainWithBiometrics()
        #expect(try subject.operationFailed(code) == .none)
        #expect(subject.state == .keychainSecured(token))
        #expect(subject.pending == nil)
        #expect(subject.biometricsAvailable == !unavailabilityCodes.contains(code))
    }

    @Test(arguments: seedCodes)
    func anUpgradeWhoseKeychainRemovalFailsStaysKeychainSecuredWithBothItemsStored(code: KeychainError.Code) throws {
        var subject = try machine(in: .keychainSecured)
        _ = try subject.upgradeKeychainWithBiometrics()
        _ = try subject.operationSucceeded()
        #expect(try subject.operationSucceeded() == .remove(.keychain))
        #expect(try subject.operationFailed(code) == .none)
        #expect(subject.state == .keychainSecured(token))
        // What a restart finds: both items, hence the same state.
        let restarted = Machine(startupFound: .init(keychainItem: token, biometricItemExists: true), biometricsAvailable: true)
        #expect(restarted.state == subject.state)
    }

    /// The seed's library asks for the finger before it stores: a touch that fails or is canceled
    /// leaves the credentials where they were, not behind a finger the user cannot give.
    @Test(arguments: seedCodes + unavailabilityCodes)
    func anUpgradeWhoseTouchFailsRemovesTheCopyAndStaysKeychainSecured(code: KeychainError.Code) throws {
        var subject = try machine(in: .keychainSecured)
        _ = try subject.upgradeKeychainWithBiometrics()
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(try subject.operationFailed(code) == .remove(.biometrics))
        #expect(subject.pending == .upgradeKeychainWithBiometrics)
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(token))
        #expect(subject.pending == nil)
        #expect(subject.biometricsAvailable == !unavailabilityCodes.contains(code))
    }

    @Test func anUpgradeWhoseCopyCannotBeRemovedAfterAFailedTouchStaysKeychainSecuredWithBothItemsStored() throws {
        var subject = try machine(in: .keychainSecured)
        _ = try subject.upgradeKeychainWithBiometrics()
        _ = try subject.operationSucceeded()
        _ = try subject.operationFailed(.userCanceled)
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .keychainSecured(token))
        let restarted = Machine(startupFound: .init(keychainItem: token, biometricItemExists: true), biometricsAvailable: true)
        #expect(restarted.state == subject.state)
    }

    @Test func biometricsFoundUnenrolledDuringAnUpgradeRefusesTheNextUpgrade() throws {
        var subject = try machine(in: .keychainSecured)
        _ = try subject.upgradeKeychainWithBiometrics()
        _ = try subject.operationFailed(.biometryNotEnrolled)
        #expect(throws: VaultError.biometricsUnavailable(event: .upgradeKeychainWithBiometrics)) {
            try subject.upgradeKeychainWithBiometrics()
        }
    }
}

@Suite struct OtherFailureTests {
    @Test func aFailedKeychainWriteFromReadyLeavesNothingStored() throws {
        var subject = try machine(in: .ready)
        _ = try subject.enableKeychainVault(saving: newToken)
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .ready)
    }

    @Test(arguments: [(KeychainError.Code.storageError, VaultState<Token>.ready), (.biometryNotEnrolled, .unavailable),
                      (.passcodeNotSet, .unavailable)])
    func aFailedBiometricWriteFromReadyLeavesNothingStored(code: KeychainError.Code, expected: VaultState<Token>) throws {
        var subject = try machine(in: .ready)
        _ = try subject.enableSecureVaultWithBiometrics(saving: newToken)
        #expect(try subject.operationFailed(code) == .none)
        #expect(subject.state == expected)
    }

    @Test(arguments: seedCodes)
    func enablingBiometricsWhoseTouchFailsRemovesTheCopyAndEndsWithNothingStored(code: KeychainError.Code) throws {
        var subject = try machine(in: .ready)
        _ = try subject.enableSecureVaultWithBiometrics(saving: newToken)
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(try subject.operationFailed(code) == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .ready)
        #expect(!holdsCredentials(subject))
    }

    @Test func enablingBiometricsWhoseCopyCannotBeRemovedAfterAFailedTouchEndsLockedAsWhatIsStored() throws {
        var subject = try machine(in: .ready)
        _ = try subject.enableSecureVaultWithBiometrics(saving: newToken)
        _ = try subject.operationSucceeded()
        _ = try subject.operationFailed(.userCanceled)
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .locked)
        #expect(!holdsCredentials(subject))
        let restarted = Machine(startupFound: .init(biometricItemExists: true), biometricsAvailable: true)
        #expect(restarted.state == subject.state)
    }

    @Test func aDowngradeWhoseKeychainWriteFailsStaysBiometricsSecured() throws {
        var subject = try machine(in: .biometricsSecured)
        _ = try subject.downgradeBiometricsToKeychain()
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .biometricsSecured(token))
    }

    @Test func aDowngradeWhoseBiometricRemovalFailsEndsKeychainSecured() throws {
        var subject = try machine(in: .biometricsSecured)
        _ = try subject.downgradeBiometricsToKeychain()
        _ = try subject.operationSucceeded()
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .keychainSecured(token))
    }

    @Test func aDisableWhoseRemovalFailsStaysBiometricsSecured() throws {
        var subject = try machine(in: .biometricsSecured)
        _ = try subject.disableBiometricsSecureVault()
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == .biometricsSecured(token))
    }

    @Test(arguments: VaultStateKind.allCases)
    func aResetWhoseBiometricRemovalFailsEndsWhereItStarted(state: VaultStateKind) throws {
        var subject = try machine(in: state)
        let before = subject.state
        _ = try subject.resetEverything()
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == before)
    }

    @Test(arguments: [(VaultStateKind.keychainSecured, VaultState<Token>.keychainSecured(token)),
                      (.biometricsSecured, .ready), (.locked, .ready), (.ready, .ready), (.unavailable, .unavailable)])
    func aResetWhoseKeychainRemovalFailsEndsInTheStateOfWhatRemains(state: VaultStateKind,
                                                                    expected: VaultState<Token>) throws {
        var subject = try machine(in: state)
        _ = try subject.resetEverything()
        _ = try subject.operationSucceeded()
        #expect(try subject.operationFailed(.storageError) == .none)
        #expect(subject.state == expected)
    }
}
