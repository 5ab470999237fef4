import Testing
@testable import BiometricsVault
import Keychain

@Suite struct AllowedTransitionTests {
    @Test func enableKeychainVaultFromReadyStoresWithoutBiometricsAndEndsKeychainSecured() throws {
        var subject = try machine(in: .ready)
        #expect(try subject.enableKeychainVault(saving: newToken) == .store(newToken, protection: .keychain))
        #expect(subject.pending == .enableKeychainVault)
        #expect(subject.state == .ready)
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(newToken))
        #expect(subject.pending == nil)
    }

    @Test func enableKeychainVaultFromUnavailableNeedsNoBiometrics() throws {
        var subject = try machine(in: .unavailable)
        #expect(try subject.enableKeychainVault(saving: newToken) == .store(newToken, protection: .keychain))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(newToken))
    }

    @Test func upgradeStoresTheBiometricCopyAndOpensItWithAFingerBeforeRemovingTheKeychainItem() throws {
        var subject = try machine(in: .keychainSecured)
        #expect(try subject.upgradeKeychainWithBiometrics() == .store(token, protection: .biometrics))
        #expect(subject.pending == .upgradeKeychainWithBiometrics)
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(subject.state == .keychainSecured(token))
        #expect(try subject.operationSucceeded() == .remove(.keychain))
        #expect(subject.state == .keychainSecured(token))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .biometricsSecured(token))
        #expect(subject.pending == nil)
    }

    @Test func enableSecureVaultWithBiometricsFromReadyStoresBehindBiometricsAndOpensItWithAFinger() throws {
        var subject = try machine(in: .ready)
        #expect(try subject.enableSecureVaultWithBiometrics(saving: newToken) == .store(newToken, protection: .biometrics))
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(subject.state == .ready)
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .biometricsSecured(newToken))
    }

    @Test func lockTakesEffectAtOnceWithoutAKeychainOperation() throws {
        var subject = try machine(in: .biometricsSecured)
        #expect(try subject.lock() == .none)
        #expect(subject.state == .locked)
        #expect(subject.pending == nil)
    }

    @Test func unlockReadsTheBiometricItemAndKeepsWhatItRead() throws {
        var subject = try machine(in: .locked)
        #expect(try subject.unlockWithBiometrics() == .read(.biometrics))
        #expect(subject.pending == .unlockWithBiometrics)
        #expect(subject.state == .locked)
        #expect(try subject.credentialsRead(newToken) == .none)
        #expect(subject.state == .biometricsSecured(newToken))
    }

    @Test func downgradeStoresTheKeychainCopyBeforeRemovingTheBiometricItem() throws {
        var subject = try machine(in: .biometricsSecured)
        #expect(try subject.downgradeBiometricsToKeychain() == .store(token, protection: .keychain))
        #expect(try subject.operationSucceeded() == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(token))
    }

    @Test(arguments: [true, false])
    func disableRemovesTheBiometricItemAndEndsWithNothingStored(biometricsAvailable: Bool) throws {
        var subject = try machine(in: .biometricsSecured, biometricsAvailable: biometricsAvailable)
        #expect(try subject.disableBiometricsSecureVault() == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == (biometricsAvailable ? .ready : .unavailable))
    }

    @Test(arguments: VaultStateKind.allCases)
    func resetRemovesTheBiometricItemThenTheKeychainItemFromEveryState(state: VaultStateKind) throws {
        var subject = try machine(in: state)
        #expect(try subject.resetEverything() == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .remove(.keychain))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == (state == .unavailable ? .unavailable : .ready))
    }

    @Test func resetWithoutBiometricsEndsUnavailable() throws {
        var subject = try machine(in: .locked, biometricsAvailable: false)
        _ = try subject.resetEverything()
        _ = try subject.operationSucceeded()
        _ = try subject.operationSucceeded()
        #expect(subject.state == .unavailable)
    }

    @Test func reauthenticateOwnerAsksForThePasscodeAndStaysLockedEitherWay() throws {
        var subject = try machine(in: .locked)
        #expect(try subject.reauthenticateOwner() == .authenticateOwner)
        #expect(subject.pending == .reauthenticateOwner)
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .locked)

        #expect(try subject.reauthenticateOwner() == .authenticateOwner)
        #expect(try subject.operationFailed(.userCanceled) == .none)
        #expect(subject.state == .locked)
        #expect(subject.pending == nil)
    }

    /// Issue 37: an upgrade's touch can end in a lockout, and the seed's answer to a lockout is
    /// reauthenticateOwner; it used to be refused outside `locked`.
    @Test func afterAnUpgradesLockoutReauthenticateOwnerAsksForThePasscodeAndTheVaultStaysKeychainSecured() throws {
        var subject = try machine(in: .keychainSecured)
        #expect(try subject.upgradeKeychainWithBiometrics() == .store(token, protection: .biometrics))
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(try subject.operationFailed(.lockout) == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(token))

        #expect(try subject.reauthenticateOwner() == .authenticateOwner)
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .keychainSecured(token))
        #expect(try subject.upgradeKeychainWithBiometrics() == .store(token, protection: .biometrics))
    }

    @Test func theSeedsFirstFlowGoesFromSignInToBiometricsAndBack() throws {
        var subject = try machine(in: .ready)
        #expect(try subject.enableKeychainVault(saving: newToken) == .store(newToken, protection: .keychain))
        #expect(try subject.operationSucceeded() == .none)
        #expect(try subject.upgradeKeychainWithBiometrics() == .store(newToken, protection: .biometrics))
        #expect(try subject.operationSucceeded() == .verify(.biometrics))
        #expect(try subject.operationSucceeded() == .remove(.keychain))
        #expect(try subject.operationSucceeded() == .none)
        #expect(try subject.lock() == .none)
        #expect(try subject.unlockWithBiometrics() == .read(.biometrics))
        #expect(try subject.credentialsRead(newToken) == .none)
        #expect(subject.state == .biometricsSecured(newToken))
        #expect(try subject.disableBiometricsSecureVault() == .remove(.biometrics))
        #expect(try subject.operationSucceeded() == .none)
        #expect(subject.state == .ready)
    }
}

