import Foundation
import KeychainTestThreads
import Testing
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport

/// The message of the KeychainError `body` throws, or nil when it throws nothing (or something else).
private func message(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch {
        return (error as? KeychainError)?.message
    }
}

/// The error decoding `json` as options throws, or nil when it decodes and validates.
private func jsonError(_ json: String) -> KeychainError? {
    do {
        _ = try KeychainOptions.fromJSON(Data(json.utf8))
        return nil
    } catch {
        return error
    }
}

/// Every suite of this file, so that `swift test --filter OptionsTests` runs them all.
enum OptionsTests {}

extension OptionsTests {
    @Suite struct AccessControlTests {
        @Test(arguments: [
            ("none", AccessControl.none),
            ("biometryAny", .biometryAny),
            ("biometryCurrentSet", .biometryCurrentSet),
            ("biometryAnyOrPasscode", .biometryAnyOrPasscode),
            ("biometryCurrentSetOrPasscode", .biometryCurrentSetOrPasscode),
            ("passcode", .passcode),
        ])
        func everySeedStringParses(text: String, value: AccessControl) throws {
            #expect(try AccessControl(parsing: text) == value)
            #expect(value.rawValue == text)
        }

        @Test func thereAreExactlyTheSixSeedValues() {
            #expect(AccessControl.allCases.count == 6)
        }

        @Test func aBadStringThrowsInvalidArgumentListingTheValidValues() {
            #expect(throws: KeychainError(.invalidArgument)) { try AccessControl(parsing: "BiometryAny") }
            #expect(message { _ = try AccessControl(parsing: "faceID") } ==
                "Invalid accessControl: expected one of 'none', 'biometryAny', 'biometryCurrentSet', "
                + "'biometryAnyOrPasscode', 'biometryCurrentSetOrPasscode', 'passcode', got 'faceID'")
        }

        @Test func needsBiometryFollowsTheSeedsWriteTable() {
            let needing = AccessControl.allCases.filter(\.needsBiometry)
            #expect(needing == [.biometryAny, .biometryCurrentSet, .biometryCurrentSetOrPasscode])
            #expect(AccessControl.allCases.filter(\.usesBiometry) ==
                [.biometryAny, .biometryCurrentSet, .biometryAnyOrPasscode, .biometryCurrentSetOrPasscode])
        }

        @Test func passcodeAndCurrentSetHelpersNameTheRightValues() {
            #expect(AccessControl.allCases.filter(\.allowsPasscode) ==
                [.biometryAnyOrPasscode, .biometryCurrentSetOrPasscode, .passcode])
            #expect(AccessControl.allCases.filter(\.isCurrentSet) == [.biometryCurrentSet, .biometryCurrentSetOrPasscode])
        }
    }
}

extension OptionsTests {
    @Suite struct AccessibleTests {
        @Test(arguments: [
            ("whenUnlocked", Accessible.whenUnlocked),
            ("afterFirstUnlock", .afterFirstUnlock),
            ("always", .always),
            ("whenPasscodeSetThisDeviceOnly", .whenPasscodeSetThisDeviceOnly),
            ("whenUnlockedThisDeviceOnly", .whenUnlockedThisDeviceOnly),
            ("afterFirstUnlockThisDeviceOnly", .afterFirstUnlockThisDeviceOnly),
            ("alwaysThisDeviceOnly", .alwaysThisDeviceOnly),
        ])
        func everyAppleLevelParses(text: String, value: Accessible) throws {
            #expect(try Accessible(parsing: text) == value)
            #expect(value.rawValue == text)
        }

        @Test func thereAreExactlyApplesSevenLevels() {
            #expect(Accessible.allCases.count == 7)
        }

        @Test func aBadStringThrowsInvalidArgumentListingTheValidValues() throws {
            #expect(throws: KeychainError(.invalidArgument)) { try Accessible(parsing: "kSecAttrAccessibleAlways") }
            let text = try #require(message { _ = try Accessible(parsing: "afterFirstUnlockOnly") })
            #expect(text.hasPrefix("Invalid accessible: expected one of 'whenUnlocked', 'afterFirstUnlock', "))
            #expect(text.hasSuffix("'alwaysThisDeviceOnly', got 'afterFirstUnlockOnly'"))
        }

