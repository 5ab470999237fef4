import Foundation
import KeychainTestThreads
@testable import PKCS11
import SecureMemory
import Testing

/// Against a real SoftHSM2 token through p11-kit, one private token per test (see `SoftHSM`).
@Suite(.serialized, .offThePool) struct TokenTests {
    // MARK: Modules and tokens

    @Test func loadingByModulePathReportsTheLibrary() throws {
        let hsm = try SoftHSM()
        let module = try PKCS11Module(path: SoftHSM.modulePath)
        #expect(module.path == SoftHSM.modulePath)
        #expect(module.info.manufacturer.contains("SoftHSM"))
        #expect(module.info.cryptokiVersion.major == 2)
        _ = hsm
    }

    @Test func loadingByRegisteredNameFindsSoftHSM() throws {
        let hsm = try SoftHSM()
        let token = try PKCS11Token(uri: PKCS11URI("pkcs11:token=test?module-name=softhsm2"))
        #expect(token.module.path.hasSuffix("libsofthsm2.so"))
        #expect(try token.info().label == hsm.label)
    }

    @Test func aModuleNameNotRegisteredIsAClearError() throws {
        let error = pkcs11Error { try PKCS11Module(registeredName: "no-such-module") }
        #expect(error?.returnValue == .libraryLoadFailed)
        #expect(error?.detail?.contains("softhsm2") == true)
    }

    @Test func aWrongModulePathIsAClearError() throws {
        let error = pkcs11Error { try PKCS11Module(path: "/nonexistent/libnothing.so") }
        #expect(error?.name == "CKR_LIBRARY_LOAD_FAILED")
        #expect(error?.description.contains("/nonexistent/libnothing.so") == true)
    }

    @Test func aURIWithoutAModuleIsRefusedBeforeLoadingAnything() throws {
        let error = pkcs11Error { try PKCS11Module(uri: PKCS11URI("pkcs11:token=test")) }
        #expect(error?.returnValue == .argumentsBad)
        #expect(error?.detail?.contains("module-path") == true)
    }

    @Test func p11KitsProxyModuleIsRefusedByNameAndByFile() throws {
        for path in ["p11-kit-proxy.so", "/usr/lib/x86_64-linux-gnu/p11-kit-proxy.so", "/usr/lib/x86_64-linux-gnu/libp11-kit.so.0"] {
            let error = pkcs11Error { try PKCS11Module(path: path) }
            #expect(error?.returnValue == .argumentsBad, "\(path)")
            #expect(error?.detail?.contains("p11-kit's proxy module") == true && error?.detail?.contains("module-name=") == true)
        }
    }

