import Testing
@testable import SecureMemory

private func hex(_ string: String) -> [UInt8] {
    var bytes: [UInt8] = []
    var index = string.startIndex
    while index < string.endIndex {
        let next = string.index(index, offsetBy: 2)
        bytes.append(UInt8(string[index..<next], radix: 16)!)
        index = next
    }
    return bytes
}

private func bytes(of secure: SecureBytes) -> [UInt8] {
    secure.withUnsafeBytes { Array($0) }
}

@Suite struct SecureBytesTests {
    @Test func newSecureBytesAreZeroed() {
        let zeros = SecureBytes(count: 40)
        #expect(zeros.count == 40)
        #expect(bytes(of: zeros) == [UInt8](repeating: 0, count: 40))
    }

    @Test func copyingKeepsTheBytesFromAnyCollection() {
        #expect(bytes(of: SecureBytes(copying: [1, 2, 3])) == [1, 2, 3])
        #expect(bytes(of: SecureBytes(copying: (1...5).map { UInt8($0) }.reversed())) == [5, 4, 3, 2, 1])
        #expect(bytes(of: SecureBytes(copying: "hi".utf8)) == [0x68, 0x69])
        #expect(SecureBytes(copying: [UInt8]()).count == 0)
    }

    @Test func randomSecureBytesDifferFromEachOther() {
        let a = SecureBytes(random: 32), b = SecureBytes(random: 32)
        #expect(a.count == 32)
        #expect(a != b)
    }

    @Test func equalityComparesContentsAndLength() {
        let a = SecureBytes(copying: [1, 2, 3, 4])
        #expect(a == SecureBytes(copying: [1, 2, 3, 4]))
        #expect(a != SecureBytes(copying: [1, 2, 3, 5]))
        #expect(a != SecureBytes(copying: [1, 2, 3]))
        #expect(SecureBytes(count: 0) == SecureBytes(copying: [UInt8]()))
    }

    @Test func writesThroughMutableBytesAreVisible() {
        let s = SecureBytes(count: 3)
        s.withUnsafeMutableBytes { $0[1] = 9 }
        #expect(bytes(of: s) == [0, 9, 0])
    }

    @Test func everySizeAroundThePoolBoundariesKeepsItsBytes() {
        for size in [0, 1, 31, 32, 33, 64, 65, 1000, 2047, 2048, 2049, 5000, 70_000] {
            let source = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 3) }
            let secure = SecureBytes(copying: source)
            #expect(secure.count == size)
            #expect(bytes(of: secure) == source)
            #expect(secure == SecureBytes(copying: source))
        }
    }

    @Test func aRecycledRegionIsWipedBeforeReuse() {
        var address: UnsafeMutableRawPointer?
        do {
            let secret = SecureBytes(copying: [UInt8](repeating: 0xff, count: 48))
            address = secret.pointer
        }
        // Another test may take the region first; only a reuse on this thread proves anything.
        let next = SecureBytes(uninitializedCount: 48)
        if next.pointer == address {
            #expect(bytes(of: next) == [UInt8](repeating: 0, count: 48))
        }
    }

    @Test func descriptionNeverShowsTheContents() {
        let s = SecureBytes(copying: [0xde, 0xad, 0xbe, 0xef])
        #expect(s.description == "SecureBytes(4 bytes)")
        #expect(String(reflecting: s) == "SecureBytes(4 bytes)")
        var dumped = ""
        dump(s, to: &dumped)
        #expect(!dumped.contains("222"))  // 0xde
        #expect(!dumped.lowercased().contains("dead"))
    }
}

@Suite struct SodiumTests {
    private let key = SecureBytes(random: Sodium.xchachaKeyLength)

    @Test func randomBytesHaveTheRequestedLength() {
        #expect(Sodium.randomBytes(0).isEmpty)
        #expect(Sodium.randomBytes(24).count == 24)
        #expect(Sodium.randomBytes(24) != Sodium.randomBytes(24))
    }

    @Test func sealedDataOpensToTheSamePlaintext() throws {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        let plaintext: [UInt8] = Array("correct horse battery staple".utf8)
        let sealed = Sodium.seal(plaintext, key: key, nonce: nonce, associatedData: [1, 2, 3])
        #expect(sealed.count == plaintext.count + Sodium.xchachaTagLength)
        #expect(Array(sealed.prefix(plaintext.count)) != plaintext)
        let opened = try Sodium.open(sealed, key: key, nonce: nonce, associatedData: [1, 2, 3])
        #expect(bytes(of: opened) == plaintext)
    }

    @Test func allSealOverloadsProduceTheSameCiphertext() {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        let plaintext: [UInt8] = [9, 8, 7, 6, 5]
        let fromArray = Sodium.seal(plaintext, key: key, nonce: nonce, associatedData: [])
        let fromSecure = Sodium.seal(SecureBytes(copying: plaintext), key: key, nonce: nonce, associatedData: [])
        let fromRaw = plaintext.withUnsafeBytes {
            Sodium.seal($0, key: key, nonce: nonce, associatedData: [])
        }
        #expect(fromArray == fromSecure)
        #expect(fromArray == fromRaw)
    }