        @Test func fourLevelsAreThisDeviceOnlyAndOneRequiresAPasscode() {
            #expect(Accessible.allCases.filter(\.isThisDeviceOnly) ==
                [.whenPasscodeSetThisDeviceOnly, .whenUnlockedThisDeviceOnly, .afterFirstUnlockThisDeviceOnly,
                 .alwaysThisDeviceOnly])
            #expect(Accessible.allCases.filter(\.requiresPasscode) == [.whenPasscodeSetThisDeviceOnly])
        }

        @Test func availabilityIgnoresThisDeviceOnlyAndPasscodeSetIsWhenUnlocked() {
            #expect(Accessible.whenUnlocked.availability == .whenUnlocked)
            #expect(Accessible.whenUnlockedThisDeviceOnly.availability == .whenUnlocked)
            #expect(Accessible.whenPasscodeSetThisDeviceOnly.availability == .whenUnlocked)
            #expect(Accessible.afterFirstUnlock.availability == .afterFirstUnlock)
            #expect(Accessible.afterFirstUnlockThisDeviceOnly.availability == .afterFirstUnlock)
            #expect(Accessible.always.availability == .always)
            #expect(Accessible.alwaysThisDeviceOnly.availability == .always)
        }
    }
}

extension OptionsTests {
    @Suite struct KeyStorageTests {
        @Test func teeAndStrongboxParseAndAnythingElseThrows() throws {
            #expect(try KeyStorage(parsing: "tee") == .tee)
            #expect(try KeyStorage(parsing: "strongbox") == .strongbox)
            #expect(message { _ = try KeyStorage(parsing: "tpm") } ==
                "Invalid android.keyStorage: expected one of 'tee', 'strongbox', got 'tpm'")
        }
    }
}

extension OptionsTests {
    @Suite struct PromptTests {
        private let storage = Prompt(title: "Unlock your account", subtitle: "Vault", description: "Why", cancel: "Use password")

        @Test func aCallsTitleReplacesOnlyTheTitle() {
            let merged = storage.merged(with: Prompt(title: "Confirm the payment"))
            #expect(merged == Prompt(title: "Confirm the payment", subtitle: "Vault", description: "Why", cancel: "Use password"))
        }

        @Test func eachFieldOfTheCallWinsWhereSet() {
            #expect(storage.merged(with: Prompt(subtitle: "S")).subtitle == "S")
            #expect(storage.merged(with: Prompt(description: "D")).description == "D")
            #expect(storage.merged(with: Prompt(cancel: "C")).cancel == "C")
            #expect(storage.merged(with: Prompt(subtitle: "S")).title == storage.title)
            #expect(Prompt().merged(with: Prompt(cancel: "C")) == Prompt(cancel: "C"))
        }

        @Test func noCallPromptKeepsTheStorages() {
            #expect(storage.merged(with: nil) == storage)
            #expect(storage.merged(with: Prompt()) == storage)
        }

        @Test func aReadsPromptIsTheStoragesMergedWithTheCalls() {
            let options = KeychainOptions(prompt: storage)
            #expect(options.resolvedPrompt(for: GetItemOptions(prompt: Prompt(title: "T"))).cancel == "Use password")
            #expect(KeychainOptions().resolvedPrompt(for: nil) == Prompt())
        }
    }
}

extension OptionsTests {
    @Suite struct KeychainOptionsRulesTests {
        @Test func defaultOptionsAreTheSeedsDefaults() throws {
            let options = KeychainOptions()
            #expect(options.service == nil)
            #expect(options.accessible == .afterFirstUnlock)
            #expect(options.accessControl == .none)
            #expect(options.authValidity == 0)
            #expect(options.synchronizable == false)
            #expect(options.accessGroup == nil)
            #expect(options.prompt == nil)
            #expect(options.android.keyStorage == .tee)
            #expect(try options.validated() == options)
            #expect(try KeychainOptions.fromJSON(Data("{}".utf8)) == options)
        }

