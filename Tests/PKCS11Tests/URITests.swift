import Foundation
import PKCS11
import SecureMemory
import Testing

@Suite struct URITests {
    @Test func aFullURIGivesEveryAttribute() throws {
        let uri = try PKCS11URI(
            "pkcs11:token=Keychain;manufacturer=SoftHSM%20project;model=SoftHSM%20v2;serial=1a2b;slot-id=7;"
                + "object=wrap;id=%01%02%ff;type=secret-key;library-version=2.6"
                + "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/keychain/pin")
        #expect(uri.token == "Keychain")
        #expect(uri.manufacturer == "SoftHSM project")
        #expect(uri.model == "SoftHSM v2")
        #expect(uri.serial == "1a2b")
        #expect(uri.slotID == 7)
        #expect(uri.object == "wrap")
        #expect(uri.id == [0x01, 0x02, 0xFF])
        #expect(uri.type == .secretKey)
        #expect(uri.libraryVersion == .init(major: 2, minor: 6))
        #expect(uri.modulePath == "/usr/lib/softhsm/libsofthsm2.so")
        #expect(uri.moduleName == nil)
        #expect(uri.pinSource == "/run/keychain/pin")
        #expect(uri.pinValue == nil)
    }

    @Test func percentEncodedValuesAreDecodedAsUTF8() throws {
        let uri = try PKCS11URI("PKCS11:token=Schl%C3%BCssel%3B%26%3F;object=a%2fb?module-name=soft%68sm2&pin-value=12%2034")
        #expect(uri.token == "Schlüssel;&?")
        #expect(uri.object == "a/b")
        #expect(uri.moduleName == "softhsm2")
        let pin = try #require(try uri.pin())
        #expect(pin == SecureBytes(copying: Array("12 34".utf8)))
    }

    @Test func anEmptyURIMatchesEverything() throws {
        #expect(try PKCS11URI("pkcs11:") == PKCS11URI())
        #expect(try PKCS11URI("pkcs11:?") == PKCS11URI())
    }

    @Test func theDescriptionRoundTripsAndNeverShowsThePINValue() throws {
        let text = "pkcs11:model=SoftHSM%20v2;token=a%3Bb;id=%01%AB?module-path=/usr/lib/x.so&pin-source=file:/run/pin"
        let uri = try PKCS11URI(text)
        #expect(uri.description == text)
        #expect(try PKCS11URI(uri.description) == uri)
        let withPIN = try PKCS11URI("pkcs11:token=t?pin-value=secret")
        #expect(!withPIN.description.contains("secret"))
    }

    @Test(arguments: [
        ("pkcs11:token=t?pin-source=file:/run/pin", "/run/pin"),
        ("pkcs11:token=t?pin-source=file:///run/pin", "/run/pin"),
        ("pkcs11:token=t?pin-source=file://localhost/run/pin", "/run/pin"),
        ("pkcs11:token=t?pin-source=/run/pin", "/run/pin"),
    ])
    func pinSourceAcceptsFileURIsAndAbsolutePaths(text: String, path: String) throws {
        #expect(try PKCS11URI(text).pinSource == path)
    }

