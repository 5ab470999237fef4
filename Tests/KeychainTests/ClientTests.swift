import Foundation
import Keychain
import KeychainClient
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// `KeychainClient`, keychaind's item calls without the library: the same items, codes and messages.
/// (What it links is checked on a program built outside this package: scripts/test-outside-package.sh.)
@Suite("KeychainClient: keychaind without the library", .offThePool)
struct ClientTests {
    let tpm: SoftwareTPM
    let daemon: KeychainDaemon

    init() throws {
        tpm = try SoftwareTPM()
        daemon = try KeychainDaemon(tpm: tpm)
    }

    @Test func itsItemsAreTheLibrarysThroughTheSameDaemon() async throws {
        let client = try KeychainClient(options: .init(service: "client.svc"), socket: daemon.socket)
        let storage = try createKeychain(.init(service: "client.svc"), configuration: daemon.configuration())
        var value = Array("c-1".utf8)
        try client.setItem("token", &value, options: WireSetOptions(accessible: "whenUnlocked", label: "from the client"))
        #expect(value.allSatisfy { $0 == 0 }, "the value's buffer is wiped once sent")
        #expect(try await storage.getItem("token") == "c-1")
        let info = try #require(try await storage.getItemInfo("token"))
        #expect(info.label == "from the client" && info.accessible == .whenUnlocked)
        try await storage.setItem("other", "l-1")
        #expect(try client.getItem("other") == Array("l-1".utf8))
        #expect(try client.getAllKeys() == ["other", "token"])
        #expect(try client.hasItem("token"))
        try client.removeItem("token")
        #expect(try !client.hasItem("token"))
        #expect(try client.getItem("token") == nil)
        try client.clear()
        #expect(try await storage.getAllKeys().isEmpty)
    }

    /// An error keychaind throws, and a socket with no daemon, read as the library reads them.
    @Test func itsErrorsAreTheLibrarysWordForWord() async throws {
        // Each error's description (`CODE: message (cause: …)`), from either type.
        func clientError(_ body: () throws -> Void) -> String? {
            do { try body(); return nil } catch { return String(describing: error) }
        }
        func libraryError(_ body: () async throws -> Void) async -> String? {
            do { try await body(); return nil } catch { return String(describing: error) }
        }
        let long = String(repeating: "k", count: 2000)
        let client = try KeychainClient(options: .init(service: "client.svc"), socket: daemon.socket)
        let storage = try createKeychain(.init(service: "client.svc"), configuration: daemon.configuration())
        let fromClient = clientError { var v = Array("v".utf8); try client.setItem(long, &v) }
        #expect(fromClient?.hasPrefix("INVALID_ARGUMENT: ") == true, "\(fromClient ?? "no error")")
        #expect(fromClient == (await libraryError { try await storage.setItem(long, "v") }))
        let badWord = clientError { var v = Array("v".utf8); try client.setItem("k", &v, options: WireSetOptions(accessControl: "faceID")) }
        #expect(badWord == "INVALID_ARGUMENT: The keychain service could not read the request: unknown AccessControl 'faceID'")

        let none = daemon.directory + "/none.sock"
        let gone = try KeychainClient(options: .init(service: "client.svc"), socket: none)
        let unreachable = clientError { _ = try gone.hasItem("k") }
        #expect(unreachable?.hasPrefix("HARDWARE_UNAVAILABLE: ") == true, "\(unreachable ?? "no error")")
        let library = try createKeychain(.init(service: "client.svc"), configuration: .daemon(socket: none))
        #expect(unreachable == (await libraryError { _ = try await library.hasItem("k") }))
        #expect(clientError { _ = try KeychainClient(options: .init(service: nil), socket: none) }
                == "INVALID_ARGUMENT: A storage on keychaind needs a service")
    }
}