        @Test func theSeedsVaultOptionsAreValid() throws {
            let vault = KeychainOptions(
                service: "auth.vault", accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryCurrentSet,
                prompt: Prompt(title: "Sign in to Example", cancel: "Use password"))
            #expect(try vault.validated() == vault)
        }

        @Test func anEmptyServiceIsInvalid() {
            #expect(message { _ = try KeychainOptions(service: "").validated() } ==
                "Invalid service: expected a non-empty string of up to 256 characters, got an empty string")
        }

        @Test func aServiceOver256CharactersIsInvalidAnd256IsFine() throws {
            #expect(message { _ = try KeychainOptions(service: String(repeating: "s", count: 257)).validated() } ==
                "Invalid service: expected a non-empty string of up to 256 characters, got 257 characters")
            _ = try KeychainOptions(service: String(repeating: "s", count: 256)).validated()
        }

        @Test(arguments: [AccessControl.biometryCurrentSet, .biometryCurrentSetOrPasscode])
        func currentSetWithAnAuthValidityWindowIsInvalid(accessControl: AccessControl) throws {
            let text = try #require(message {
                _ = try KeychainOptions(accessControl: accessControl, authValidity: 30).validated()
            })
            #expect(text.hasPrefix("accessControl '\(accessControl.rawValue)' can't be used with authValidity > 0"))
        }

        @Test func anyWithAnAuthValidityWindowIsValid() throws {
            _ = try KeychainOptions(accessControl: .biometryAny, authValidity: 30).validated()
            _ = try KeychainOptions(accessControl: .biometryCurrentSet, authValidity: 0).validated()
        }

        @Test func aNegativeAuthValidityIsInvalid() {
            #expect(throws: KeychainError(.invalidArgument)) { try KeychainOptions(authValidity: -1).validated() }
            #expect(message { _ = try KeychainOptions(authValidity: -1).validated() } ==
                "Invalid authValidity: expected a whole number of seconds, 0 or more, got -1")
        }

        @Test(arguments: Accessible.allCases.filter(\.isThisDeviceOnly))
        func synchronizableWithAThisDeviceOnlyLevelIsInvalid(accessible: Accessible) throws {
            let text = try #require(message {
                _ = try KeychainOptions(accessible: accessible, synchronizable: true).validated()
            })
            #expect(text.hasPrefix("synchronizable can't be used with accessible '\(accessible.rawValue)'"))
        }

        @Test func theSeedsSynchronizableExampleGivesItsMessage() {
            #expect(message { _ = try KeychainOptions(accessible: .afterFirstUnlockThisDeviceOnly, synchronizable: true).validated() } ==
                "synchronizable can't be used with accessible 'afterFirstUnlockThisDeviceOnly': a ThisDeviceOnly item "
                + "never leaves this device; set synchronizable to false, or use accessible 'afterFirstUnlock'")
        }

        @Test(arguments: AccessControl.allCases.filter { $0 != .none })
        func synchronizableBehindAuthenticationIsInvalid(accessControl: AccessControl) throws {
            let text = try #require(message {
                _ = try KeychainOptions(accessControl: accessControl, synchronizable: true).validated()
            })
            #expect(text.hasPrefix("synchronizable can't be used with accessControl '\(accessControl.rawValue)'"))
        }

        @Test func synchronizableWithAMovableLevelAndNoAccessControlIsValid() throws {
            for accessible in Accessible.allCases where !accessible.isThisDeviceOnly {
                _ = try KeychainOptions(accessible: accessible, synchronizable: true).validated()
            }
        }

        @Test func anEmptyAccessGroupIsInvalid() throws {
            let text = try #require(message { _ = try KeychainOptions(accessGroup: "").validated() })
            #expect(text.hasPrefix("Invalid accessGroup: expected a non-empty string"))
            _ = try KeychainOptions(accessGroup: "ABCDE12345.com.example.shared").validated()
        }
    }
}