@Suite struct RefusedTransitionTests {
    @Test(arguments: VaultStateKind.allCases, VaultEvent.allCases)
    func everyInputFromEveryStateIsAllowedOrRefusedAsTheTableSays(state: VaultStateKind, event: VaultEvent) throws {
        var subject = try machine(in: state)
        let before = subject
        if allowed[state]!.contains(event) {
            #expect(throws: Never.self) { try perform(event, on: &subject) }
        } else if outcomes.contains(event) {
            #expect(throws: VaultError.unexpectedOutcome(event, pending: nil)) { try perform(event, on: &subject) }
            #expect(subject == before)
        } else {
            #expect(throws: VaultError.transitionNotAllowed(from: state, event: event)) {
                try perform(event, on: &subject)
            }
            #expect(subject == before)
        }
    }

    /// Every transition that waits for the keychain, as (state, transition).
    static let waitingTransitions = allowed.flatMap { state, events in
        events.filter { $0 != .lock }.map { (state, $0) }
    }

    @Test(arguments: waitingTransitions)
    func aPendingTransitionRefusesEveryOtherTransitionAndChangesNothing(state: VaultStateKind, pending: VaultEvent) throws {
        var subject = try machine(in: state)
        try perform(pending, on: &subject)
        let before = subject
        for event in transitions {
            #expect(throws: VaultError.operationInProgress(pending: pending, event: event)) {
                try perform(event, on: &subject)
            }
        }
        #expect(subject == before)
    }

    @Test func anOutcomeThatDoesNotAnswerThePendingActionIsRefused() throws {
        var storing = try machine(in: .keychainSecured)
        _ = try storing.upgradeKeychainWithBiometrics()
        let beforeStoring = storing
        #expect(throws: VaultError.unexpectedOutcome(.credentialsRead, pending: .upgradeKeychainWithBiometrics)) {
            try storing.credentialsRead(token)
        }
        #expect(storing == beforeStoring)

        var reading = try machine(in: .locked)
        _ = try reading.unlockWithBiometrics()
        let beforeReading = reading
        #expect(throws: VaultError.unexpectedOutcome(.operationSucceeded, pending: .unlockWithBiometrics)) {
            try reading.operationSucceeded()
        }
        #expect(reading == beforeReading)
    }

    @Test(arguments: transitions)
    func theMessageNamesTheStatesTheTableAllows(event: VaultEvent) {
        let states = VaultStateKind.allCases.filter { allowed[$0]!.contains(event) }
        #expect(event.allowedStates == states)
    }

    @Test func aRefusalSaysWhatWasCalledWhereAndWhereItWouldWork() throws {
        var subject = try machine(in: .ready)
        do {
            _ = try subject.lock()
            Issue.record("lock() from ready was not refused")
        } catch {
            #expect(error.description == "lock() is not allowed in state ready, only from biometricsSecured; nothing changed")
        }
    }
}