    @Test func emptyPlaintextAndEmptyAssociatedDataRoundTrip() throws {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        let sealed = Sodium.seal([UInt8](), key: key, nonce: nonce, associatedData: [])
        #expect(sealed.count == Sodium.xchachaTagLength)
        #expect(try Sodium.open(sealed, key: key, nonce: nonce, associatedData: []).count == 0)
    }

    @Test func anyTamperedByteFailsAuthentication() {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        let ad: [UInt8] = Array("service/key".utf8)
        let sealed = Sodium.seal(Array("secret".utf8), key: key, nonce: nonce, associatedData: ad)

        for i in sealed.indices {
            var bad = sealed
            bad[i] ^= 0x01
            #expect(throws: SodiumError.authenticationFailed) {
                try Sodium.open(bad, key: key, nonce: nonce, associatedData: ad)
            }
        }
        for i in nonce.indices {
            var bad = nonce
            bad[i] ^= 0x80
            #expect(throws: SodiumError.authenticationFailed) {
                try Sodium.open(sealed, key: key, nonce: bad, associatedData: ad)
            }
        }
        for i in ad.indices {
            var bad = ad
            bad[i] ^= 0x10
            #expect(throws: SodiumError.authenticationFailed) {
                try Sodium.open(sealed, key: key, nonce: nonce, associatedData: bad)
            }
        }
        #expect(throws: SodiumError.authenticationFailed) {
            try Sodium.open(Array(sealed.dropLast()), key: key, nonce: nonce, associatedData: ad)
        }
        #expect(throws: SodiumError.authenticationFailed) {
            try Sodium.open(sealed, key: SecureBytes(random: 32), nonce: nonce, associatedData: ad)
        }
    }

    @Test func badKeyOrNonceLengthsAreRejectedWhenOpening() {
        let nonce = Sodium.randomBytes(Sodium.xchachaNonceLength)
        let sealed = Sodium.seal([1], key: key, nonce: nonce, associatedData: [])
        #expect(throws: SodiumError.invalidLength) {
            try Sodium.open(sealed, key: key, nonce: Array(nonce.prefix(12)), associatedData: [])
        }
        #expect(throws: SodiumError.invalidLength) {
            try Sodium.open(sealed, key: SecureBytes(random: 16), nonce: nonce, associatedData: [])
        }
    }

    @Test func twoX25519PairsAgreeOnTheSameSecret() throws {
        let alice = Sodium.generateX25519(), bob = Sodium.generateX25519()
        #expect(alice.publicKey.count == 32)
        #expect(alice.secretKey.count == 32)
        #expect(alice.publicKey != bob.publicKey)
        #expect(Sodium.x25519Public(of: alice.secretKey) == alice.publicKey)
        let ab = try Sodium.x25519(alice.secretKey, bob.publicKey)
        let ba = try Sodium.x25519(bob.secretKey, alice.publicKey)
        #expect(ab == ba)
    }

    @Test func x25519MatchesTheRFC7748Vector() throws {
        let alice = SecureBytes(copying: hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
        let bobPublic = hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        #expect(Sodium.x25519Public(of: alice) == hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"))
        let shared = try Sodium.x25519(alice, bobPublic)
        #expect(bytes(of: shared) == hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"))
    }

    @Test func x25519RejectsLowOrderAndMisSizedPeers() {
        let me = Sodium.generateX25519()
        #expect(throws: SodiumError.weakPublicKey) {
            try Sodium.x25519(me.secretKey, [UInt8](repeating: 0, count: 32))
        }
        #expect(throws: SodiumError.invalidLength) {
            try Sodium.x25519(me.secretKey, [UInt8](repeating: 9, count: 31))
        }
    }

    @Test func keyedBlake2bMatchesPythonHashlib() {
        // python3: hashlib.blake2b(b'keychain wrapping key v1', key=bytes(range(32)), digest_size=32)
        let key = SecureBytes(copying: (0..<32).map { UInt8($0) })
        let digest = Sodium.blake2b(key: key, message: Array("keychain wrapping key v1".utf8))
        #expect(bytes(of: digest) == hex("6163b2b02c81abc259d8a16fd6e5379f0cd3c2b7297b6d7c6426423e2686e9fa"))
    }

    @Test func keyedBlake2bMatchesTheReferenceVectorForEmptyInput() {
        // BLAKE2b keyed KAT: empty message, key 00..3f, 64-byte output.
        let key = SecureBytes(copying: (0..<64).map { UInt8($0) })
        let digest = Sodium.blake2b(key: key, message: [], outputLength: 64)
        #expect(bytes(of: digest) == hex(
            "10ebb67700b1868efb4417987acf4690ae9d972fb7a590c2f02871799aaa4786"
                + "b5e996e8f0f4eb981fc214b005f42d2ff4233499391653df7aefcbc13fc51568"))
    }

    @Test func sodiumErrorsDescribeThemselves() {
        #expect(SodiumError.authenticationFailed != SodiumError.invalidLength)
        #expect(SodiumError.weakPublicKey.description.contains("weak"))
    }
}