extension OptionsTests {
    @Suite struct PerCallOverrideTests {
        @Test func aWriteWithoutOverridesGetsTheStoragesProtection() throws {
            let options = KeychainOptions(accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryCurrentSet)
            let protection = try options.resolved(for: nil)
            #expect(protection == (try ItemProtection(accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryCurrentSet)))
        }

        @Test func eachOverrideReplacesOnlyItsField() throws {
            let options = KeychainOptions(accessible: .whenUnlocked, accessControl: .biometryAny, authValidity: 10)
            let protection = try options.resolved(for: SetItemOptions(accessControl: .biometryAnyOrPasscode, label: "ivan"))
            #expect(protection.accessible == .whenUnlocked)
            #expect(protection.accessControl == .biometryAnyOrPasscode)
            #expect(protection.authValidity == 10)
            #expect(protection.synchronizable == false)
        }

        @Test func anOverrideThatBreaksARuleThrows() throws {
            let vault = try KeychainOptions(accessControl: .biometryAny, authValidity: 30).validated()
            let text = try #require(message { _ = try vault.resolved(for: SetItemOptions(accessControl: .biometryCurrentSet)) })
            #expect(text.hasPrefix("accessControl 'biometryCurrentSet' can't be used with authValidity > 0"))

            let keys = KeychainOptions(accessible: .afterFirstUnlockThisDeviceOnly)
            #expect(throws: KeychainError(.invalidArgument)) { try keys.resolved(for: SetItemOptions(synchronizable: true)) }
        }

        @Test func anOverrideCanMakeAWriteValid() throws {
            let options = KeychainOptions(accessControl: .biometryCurrentSet)
            let protection = try options.resolved(for: SetItemOptions(accessControl: AccessControl.none, synchronizable: true))
            #expect(protection.synchronizable)
        }
    }
}

extension OptionsTests {
    @Suite struct ItemProtectionTests {
        @Test func storageTagIsAccessibleSlashAccessControl() throws {
            let protection = try ItemProtection(accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryCurrentSet)
            #expect(protection.storageTag == "whenUnlockedThisDeviceOnly/biometryCurrentSet")
        }

        @Test func storageTagRoundTripsForEveryCombination() throws {
            for accessible in Accessible.allCases {
                for accessControl in AccessControl.allCases {
                    let protection = try ItemProtection(accessible: accessible, accessControl: accessControl)
                    #expect(ItemProtection(storageTag: protection.storageTag) == protection)
                }
            }
            let windowed = try ItemProtection(accessControl: .biometryAny, authValidity: 60)
            #expect(ItemProtection(storageTag: windowed.storageTag, authValidity: 60) == windowed)
        }

        @Test(arguments: ["", "afterFirstUnlock", "afterFirstUnlock/", "/none", "afterFirstUnlock/none/x", "AfterFirstUnlock/none"])
        func aMalformedStorageTagParsesToNil(tag: String) {
            #expect(ItemProtection(storageTag: tag) == nil)
        }

        @Test func aStorageTagWithFieldsThatBreakARuleParsesToNil() {
            #expect(ItemProtection(storageTag: "afterFirstUnlock/biometryCurrentSet", authValidity: 5) == nil)
        }
    }
}