    @Test func rootGetsNoModuleFromItsHomeConfiguration() throws {
        // p11-kit skips ~/.config/pkcs11 for root: a module registered only there is not found, and the message says why.
        let home = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-home-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: home) }
        try FileManager.default.createDirectory(atPath: home + "/.config/pkcs11/modules", withIntermediateDirectories: true)
        try "module: \(SoftHSM.modulePath)\n".write(toFile: home + "/.config/pkcs11/modules/keychain-home-only.module",
                                                    atomically: true, encoding: .utf8)
        let saved = ProcessInfo.processInfo.environment["HOME"]
        setenv("HOME", home, 1)
        defer { if let saved { setenv("HOME", saved, 1) } }
        let error = pkcs11Error { try PKCS11Module(registeredName: "keychain-home-only") }
        #expect(error?.returnValue == .libraryLoadFailed)
        #expect(getuid() != 0 || error?.detail?.contains("not ~/.config/pkcs11") == true, "\(String(describing: error))")
    }

    @Test func tokenLabelsMatchBlankPaddedAsP11KitMatchesThem() throws {
        let hsm = try SoftHSM()
        // The label field is 32 bytes padded with blanks: trailing blanks in the URI change nothing.
        #expect(try PKCS11Token(uri: PKCS11URI("pkcs11:token=test%20%20?module-path=\(SoftHSM.modulePath)")).info().label == "test")
        for label in ["tes", "test%20x", String(repeating: "a", count: 33)] {
            let error = pkcs11Error { try PKCS11Token(uri: PKCS11URI("pkcs11:token=\(label)?module-path=\(SoftHSM.modulePath)")) }
            #expect(error?.returnValue == .tokenNotPresent, "\(label)")
        }
        _ = hsm
    }

    @Test func aTokenLabelThatIsAbsentIsAClearError() throws {
        let hsm = try SoftHSM()
        let error = pkcs11Error { try PKCS11Token(uri: PKCS11URI("pkcs11:token=absent?module-path=\(SoftHSM.modulePath)")) }
        #expect(error?.returnValue == .tokenNotPresent)
        #expect(error?.operation.contains("token=absent") == true)
        #expect(error?.detail?.contains("'\(hsm.label)'") == true)
    }

    @Test func aTokenIsMatchedOnEveryAttributeTheURIGives() throws {
        let hsm = try SoftHSM()
        let serial = try hsm.token().info().serial
        #expect(throws: Never.self) { try PKCS11Token(uri: hsm.uri(";model=SoftHSM%20v2;serial=\(serial)")) }
        let wrongSerial = pkcs11Error { try PKCS11Token(uri: hsm.uri(";serial=0000")) }
        #expect(wrongSerial?.returnValue == .tokenNotPresent)
        let wrongLibrary = pkcs11Error { try PKCS11Token(uri: hsm.uri(";library-manufacturer=Nobody")) }
        #expect(wrongLibrary?.returnValue == .tokenNotPresent)
    }

    @Test func tokenInfoShowsLabelMakerAndPINState() throws {
        let hsm = try SoftHSM()
        let info = try hsm.token().info()
        #expect(info.label == hsm.label)
        #expect(info.manufacturer == "SoftHSM project")
        #expect(info.model == "SoftHSM v2")
        #expect(!info.serial.isEmpty)
        #expect(info.flags.isSuperset(of: [.tokenInitialized, .userPinInitialized, .loginRequired]))
        #expect(!info.flags.contains(.userPinLocked))
    }

    // MARK: PINs

    @Test func theRightPINLogsInAndAWrongOneKeepsItsCKRName() throws {
        let hsm = try SoftHSM()
        let token = try hsm.token()
        let error = pkcs11Error { try token.login(pin: pin("0000")) }
        #expect(error?.name == "CKR_PIN_INCORRECT")
        #expect(error?.operation == "C_Login")
        #expect(throws: Never.self) { try token.login(pin: pin(SoftHSM.userPIN)) }
        #expect(try token.wrappingKey(label: "k", id: [1], create: true) != nil)
    }

    @Test func aWrongPINIsCheckedEvenWhileAnotherSessionIsLoggedIn() throws {
        let hsm = try SoftHSM()
        let first = try hsm.loggedInToken()
        let key = try #require(try first.wrappingKey(label: "k", id: [1], create: true))
        let second = try PKCS11Token(module: first.module, uri: hsm.uri())
        let error = pkcs11Error { try second.login(pin: pin("4321")) }
        #expect(error?.returnValue == .pinIncorrect)
        // The check logged the module out; the first token logs in again by itself.
        #expect(throws: Never.self) { try first.seal(SecureBytes(random: 32), with: key, associatedData: []) }
        // A right PIN logs out and in too, which renumbers private objects: handles are looked up again.
        #expect(throws: Never.self) { try second.login(pin: pin(SoftHSM.userPIN)) }
        #expect(throws: Never.self) { try first.seal(SecureBytes(random: 32), with: key, associatedData: []) }
    }

    @Test func softHSMCountsNoWrongPINsSoTheLimiterMust() throws {
        let hsm = try SoftHSM()
        let token = try hsm.token()
        var limiter = PINAttemptLimiter(limit: 3)
        for _ in 0..<5 where !limiter.isLocked {
            if pkcs11Error({ try token.login(pin: pin("9999")) })?.returnValue == .pinIncorrect { limiter.recordFailure() }
        }
        #expect(limiter.isLocked)
        // SoftHSM2 itself would still take the right PIN: the lock is ours to enforce.
        let flags = try token.info().flags
        #expect(flags.contains(.userPinCountLow) && !flags.contains(.userPinFinalTry) && !flags.contains(.userPinLocked))
        #expect(throws: Never.self) { try token.login(pin: pin(SoftHSM.userPIN)) }
    }

    @Test func thePINFromAPINSourceFileLogsIn() throws {
        let hsm = try SoftHSM()
        let file = hsm.directory + "/pin"
        try "\(SoftHSM.userPIN)\nsecond line\n".write(toFile: file, atomically: true, encoding: .utf8)
        let uri = try PKCS11URI("pkcs11:token=test?module-path=\(SoftHSM.modulePath)&pin-source=file:\(file)")
        let token = try PKCS11Token(uri: uri)
        let filePIN = try #require(try uri.pin())
        #expect(throws: Never.self) { try token.login(pin: filePIN) }
    }

    // MARK: Wrapping keys

    @Test func aWrappingKeyIsCreatedOnceAndFoundAgain() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        #expect(try token.wrappingKey(label: "service", id: [1, 2], create: false) == nil)
        let created = try #require(try token.wrappingKey(label: "service", id: [1, 2], create: true))
        #expect(try token.wrappingKey(label: "service", id: [1, 2], create: false) == created)
        #expect(try token.wrappingKey(label: "service", id: [1, 2], create: true) == created)
        #expect(try token.wrappingKey(label: "service", id: [9], create: false) == nil)
        #expect(try token.wrappingKey(label: "other", id: [1, 2], create: false) == nil)

        let sealed = try token.seal(SecureBytes(random: 32), with: created, associatedData: [7])
        // Another token instance, on a module instance of its own, finds the same key.
        let again = try hsm.loggedInToken()
        let found = try #require(try again.wrappingKey(label: "service", id: [1, 2], create: false))
        #expect(found.label == "service" && found.id == [1, 2])
        #expect(throws: Never.self) { try again.open(sealed, with: found, associatedData: [7]) }
        // And a handle made by the first instance is looked up again by label and ID.
        #expect(throws: Never.self) { try again.open(sealed, with: created, associatedData: [7]) }
    }

    @Test func theWrappingKeyIsSensitiveNeverExtractableAndOnlyEncrypts() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let attributes = try token.attributes(of: key)
        #expect(attributes == KeyAttributes(
            token: true, sensitive: true, extractable: false, alwaysSensitive: true, neverExtractable: true,
            encrypt: true, decrypt: true, sign: false, verify: false, wrap: false, unwrap: false, derive: false))
    }

    @Test func readingTheKeyValueIsRefused() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let ckaValue: UInt = 0x11  // CKA_VALUE
        let error = pkcs11Error {
            try token.withSession { session throws(PKCS11Error) in
                try token.module.attributeValues(session, key.secret, [ckaValue])
            }
        }
        #expect(error?.returnValue == .attributeSensitive)
    }

    @Test func pkcs11ToolListsTheKeyAsSensitiveAndNeverExtractable() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        _ = try token.wrappingKey(label: "keychain-service", id: [0xAB, 0xCD], create: true)
        let listing = try hsm.run("/usr/bin/pkcs11-tool", [
            "--module", SoftHSM.modulePath, "--token-label", hsm.label,
            "--login", "--pin", SoftHSM.userPIN, "--list-objects",
        ])
        #expect(listing.status == 0, "\(listing.output)")
        let object = try #require(listing.output.components(separatedBy: "Secret Key Object").dropFirst().first)
        #expect(object.contains("AES length 32"))
        #expect(object.contains("label:      keychain-service"))
        #expect(object.contains("ID:         abcd"))
        let access = try #require(object.split(separator: "\n").first { $0.contains("Access:") })
        #expect(access.contains("never extractable"))
        #expect(access.contains("always sensitive"))
        #expect(access.replacingOccurrences(of: "never extractable", with: "").contains("extractable") == false)
        let usage = try #require(object.split(separator: "\n").first { $0.contains("Usage:") })
        #expect(usage.contains("encrypt") && usage.contains("decrypt"))
        #expect(!usage.contains("sign") && !usage.contains("verify") && !usage.contains("wrap"))
    }

    @Test func destroyKeysRemovesEveryKeyWithTheLabel() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let first = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        _ = try token.wrappingKey(label: "service", id: [2], create: true)
        _ = try token.wrappingKey(label: "kept", id: [1], create: true)
        #expect(try token.destroyKeys(label: "service") == 2)
        #expect(try token.wrappingKey(label: "service", id: [1], create: false) == nil)
        #expect(try token.wrappingKey(label: "kept", id: [1], create: false) != nil)
        let gone = pkcs11Error { try token.seal(SecureBytes(random: 32), with: first, associatedData: []) }
        #expect(gone?.returnValue == .keyHandleInvalid)
        #expect(gone?.detail == "the key is no longer on the token")
        #expect(try token.destroyKeys(label: "service") == 0)
    }

    // MARK: Sealing data keys

    @Test func sealThenOpenGivesBackTheDataKey() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let dataKey = SecureBytes(random: 32)
        let aad = Array("service/item".utf8)
        let sealed = try token.seal(dataKey, with: key, associatedData: aad)
        #expect(sealed.count == 1 + 12 + 32 + 16 && sealed[0] == 1, "the AES-GCM format byte, IV, key, tag")
        #expect(try token.open(sealed, with: key, associatedData: aad) == dataKey)
        #expect(try token.seal(dataKey, with: key, associatedData: aad) != sealed, "a fresh IV every time")
        let empty = try token.seal(SecureBytes(count: 0), with: key, associatedData: [])
        #expect(try token.open(empty, with: key, associatedData: []).count == 0)
    }

    @Test func anAlteredByteOrOtherAssociatedDataIsRejected() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let aad = Array("service/item".utf8)
        let sealed = try token.seal(SecureBytes(random: 32), with: key, associatedData: aad)
        for (place, index) in [("format byte", 0), ("IV", 1), ("ciphertext", 13), ("tag", sealed.count - 1)] {
            var altered = sealed
            altered[index] ^= 0x01
            let error = pkcs11Error { try token.open(altered, with: key, associatedData: aad) }
            #expect(error?.isDataRejected == true, "altered \(place): \(String(describing: error))")
        }
        let otherAAD = pkcs11Error { try token.open(sealed, with: key, associatedData: Array("service/other".utf8)) }
        #expect(otherAAD?.isDataRejected == true)
        let truncated = pkcs11Error { try token.open(Array(sealed.prefix(20)), with: key, associatedData: aad) }
        #expect(truncated?.isDataRejected == true)
        // The token still works after the failures.
        #expect(throws: Never.self) { try token.open(sealed, with: key, associatedData: aad) }
    }

    @Test func anotherKeyCannotOpenWhatOneSealed() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let one = try #require(try token.wrappingKey(label: "one", id: [1], create: true))
        let other = try #require(try token.wrappingKey(label: "other", id: [1], create: true))
        let sealed = try token.seal(SecureBytes(random: 32), with: one, associatedData: [])
        #expect(pkcs11Error { try token.open(sealed, with: other, associatedData: []) }?.isDataRejected == true)
    }

    // MARK: Lost sessions

    @Test func aLostSessionIsReopenedLoggedInAndTheKeyFoundAgain() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        let sealed = try token.seal(SecureBytes(random: 32), with: key, associatedData: [])
        let before = (session: try #require(token.session), epoch: token.epoch)
        try token.module.closeSession(before.session)  // Behind the token's back.

        #expect(throws: Never.self) { try token.open(sealed, with: key, associatedData: []) }
        #expect(token.epoch != before.epoch)
        #expect(token.lookedUpAgain.count == 1)
        #expect(throws: Never.self) { try token.seal(SecureBytes(random: 32), with: key, associatedData: []) }
    }

    @Test func aLostLoginIsRedoneWithTheAcceptedPIN() throws {
        let hsm = try SoftHSM()
        let token = try hsm.loggedInToken()
        let key = try #require(try token.wrappingKey(label: "service", id: [1], create: true))
        try token.module.logout(try #require(token.session))
        #expect(throws: Never.self) { try token.seal(SecureBytes(random: 32), with: key, associatedData: []) }
    }

    @Test func withoutALoginKeysAreRefusedNotReportedMissing() throws {
        let hsm = try SoftHSM()
        _ = try hsm.loggedInToken().wrappingKey(label: "service", id: [1], create: true)
        let token = try hsm.token()
        let error = pkcs11Error { try token.wrappingKey(label: "service", id: [1], create: false) }
        #expect(error?.returnValue == .userNotLoggedIn)
        #expect(pkcs11Error { try token.destroyKeys(label: "service") }?.returnValue == .userNotLoggedIn)
    }
}
