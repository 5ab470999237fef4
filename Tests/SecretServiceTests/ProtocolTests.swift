import Testing
import SecureMemory
@testable import SecretService

/// The provider's pure parts, with no bus and no TPM.
@Suite struct ProtocolTests {
    @Test func hkdfMatchesRFC5869TestCase3() throws {
        // RFC 5869 A.3: SHA-256, IKM 22 × 0x0b, no salt, no info; the first 16 bytes of the OKM.
        let key = try SessionCrypto.hkdf(SecureBytes(copying: [UInt8](repeating: 0x0b, count: 22)))
        let hex = key.withUnsafeBytes { $0.map { String(format: "%02x", $0) }.joined() }
        #expect(hex == "8da4e775a563c18f715f802a063c5a31")
    }

    @Test func aesRoundTripsWithNULsAndAFreshIVEachTime() throws {
        let key = SecureBytes(random: 16)
        let secret = SecureBytes(copying: [0, 1, 0, 255, 0] + Array("pw".utf8))
        let one = try SessionCrypto.encrypt(secret, key: key)
        let two = try SessionCrypto.encrypt(secret, key: key)
        #expect(one.iv != two.iv)
        #expect(one.ciphertext.count == 16)
        let back = try SessionCrypto.decrypt(SecureBytes(copying: one.ciphertext), iv: SecureBytes(copying: one.iv), key: key)
        #expect(back == secret)
    }