extension OptionsTests {
    @Suite struct KeychainOptionsJSONTests {
        @Test func everySeedKeyDecodes() throws {
            let json = """
                {"service": "auth.vault", "accessible": "whenUnlockedThisDeviceOnly",
                 "accessControl": "biometryAny", "authValidity": 30, "synchronizable": false,
                 "accessGroup": "ABCDE12345.com.example.shared",
                 "prompt": {"title": "T", "subtitle": "S", "description": "D", "cancel": "C"},
                 "android": {"keyStorage": "strongbox"}}
                """
            let options = try KeychainOptions.fromJSON(Data(json.utf8))
            #expect(options == KeychainOptions(
                service: "auth.vault", accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryAny,
                authValidity: 30, accessGroup: "ABCDE12345.com.example.shared",
                prompt: Prompt(title: "T", subtitle: "S", description: "D", cancel: "C"),
                android: AndroidOptions(keyStorage: .strongbox)))
        }

        @Test func aMisspeltOptionGivesTheSeedsMessageExactly() throws {
            let error = try #require(jsonError(#"{"acessControl":"biometryAny"}"#))
            #expect(error.code == .invalidArgument)
            #expect(error.message == "Invalid keychain options: unknown option 'acessControl'")
        }

        @Test func aPlainJSONDecoderThrowsTheSameKeychainError() {
            #expect(throws: KeychainError(.invalidArgument)) {
                try JSONDecoder().decode(KeychainOptions.self, from: Data(#"{"acessControl":"biometryAny"}"#.utf8))
            }
        }

        @Test func aMisspeltNestedOptionIsNamedByItsPath() {
            #expect(jsonError(#"{"prompt":{"titel":"Unlock"}}"#)?.message ==
                "Invalid keychain options: unknown option 'prompt.titel'")
            #expect(jsonError(#"{"android":{"keystorage":"tee"}}"#)?.message ==
                "Invalid keychain options: unknown option 'android.keystorage'")
        }

        @Test func severalUnknownOptionsAreAllNamed() {
            #expect(jsonError(#"{"b":1,"a":2}"#)?.message == "Invalid keychain options: unknown options 'a', 'b'")
        }

        @Test func aBadValueNamesTheKeyAndTheValidValues() throws {
            let text = try #require(jsonError(#"{"accessControl":"faceID"}"#)?.message)
            #expect(text.hasPrefix("Invalid accessControl: expected one of 'none', 'biometryAny', "))
            #expect(text.hasSuffix(", got 'faceID'"))
            #expect(jsonError(#"{"android":{"keyStorage":"tpm"}}"#)?.message ==
                "Invalid android.keyStorage: expected one of 'tee', 'strongbox', got 'tpm'")
        }

        @Test func aValueOfTheWrongTypeNamesTheKeyAndWhatItGot() {
            #expect(jsonError(#"{"authValidity":"30"}"#)?.message ==
                "Invalid authValidity: expected a whole number of seconds, 0 or more, got '30'")
            #expect(jsonError(#"{"authValidity":1.5}"#)?.message ==
                "Invalid authValidity: expected a whole number of seconds, 0 or more, got 1.5")
            #expect(jsonError(#"{"synchronizable":"yes"}"#)?.message ==
                "Invalid synchronizable: expected true or false, got 'yes'")
            #expect(jsonError(#"{"accessible":3}"#)?.message.hasSuffix(", got 3") == true)
            #expect(jsonError(#"{"service":["a"]}"#)?.message ==
                "Invalid service: expected a non-empty string of up to 256 characters, got an array")
            #expect(jsonError(#"{"prompt":{"title":true}}"#)?.message == "Invalid prompt.title: expected a string, got true")
            #expect(jsonError(#"{"prompt":"Unlock"}"#)?.message ==
                "Invalid prompt: expected an object with the keys title, subtitle, description, cancel, got 'Unlock'")
            #expect(jsonError(#"{"android":5}"#)?.message == "Invalid android: expected an object with the key keyStorage, got 5")
        }

        @Test func theTopLevelMustBeAnObject() {
            #expect(jsonError("[]")?.message.hasPrefix("Invalid keychain options: expected an object with the keys service, ") == true)
        }

        @Test func malformedJSONIsInvalidArgumentWithTheParsersCause() throws {
            let error = try #require(jsonError(#"{"service": "#))
            #expect(error.code == .invalidArgument)
            #expect(error.message == "Invalid keychain options: not valid JSON")
            #expect(error.underlying != nil)
        }

        @Test func nullIsTheSameAsAMissingKey() throws {
            #expect(try KeychainOptions.fromJSON(Data(#"{"service":null,"accessControl":null}"#.utf8)) == KeychainOptions())
        }

        @Test func fromJSONAppliesTheRules() throws {
            let text = try #require(jsonError(#"{"accessControl":"biometryCurrentSet","authValidity":30}"#)?.message)
            #expect(text.hasPrefix("accessControl 'biometryCurrentSet' can't be used with authValidity > 0"))
            #expect(jsonError(#"{"service":""}"#)?.message.hasPrefix("Invalid service: expected a non-empty string of up to 256 characters") == true)
        }

        @Test func encodedOptionsUseTheSeedsKeysAndDecodeBack() throws {
            let options = KeychainOptions(
                service: "vault", accessControl: .biometryCurrentSet, prompt: Prompt(title: "Unlock", cancel: "Use password"))
            let data = try JSONEncoder().encode(options)
            let object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
            #expect(Set(object.keys) == ["service", "accessible", "accessControl", "authValidity", "synchronizable", "prompt", "android"])
            #expect(object["accessControl"] as? String == "biometryCurrentSet")
            #expect((object["android"] as? [String: Any])?["keyStorage"] as? String == "tee")
            #expect(try KeychainOptions.fromJSON(data) == options)
        }
    }
}

