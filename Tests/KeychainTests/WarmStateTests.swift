import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import SecureMemory
import Testing

/// What warm reads keep stays small beside the values: a large value is looked up at each read, and
/// the kept ciphertexts have a ceiling in bytes as well as in items.
@Suite struct WarmStateTests {
    private func item(bytes: Int) -> WarmState.Item {
        WarmState.Item(opened: nil, storedWindow: nil, dataKey: SecureBytes(random: 32), nonce: [UInt8](repeating: 0, count: 24),
                       ciphertext: [UInt8](repeating: 1, count: bytes), associatedData: [])
    }

    @Test func aLargeValueIsNotKeptAndTheKeptBytesHaveACeiling() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("warm-state-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try Store(directory: directory)
        let warm = WarmState()
        warm.store = store

        warm.keep(item(bytes: WarmState.maxKeptValueBytes + 1), .init(service: "s", key: "large"), store: store, version: 1, secrets: nil)
        #expect(warm.kept.items == 0, "a value over the size kept is looked up at each read")
        #expect(warm.item(.init(service: "s", key: "large"), store: store, version: 1).map { _ in "kept" } == nil)

        // One name kept again counts once.
        warm.keep(item(bytes: 10), .init(service: "s", key: "again"), store: store, version: 1, secrets: nil)
        warm.keep(item(bytes: 20), .init(service: "s", key: "again"), store: store, version: 1, secrets: nil)
        #expect(warm.kept.items == 1 && warm.kept.bytes == 20)

        let size = WarmState.maxKeptValueBytes
        for n in 0..<(2 * WarmState.maxKeptBytes / size) {
            warm.keep(item(bytes: size), .init(service: "s", key: "k\(n)"), store: store, version: 1, secrets: nil)
            #expect(warm.kept.bytes <= WarmState.maxKeptBytes)
        }
        #expect(warm.kept.items > 0 && warm.kept.bytes <= warm.kept.items * size + 20)

        // A new data version drops everything kept, and its bytes with it.
        warm.keep(nil, .init(service: "s", key: "absent"), store: store, version: 2, secrets: nil)
        #expect(warm.kept.items == 1 && warm.kept.bytes == 0)
    }
}
