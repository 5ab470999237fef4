import Foundation
@testable import KeychainStore
import Testing

/// The store refusing what a restore would refuse (`ItemNames`, KeychainBasics).
@Suite("item names in the store")
struct StoreNameBoundsTests {
    /// One letter and 300 combining accents: one Character to Swift, 301 UTF-16 code units to JavaScript.
    static let accented = "a" + String(repeating: "\u{0301}", count: 300)

    /// The last line: a record whose names a backup could not carry is never written.
    @Test func theStoreRefusesANameOutOfBoundsAndWritesNothing() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            for bad in [sampleItem(service: String(repeating: Self.accented, count: 256)), sampleItem(key: ""),
                        sampleItem(label: String(repeating: "l", count: 5000))] {
                do {
                    try store.write { try $0.putItem(bad) }
                    Issue.record("a record with a name out of bounds was written")
                } catch let error as StoreError {
                    #expect(error.kind == .invalidName && error.message.hasPrefix("Invalid "), "\(error)")
                }
            }
            #expect(try store.services().isEmpty)
            try store.write { try $0.putItem(sampleItem(service: "uid:1600/" + String(repeating: "s", count: 256))) }
            #expect(try store.services().count == 1)
        }
    }
}
