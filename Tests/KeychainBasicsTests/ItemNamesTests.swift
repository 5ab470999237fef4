import Foundation
@testable import KeychainBasics
import Testing

/// `ItemNames`: lengths as the seed's JavaScript counts them, bytes bounded with them (the store
/// refusing what a restore would refuse: `StoreNameBoundsTests`).
@Suite("item names")
struct ItemNamesTests {
    /// One letter and 300 combining accents: one Character to Swift, 301 UTF-16 code units to JavaScript.
    static let accented = "a" + String(repeating: "\u{0301}", count: 300)

    @Test func aServiceIsCountedInUTF16CodeUnitsAsTheSeedsJavaScriptCounts() {
        let attack = String(repeating: Self.accented, count: 256)
        #expect(attack.count == 256 && attack.utf8.count == 153_856)
        #expect(ItemNames.serviceProblem(attack)
                == "Invalid service: expected a non-empty string of up to 256 characters, got 77056 characters")
        // An emoji is two code units in JavaScript: 128 fit, 129 do not.
        #expect(ItemNames.serviceProblem(String(repeating: "😀", count: 128)) == nil)
        #expect(ItemNames.serviceProblem(String(repeating: "😀", count: 129))?.hasSuffix("got 258 characters") == true)
        #expect(ItemNames.serviceProblem(String(repeating: "x", count: 256)) == nil)
        #expect(ItemNames.serviceProblem(String(repeating: "x", count: 257))?.hasSuffix("got 257 characters") == true)
        #expect(ItemNames.serviceProblem("")?.hasSuffix("got an empty string") == true)
    }

    /// The length bounds the bytes: the longest valid service in UTF-8 is 768 bytes (3-byte code units).
    @Test func aValidServiceIsAtMost768Bytes() {
        let widest = String(repeating: "\u{FFFD}", count: 256)
        #expect(ItemNames.serviceProblem(widest) == nil && widest.utf8.count == 768)
        let pairs = String(repeating: "😀", count: 128)
        #expect(ItemNames.serviceProblem(pairs) == nil && pairs.utf8.count == 512)
    }

    /// keychaind's namespace before a valid service is a valid stored name; anything else is not.
    @Test func aStoredServiceMayCarryKeychaindsNamespace() {
        let full = String(repeating: "s", count: 256)
        #expect(ItemNames.storedServiceProblem("uid:4294967295/" + full) == nil)
        #expect(ItemNames.storedServiceProblem("group:team/" + full) == nil)
        #expect(ItemNames.storedServiceProblem("group:a/b/" + full) == nil, "a group name may hold a slash")
        #expect(ItemNames.storedServiceProblem("uid:12/" + full + "s") != nil)
        #expect(ItemNames.storedServiceProblem("uid:x/" + full) != nil)
        #expect(ItemNames.storedServiceProblem("group:" + String(repeating: "g", count: 257) + "/" + full) != nil)
        #expect(ItemNames.storedServiceProblem("uid:5/" + String(repeating: Self.accented, count: 256)) != nil)
    }

    @Test func keysAndLabelsAreBoundedInBytes() {
        #expect(ItemNames.keyProblem(String(repeating: "k", count: 1024)) == nil)
        #expect(ItemNames.keyProblem(String(repeating: "é", count: 513))
                == "Invalid key: expected a non-empty string of up to 1024 bytes, got 1026 bytes")
        #expect(ItemNames.keyProblem("") == "Invalid key: expected a non-empty string of up to 1024 bytes, got an empty string")
        #expect(ItemNames.labelProblem(String(repeating: "l", count: 4096)) == nil && ItemNames.labelProblem(nil) == nil)
        #expect(ItemNames.labelProblem(String(repeating: "l", count: 4097)) == "Invalid label: expected a string of up to 4096 bytes, got 4097 bytes")
    }
}
