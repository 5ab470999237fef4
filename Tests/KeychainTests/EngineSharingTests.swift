import Foundation
@testable import Keychain
@testable import KeychainEngine
import SecureMemory
import Testing

/// One store has one engine per process: while it lives (while a storage or device of the store
/// does), a configuration that would need another TPM, owner authorization, PCR selection,
/// passcode limit or timeout is refused, not silently given the first's.
@Suite struct EngineSharingTests {
    private func base(_ directory: String) -> KeychainConfiguration {
        var configuration = KeychainConfiguration(storeDirectory: directory, tpm: .tcti("swtpm:host=127.0.0.1,port=1"))
        configuration.applicationIdentifier = "engine-sharing"  // the default service of `Keychain(configuration:)`
        return configuration
    }

    @Test(arguments: ["tpm", "ownerAuthorization", "pcrSelection", "passcodeRetryLimit", "tpmTimeout"])
    func aSecondConfigurationWithAnotherEngineSettingIsRefused(setting: String) async throws {
        let directory = NSTemporaryDirectory() + "engine-sharing-\(UUID().uuidString)"
        let first = try Keychain(configuration: base(directory))
        defer { withExtendedLifetime(first) {} }
        var other = base(directory + "/.")  // the same store, spelled differently
        switch setting {
        case "tpm": other.tpm = .embedded
        case "ownerAuthorization": other.ownerAuthorization = SecureBytes(copying: Array("owner".utf8))
        case "pcrSelection": other.pcrSelection = [0, 7]
        case "passcodeRetryLimit": other.passcodeRetryLimit = 3
        default: other.tpmTimeout = .seconds(5)
        }
        do {
            _ = try Keychain(configuration: other)
            Issue.record("a Keychain with another \(setting) was made")
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("another \(setting):"))
        }
        // The device refuses at its first call, before touching the store or the TPM.
        do {
            _ = try await KeychainDevice(configuration: other).status()
            Issue.record("a device with another \(setting) answered")
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("another \(setting):"))
        }
        #expect(!FileManager.default.fileExists(atPath: directory))
    }

    @Test func perCallSettingsMayDiffer() throws {
        let directory = NSTemporaryDirectory() + "engine-sharing-\(UUID().uuidString)"
        let first = try Keychain(configuration: base(directory))
        var other = base(directory)
        other.readerDirectory = directory + "-reader"
        other.authenticator = ScriptedAuthenticator()
        other.pkcs11URI = "pkcs11:token=T?module-path=/nonexistent.so"
        other.applicationIdentifier = "another.app"
        let second = try Keychain(configuration: other)
        let engine = try #require(first.engine, "a storage without keychaind has an engine in this process")
        #expect(engine === second.engine)
    }
}
