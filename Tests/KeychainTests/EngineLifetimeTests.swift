import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// An engine (a store's thread, its open database and the secrets it holds) lives while a storage
/// or device of its store does, and ends with the last one (issue 9, item 6).
@Suite("An engine ends with its last storage", .offThePool)
struct EngineLifetimeTests {
    @Test func anEnginesThreadEndsWhenItsLastStorageGoes() async throws {
        let tpm = try SoftwareTPM()
        let configuration = tpm.configuration(store: tpm.directory + "/store")
        weak var engine: Engine?
        var executor: SerialThreadExecutor?
        do {
            let storage = try createKeychain(.init(service: "s"), configuration: configuration)
            try await storage.setItem("k", "v")
            let second = try createKeychain(.init(service: "t"), configuration: configuration)
            let shared = try #require(storage.engine, "a storage without keychaind has an engine in this process")
            #expect(second.engine === shared, "two storages of a store share its engine")
            engine = shared
            executor = shared.executor
            #expect(try await second.getItem("k") == nil)
            #expect(try await storage.getItem("k") == "v")
            withExtendedLifetime((storage, second)) {}
        }
        #expect(engine == nil, "the engine went with its last storage")
        // The thread ends on its own once told: wait for it (no assertion on how long it takes).
        try waitUntil("the engine's thread to end") { executor?.hasEnded ?? true }
        #expect(executor?.hasEnded == true)
        // The next storage gets a new engine, and the store's items.
        let again = try createKeychain(.init(service: "s"), configuration: configuration)
        #expect(try await again.getItem("k") == "v")
    }
}