    @Test func aesRefusesAShortIVAndBrokenBlocks() {
        let key = SecureBytes(random: 16)
        #expect(throws: DBusError.invalidArgs("")) {
            try SessionCrypto.decrypt(SecureBytes(count: 16), iv: SecureBytes(count: 8), key: key)
        }
        #expect(throws: DBusError.invalidArgs("")) {
            try SessionCrypto.decrypt(SecureBytes(count: 15), iv: SecureBytes(count: 16), key: key)
        }
        #expect(throws: DBusError.invalidArgs("")) {
            try SessionCrypto.decrypt(SecureBytes(count: 0), iv: SecureBytes(count: 16), key: key)
        }
    }

    @Test func dhRefusesPublicKeysWithAKnownSharedSecret() throws {
        for weak: [UInt8] in [[0], [1], Array(repeating: 0xFF, count: 129)] {
            #expect(throws: DBusError.invalidArgs("")) { try SessionCrypto.agree(clientPublic: SecureBytes(copying: weak)) }
        }
        // p − 1.
        var pMinusOne = (0..<128).map { i in UInt8(SessionCrypto.primeHex.utf8.dropFirst(2 * i).prefix(2).reduce(0) { $0 * 16 + Int(hexValue($1)) }) }
        pMinusOne[127] -= 1
        #expect(throws: DBusError.invalidArgs("")) { try SessionCrypto.agree(clientPublic: SecureBytes(copying: pMinusOne)) }
        let ok = try SessionCrypto.agree(clientPublic: SecureBytes(copying: [2]))
        #expect(ok.ourPublic.count == 128)
        #expect(ok.key.count == 16)
    }

    /// The import's client half and the provider's half derive the same AES key (each group).
    @Test func aClientKeyPairAndTheProviderAgreeOnTheSessionKey() throws {
        for group: SessionCrypto.Group in [.oakley1024, .modp1536] {
            let client = try SessionCrypto.keyPair(group)
            let provider = try SessionCrypto.agree(clientPublic: SecureBytes(copying: client.publicKey), group: group)
            let key = try SessionCrypto.sessionKey(client, peerPublic: SecureBytes(copying: provider.ourPublic), group: group)
            #expect(key == provider.key)
            #expect(throws: DBusError.invalidArgs("")) { try SessionCrypto.sessionKey(client, peerPublic: SecureBytes(copying: [1]), group: group) }
        }
    }

    @Test func sealedItemRoundTripsAndRefusesOtherBytes() throws {
        let item = SealedItem(label: "Läbel", contentType: "text/plain", attributes: ["a": "1", "xdg:schema": "org.example"],
                              secret: SecureBytes(copying: [0, 0, 7]))
        let back = try #require(SealedItem(decoding: item.encoded()))
        #expect(back.label == "Läbel")
        #expect(back.contentType == "text/plain")
        #expect(back.attributes == item.attributes)
        #expect(back.secret == item.secret)
        let encoded = item.encoded().withUnsafeBytes { Array($0) }
        #expect(SealedItem(decoding: SecureBytes(copying: encoded.dropLast())) == nil)
        #expect(SealedItem(decoding: SecureBytes(copying: encoded + [0])) == nil)
        #expect(SealedItem(decoding: SecureBytes(copying: Array("xx1".utf8) + encoded.dropFirst(3))) == nil)
    }

    @Test func attributeHashesAreKeyedAndHideTheValue() {
        let one = AttributeHasher(key: SecureBytes(random: 32))
        let two = AttributeHasher(key: SecureBytes(random: 32))
        #expect(one.hash(name: "user", value: "alice") != two.hash(name: "user", value: "alice"))
        #expect(one.hash(name: "user", value: "alice") != one.hash(name: "use", value: "ralice"))
        let label = AttributeHasher.label(one.hashes(["user": "alice", "host": "example.org"]))
        #expect(!label.contains("alice") && !label.contains("example"))
        #expect(AttributeHasher.hashes(label: label) == one.hashes(["user": "alice", "host": "example.org"]))
        #expect(AttributeHasher.hashes(label: AttributeHasher.label([])) == [])
        #expect(AttributeHasher.hashes(label: "someone else's label") == nil)
    }

    @Test func theItemIndexFindsWhatHasEveryHashAfterWritesReplacementsAndRemovals() {
        func entry(_ hashes: Set<String>) -> SecretServiceProvider.ItemEntry { .init(hashes: hashes, created: 0, modified: 0) }
        var index = SecretServiceProvider.ItemIndex()
        index["b"] = entry(["app", "user-alice"])
        index["a"] = entry(["app", "user-bob"])
        index["c"] = entry(["other"])
        #expect(index.matching(["app"]) == ["a", "b"])
        #expect(index.matching(["app", "user-alice"]) == ["b"])
        #expect(index.matching(["user-alice", "other"]) == [])
        #expect(index.matching(["nobody"]) == [])
        #expect(index.matching([]) == ["a", "b", "c"])
        // New attributes: the old hashes no longer find it, the new ones do.
        index["b"] = entry(["app", "user-carol"])
        #expect(index.matching(["user-alice"]) == [])
        #expect(index.matching(["app", "user-carol"]) == ["b"])
        // A change that keeps the hashes (a label read) keeps it found.
        index["a"]?.label = "bob's"
        #expect(index.matching(["user-bob"]) == ["a"])
        index["a"] = nil
        #expect(index.matching(["app"]) == ["b"])
        #expect(index.matching(["user-bob"]) == [])
        index.removeAll()
        #expect(index.matching(["app"]) == [] && index.matching([]) == [])
    }

    @Test func everyMethodsSignatureIsTheSpecs() {
        #expect(Introspection.signature(of: "CreateItem", in: SecretServiceProvider.collectionInterface) == "a{sv}(oayays)b")
        #expect(Introspection.signature(of: "GetSecrets", in: SecretServiceProvider.serviceInterface) == "aoo")
        #expect(Introspection.signature(of: "OpenSession", in: SecretServiceProvider.serviceInterface) == "sv")
        #expect(Introspection.signature(of: "Close", in: SecretServiceProvider.sessionInterface) == "")
        #expect(Introspection.signature(of: "Nope", in: SecretServiceProvider.serviceInterface) == nil)
    }
}

func hexValue(_ c: UInt8) -> UInt8 { c <= 0x39 ? c - 0x30 : (c | 0x20) - 0x61 + 10 }
