import KeychainBasics
import Testing

@Suite struct HexTests {
    @Test func encodesEveryByteAsTwoDigitsInEitherCase() {
        #expect(Hex.encode([0x00, 0x0f, 0xa5, 0xff]) == "000fa5ff")
        #expect(Hex.encode([0x00, 0x0f, 0xa5, 0xff], uppercase: true) == "000FA5FF")
        #expect(Hex.encode([UInt8]()) == "")
        #expect(Hex.encode(Array(0...255)).count == 512)
    }

    @Test func encodesAnIntegerToAtLeastItsWidth() {
        #expect(Hex.encode(0xA0 as UInt, digits: 8, uppercase: true) == "000000A0")
        #expect(Hex.encode(0x1_0000_0000 as UInt64, digits: 8) == "100000000")
        #expect(Hex.encode(0x81000001 as UInt32, digits: 8) == "81000001")
    }

    @Test func decodesWhatItEncodes() {
        let bytes = (0...255).map { UInt8($0) }
        #expect(Hex.decode(Hex.encode(bytes).utf8) == bytes)
        #expect(Hex.decode(Hex.encode(bytes, uppercase: true).utf8) == bytes)
        #expect(Hex.decode("".utf8) == [])
    }

    @Test func refusesOddCountsSignsAndOtherCharacters() {
        #expect(Hex.decode("abc".utf8) == nil)
        #expect(Hex.decode("+f".utf8) == nil)
        #expect(Hex.decode("-0".utf8) == nil)
        #expect(Hex.decode("0g".utf8) == nil)
        #expect(Hex.decode(" 0".utf8) == nil)
    }
}