@Suite struct BiometricsAvailabilityTests {
    @Test func unavailableBecomesReadyWhenBiometricsArrives() throws {
        var subject = try machine(in: .unavailable)
        subject.biometricsAvailabilityChanged(true)
        #expect(subject.state == .ready)
        #expect(subject.biometricsAvailable)
    }

    @Test func readyBecomesUnavailableWhenBiometricsGoes() throws {
        var subject = try machine(in: .ready)
        subject.biometricsAvailabilityChanged(false)
        #expect(subject.state == .unavailable)
    }

    @Test(arguments: [VaultStateKind.keychainSecured, .biometricsSecured, .locked])
    func aStateThatStoresCredentialsKeepsThemWhenBiometricsGoes(state: VaultStateKind) throws {
        var subject = try machine(in: state)
        let before = subject.state
        subject.biometricsAvailabilityChanged(false)
        #expect(subject.state == before)
        #expect(!subject.biometricsAvailable)
    }

    @Test func upgradeWithoutBiometricsIsRefusedAndChangesNothing() throws {
        var subject = try machine(in: .keychainSecured, biometricsAvailable: false)
        let before = subject
        #expect(throws: VaultError.biometricsUnavailable(event: .upgradeKeychainWithBiometrics)) {
            try subject.upgradeKeychainWithBiometrics()
        }
        #expect(subject == before)
    }

    @Test func unlockIsTriedEvenWhenBiometricsLooksUnavailable() throws {
        var subject = try machine(in: .locked, biometricsAvailable: false)
        #expect(try subject.unlockWithBiometrics() == .read(.biometrics))
    }

    @Test func availabilityChangingDuringATransitionDecidesWhereNothingStoredEnds() throws {
        var subject = try machine(in: .ready)
        _ = try subject.enableSecureVaultWithBiometrics(saving: newToken)
        subject.biometricsAvailabilityChanged(false)
        #expect(subject.pending == .enableSecureVaultWithBiometrics)
        #expect(try subject.operationFailed(.biometryNotEnrolled) == .none)
        #expect(subject.state == .unavailable)
    }
}

@Suite struct StartupTests {
    /// (keychain item, biometric item exists, biometrics available, the state expected).
    static let cases: [(Token?, Bool, Bool, VaultState<Token>)] = [
        (nil, false, true, .ready),
        (nil, false, false, .unavailable),
        (token, false, true, .keychainSecured(token)),
        (token, false, false, .keychainSecured(token)),
        (nil, true, true, .locked),
        (nil, true, false, .locked),
        (token, true, true, .keychainSecured(token)),
        (token, true, false, .keychainSecured(token)),
    ]

    @Test(arguments: cases)
    func theStartupStateFollowsWhatIsStored(keychainItem: Token?, biometricItem: Bool, available: Bool,
                                            expected: VaultState<Token>) {
        let subject = Machine(startupFound: .init(keychainItem: keychainItem, biometricItemExists: biometricItem),
                              biometricsAvailable: available)
        #expect(subject.state == expected)
        #expect(subject.biometricsAvailable == available)
        #expect(subject.pending == nil)
    }
}

@Suite struct LockedHoldsNoCredentialsTests {
    @Test func theSearchFindsCredentialsWhereTheyAre() throws {
        #expect(holdsCredentials(try machine(in: .biometricsSecured)))
        var pending = try machine(in: .ready)
        _ = try pending.enableKeychainVault(saving: newToken)
        #expect(holdsCredentials(pending))
    }

    @Test func lockingDropsTheCredentials() throws {
        var subject = try machine(in: .biometricsSecured)
        _ = try subject.lock()
        #expect(!holdsCredentials(subject))
    }

    @Test func aLockedStartupHoldsNoCredentials() throws {
        #expect(!holdsCredentials(try machine(in: .locked)))
    }

    @Test(arguments: [VaultEvent.unlockWithBiometrics, .reauthenticateOwner, .resetEverything])
    func aTransitionPendingFromLockedHoldsNoCredentials(event: VaultEvent) throws {
        var subject = try machine(in: .locked)
        try perform(event, on: &subject)
        #expect(!holdsCredentials(subject))
    }

    @Test(arguments: seedCodes.filter { $0 != .keyInvalidated })
    func aFailedUnlockHoldsNoCredentials(code: KeychainError.Code) throws {
        var subject = try machine(in: .locked)
        _ = try subject.unlockWithBiometrics()
        _ = try subject.operationFailed(code)
        #expect(subject.state == .locked)
        #expect(!holdsCredentials(subject))
    }
}