extension OptionsTests {
    @Suite struct KeychainErrorTests {
        @Test func codesAreTheSeedsStrings() {
            let codes: [(KeychainError.Code, String)] = [
                (.invalidArgument, "INVALID_ARGUMENT"), (.userCanceled, "USER_CANCELED"), (.userFallback, "USER_FALLBACK"),
                (.systemCanceled, "SYSTEM_CANCELED"), (.authenticationFailed, "AUTHENTICATION_FAILED"),
                (.lockout, "LOCKOUT"), (.lockoutPermanent, "LOCKOUT_PERMANENT"), (.keyInvalidated, "KEY_INVALIDATED"),
                (.biometryNotAvailable, "BIOMETRY_NOT_AVAILABLE"), (.biometryNotEnrolled, "BIOMETRY_NOT_ENROLLED"),
                (.passcodeNotSet, "PASSCODE_NOT_SET"), (.unsupported, "UNSUPPORTED"),
                (.missingUsageDescription, "MISSING_USAGE_DESCRIPTION"), (.interactionNotAllowed, "INTERACTION_NOT_ALLOWED"),
                (.deviceStateChanged, "DEVICE_STATE_CHANGED"), (.dataCorrupted, "DATA_CORRUPTED"),
                (.hardwareUnavailable, "HARDWARE_UNAVAILABLE"), (.storageError, "STORAGE_ERROR"), (.internal, "INTERNAL"),
            ]
            for (code, text) in codes {
                #expect(code.rawValue == text)
                #expect(code.description == text)
            }
            #expect(Set(codes.map(\.0)).count == codes.count)
        }

        @Test func errorsAreEqualByCodeOnly() {
            #expect(KeychainError(.lockout, "one") == KeychainError(.lockout, "two"))
            #expect(KeychainError(.lockout) != KeychainError(.lockoutPermanent))
        }

        @Test func descriptionIsCodeMessageAndCause() {
            #expect(KeychainError.invalidArgument("Bad").description == "INVALID_ARGUMENT: Bad")
            let tpm = KeychainError(.lockout, "Too many attempts", underlying: .tpm(code: 0x921, name: "TPM2_RC_LOCKOUT"))
            #expect(tpm.description == "LOCKOUT: Too many attempts (cause: TPM TPM2_RC_LOCKOUT (0x00000921))")
            let sqlite = KeychainError(.storageError, "Can't write", underlying: .sqlite(code: 5, message: "database is locked"))
            #expect(sqlite.description == "STORAGE_ERROR: Can't write (cause: SQLite 5: database is locked)")
            #expect(KeychainError(.storageError, "Open", underlying: .errno(13)).description == "STORAGE_ERROR: Open (cause: errno 13)")
            #expect(KeychainError.Cause.pkcs11(code: 0xA0, name: "CKR_PIN_INCORRECT").description ==
                "PKCS#11 CKR_PIN_INCORRECT (0x000000A0)")
        }
    }
}