    @Test(arguments: [
        ("http://example/token", "starts with 'pkcs11:'"),
        ("pkcs11:token=a;token=b", "given twice"),
        ("pkcs11:token=a;;model=b", "empty attribute"),
        ("pkcs11:token", "has no '='"),
        ("pkcs11:Token=a", "not an attribute name"),
        ("pkcs11:token=a%2", "two hex digits"),
        ("pkcs11:token=a%zz", "two hex digits"),
        ("pkcs11:token=my token", "percent-encoded"),
        ("pkcs11:token=%ff%fe", "not valid UTF-8"),
        ("pkcs11:slot-id=x1", "decimal number"),
        ("pkcs11:library-version=1.2.3", "'M' or 'M.m'"),
        ("pkcs11:type=key", "type must be one of"),
        ("pkcs11:colour=blue", "unknown path attribute 'colour'"),
        ("pkcs11:token=a#frag", "no fragment"),
        ("pkcs11:token=a?pin-source=|/bin/askpin", "file: URI or an absolute path"),
        ("pkcs11:token=a?pin-source=pin.txt", "file: URI or an absolute path"),
        ("pkcs11:token=a?pin-value=1&pin-source=/p", "not both"),
        ("pkcs11:token=a?module-path=", "module-path is empty"),
        ("pkcs11:token=a?module-name=x&module-name=y", "given twice"),
        ("pkcs11:token=a?pin-source=/p&pin-source=/q", "given twice"),
        // RFC 7512: token is a path attribute, module-path a query one. Read as vendor query attributes,
        // the first would be ignored and the URI would match every token.
        ("pkcs11:?token=L&module-path=/usr/lib/softhsm/libsofthsm2.so", "'token' is a path attribute: write it before the '?'"),
        ("pkcs11:token=a?serial=1", "'serial' is a path attribute"),
        ("pkcs11:token=a;module-path=/m.so", "'module-path' is a query attribute: write it after a '?'"),
    ])
    func aMalformedURIIsRefusedWithAReason(text: String, reason: String) {
        #expect {
            _ = try PKCS11URI(text)
        } throws: { error in
            (error as? PKCS11URIError)?.message.contains(reason) == true
        }
    }

    @Test func unknownQueryAttributesAreIgnored() throws {
        #expect(try PKCS11URI("pkcs11:token=a?x-vendor=1&colour=blue").token == "a")
    }

    @Test func vendorQueryAttributesMayRepeat() throws {
        let uri = try PKCS11URI("pkcs11:token=a?x-vendor=1&module-path=/m.so&x-vendor=2")
        #expect(uri.token == "a" && uri.modulePath == "/m.so")
    }

    @Test func thePINIsTheFirstLineOfThePINSource() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-pin-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        func pin(fromFile contents: String) throws -> SecureBytes? {
            try contents.write(toFile: directory + "/pin", atomically: true, encoding: .utf8)
            return try PKCS11URI("pkcs11:?pin-source=file:\(directory)/pin").pin()
        }
        #expect(try pin(fromFile: "1234\nignored\n") == SecureBytes(copying: Array("1234".utf8)))
        #expect(try pin(fromFile: "1234\r\n") == SecureBytes(copying: Array("1234".utf8)))
        #expect(try pin(fromFile: "no newline") == SecureBytes(copying: Array("no newline".utf8)))
        #expect(throws: PKCS11URIError.self) { try pin(fromFile: "\nsecond") }
        #expect(throws: PKCS11URIError.self) { try pin(fromFile: String(repeating: "x", count: 2000)) }

        let missing = try PKCS11URI("pkcs11:?pin-source=\(directory)/absent")
        #expect {
            _ = try missing.pin()
        } throws: { error in
            (error as? PKCS11URIError)?.errno == ENOENT
        }
        #expect(try PKCS11URI("pkcs11:token=t").pin() == nil)
    }
}

@Suite struct ReturnValueTests {
    @Test func knownCodesHaveTheirSpecNames() {
        #expect(PKCS11ReturnValue.pinIncorrect.name == "CKR_PIN_INCORRECT")
        #expect(PKCS11ReturnValue.pinLocked.rawValue == 0xA4)
        #expect(PKCS11ReturnValue(rawValue: 0xB3).name == "CKR_SESSION_HANDLE_INVALID")
        #expect(PKCS11ReturnValue.aeadDecryptFailed.name == "CKR_AEAD_DECRYPT_FAILED")
        #expect(PKCS11ReturnValue.pinIncorrect.description == "CKR_PIN_INCORRECT (0x000000A0)")
    }

    @Test func unknownAndVendorCodesKeepTheirNumber() {
        #expect(PKCS11ReturnValue(rawValue: 0x123).name == "CKR_0x00000123")
        #expect(PKCS11ReturnValue(rawValue: 0x8000_0001).name == "CKR_VENDOR_DEFINED+0x00000001")
    }
}

@Suite struct PINAttemptLimiterTests {
    @Test func itLocksAfterTheLimitAndStaysLocked() {
        var limiter = PINAttemptLimiter(limit: 3)
        limiter.recordFailure()
        limiter.recordFailure()
        #expect(!limiter.isLocked && limiter.remaining == 1)
        limiter.recordFailure()
        #expect(limiter.isLocked && limiter.remaining == 0)
        limiter.recordFailure()
        #expect(limiter.failures == 3)
        limiter.recordSuccess()
        #expect(limiter.isLocked, "a success can't unlock: only reset() does")
        limiter.reset()
        #expect(!limiter.isLocked && limiter.failures == 0)
    }

    @Test func aSuccessStartsTheCountAgain() {
        var limiter = PINAttemptLimiter(limit: 3)
        limiter.recordFailure()
        limiter.recordFailure()
        limiter.recordSuccess()
        #expect(limiter.failures == 0 && limiter.remaining == 3)
    }

    @Test func itRoundTripsThroughTheCallersStore() throws {
        var limiter = PINAttemptLimiter(limit: 5)
        limiter.recordFailure()
        let stored = try JSONEncoder().encode(limiter)
        #expect(try JSONDecoder().decode(PINAttemptLimiter.self, from: stored) == limiter)
        #expect(PINAttemptLimiter(limit: 2, failures: 9).failures == 2)
    }
}