extension OptionsTests {
    /// The options as a storage applies them on a real TPM: in-process, and through keychaind in the
    /// run of `ContractThroughDaemonTests` (the daemon resolves the per-call options it is sent).
    @Suite(.offThePool) struct ThroughAStorageTests {
        @Test func aPerCallOverrideIsTheStoredItemsProtection() async throws {
            let f = try Fixture()
            let storage = try createKeychain(.init(service: "o", accessible: .whenUnlockedThisDeviceOnly), configuration: f.configuration)
            try await storage.setItem("k", "v", options: SetItemOptions(accessible: .afterFirstUnlock, label: "ivan"))
            let info = try #require(try await storage.getItemInfo("k"))
            #expect(info.service == "o" && info.key == "k")
            #expect(info.accessible == .afterFirstUnlock && info.accessControl == AccessControl.none && info.label == "ivan")
            try await storage.setItem("plain", "v")
            #expect(try await storage.getItemInfo("plain")?.accessible == .whenUnlockedThisDeviceOnly)
            #expect(try await storage.getItem("k") == "v")
        }

        @Test func anOverrideThatBreaksARuleIsRefusedWithTheSameMessageAndStoresNothing() async throws {
            let f = try Fixture()
            let options = KeychainOptions(service: "o", accessControl: .biometryAny, authValidity: 30)
            let storage = try createKeychain(options, configuration: f.configuration)
            let call = SetItemOptions(accessControl: .biometryCurrentSet)
            let expected = try #require(message { _ = try options.validated().resolved(for: call) })
            do {
                try await storage.setItem("k", "v", options: call)
                Issue.record("the override was accepted")
            } catch {
                #expect(error.code == .invalidArgument && error.message == expected, "\(error)")
            }
            let synchronized = try createKeychain(.init(service: "o", accessible: .afterFirstUnlockThisDeviceOnly), configuration: f.configuration)
            #expect(await code { try await synchronized.setItem("k", "v", options: SetItemOptions(synchronizable: true)) } == .invalidArgument)
            #expect(try await synchronized.getAllKeys().isEmpty)
        }
    }
}

extension OptionsTests {
    /// Swift's `Optional.none` against the seed's `AccessControl.None`: a porting user writes `.none`
    /// meaning the seed's constant, and must get it (issue 21, item 4).
    @Suite(.offThePool) struct NoneIsTheSeedsNoneTests {
        @Test func aWritesNoneOverrideStoresAnUnprotectedItemInABiometricStorage() throws {
            // The seed's `vault.setItem('k', v, { accessControl: AccessControl.None })`.
            let vault = try KeychainOptions(service: "vault", accessControl: .biometryCurrentSet).validated()
            let call = SetItemOptions(accessControl: .none)
            #expect(call.accessControl == AccessControl.none)
            #expect(try vault.resolved(for: call).accessControl == AccessControl.none)
            // Without an override the storage's default holds.
            #expect(try vault.resolved(for: SetItemOptions(label: "ivan")).accessControl == .biometryCurrentSet)
        }

        @Test func comparingAnAbsentItemsAccessControlWithNoneIsFalse() {
            let unprotected: AccessControl? = AccessControl.none
            #expect(unprotected == .none)
            #expect(unprotected != .passcode)
            let absent: ItemInfo? = nil
            let absentIsUnprotected = absent?.accessControl == .none
            let absentIsProtected = absent?.accessControl != .none
            #expect(!absentIsUnprotected && absentIsProtected)
        }

        @Test func aStoragesNoneOverrideReadsWithoutAPrompt() async throws {
            let device = try await SimulatedDevice(passcode: bytes("1234"), fingers: ["right-index"])
            let vault = try createKeychain(.init(service: "vault", accessControl: .biometryCurrentSet),
                                           configuration: device.configuration)
            try await vault.setItem("plain", "v", options: SetItemOptions(accessControl: .none))
            let stored = try await vault.getItemInfo("plain")
            let storedIsUnprotected = stored?.accessControl == .none
            #expect(storedIsUnprotected)
            #expect(try await vault.getItem("plain") == "v")
            #expect(device.answers.requests.isEmpty)
            let absent = try await vault.getItemInfo("absent")
            let absentIsUnprotected = absent?.accessControl == .none
            #expect(!absentIsUnprotected)
        }
    }
}
