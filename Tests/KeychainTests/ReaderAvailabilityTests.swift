import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing
import TPM2

/// Only an enrollment change of the reader an item was sealed to invalidates it; a reader that is
/// missing, misconfigured or another one keeps biometric items (and their keys) intact.
@Suite("A missing or other reader keeps biometric items", .offThePool)
struct ReaderAvailabilityTests {
    static let pin = AccessControlTests.pin
    typealias Device = AccessControlTests.Device

    /// The same device seen through a reader directory that is not the one its items were written with.
    static func misconfigured(_ d: Device, _ which: String) async throws -> KeychainConfiguration {
        var configuration = d.configuration
        switch which {
        case "none": configuration.readerDirectory = nil
        case "nonexistent": configuration.readerDirectory = "/nonexistent/reader"
        default:
            // Another reader, with a finger of the same name: its own TPM key.
            configuration.readerDirectory = d.tpm.directory + "/other-reader"
            try await KeychainDevice(configuration: configuration).enrollFinger("thumb", passcode: bytes(pin))
        }
        return configuration
    }

    @Test(arguments: ["none", "nonexistent", "other"])
    func aReadWithAWrongReaderIsNotAvailableAndKeepsTheItem(reader: String) async throws {
        let d = try await Device()
        let wrong = try await Self.misconfigured(d, reader)
        for control in AccessControlTests.biometric {
            let right = try d.storage(control)
            try await right.setItem("k", "v")
            let storage = try createKeychain(right.options, configuration: wrong)
            if control.allowsPasscode {
                // The passcode branch still serves the read; only the passcode is offered.
                d.answers.push(.passcode(bytes(Self.pin)))
                #expect(try await storage.getItem("k") == "v", "\(control)")
                #expect(d.answers.requests.last?.methods == [.passcode])
            } else {
                let asked = d.answers.requests.count
                #expect(await code { try await storage.getItem("k") } == .biometryNotAvailable, "\(control)")
                #expect(d.answers.requests.count == asked, "no prompt")
            }
            #expect(try await storage.hasItem("k"), "\(control): the item was removed")
            // The right reader still opens it: nothing in the store or the TPM was touched.
            await d.device.dropCaches()
            d.answers.push(.finger("thumb"))
            #expect(try await right.getItem("k") == "v", "\(control)")
        }
    }

    @Test(arguments: ["none", "nonexistent", "other"])
    func aWriteWithAWrongReaderNeverDropsTheExistingItems(reader: String) async throws {
        let d = try await Device()
        let wrong = try await Self.misconfigured(d, reader)
        for control in AccessControlTests.biometric {
            let right = try d.storage(control)
            try await right.setItem("old", "v")
            let storage = try createKeychain(right.options, configuration: wrong)
            if control == .biometryAnyOrPasscode {
                try await storage.setItem("new", "w")  // under the existing key: its passcode branch
                d.answers.push(.passcode(bytes(Self.pin)))
                #expect(try await right.getItem("new") == "w")
            } else {
                // A reader directory without a reader is one with no finger enrolled.
                let refused = await code { try await storage.setItem("new", "w") }
                #expect(refused == (reader == "nonexistent" ? .biometryNotEnrolled : .biometryNotAvailable), "\(control)")
                #expect(try await storage.hasItem("new") == false)
            }
            await d.device.dropCaches()
            d.answers.push(.finger("thumb"))
            #expect(try await right.getItem("old") == "v", "\(control): the old item was dropped")
        }
    }

    /// The reader's directory says the set changed, but the TPM no longer holds the key the item was
    /// sealed to: that is not the reader the item knew, so the item is kept.
    @Test func aChangedSetIsInvalidatingOnlyWhileTheTPMHoldsTheReadersKey() async throws {
        let d = try await Device()
        let current = try d.storage(.biometryCurrentSet)
        try await current.setItem("k", "v")
        let handle = try #require(FingerprintReader(directory: d.configuration.readerDirectory!).state?.tpmHandle)
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        let evict = try run("/usr/bin/tpm2_evictcontrol", ["-C", "o", "-c", String(format: "0x%08x", handle)],
                            environment: ["TPM2TOOLS_TCTI": d.tpm.tcti])
        #expect(evict.status == 0, "\(evict.stderr)")
        #expect(await code { try await current.getItem("k") } == .biometryNotAvailable)
        #expect(try await current.hasItem("k"))
    }

    @Test func theSameReaderWithAnotherSetStillInvalidatesCurrentSet() async throws {
        let d = try await Device()
        let current = try d.storage(.biometryCurrentSetOrPasscode)
        try await current.setItem("k", "v")
        try await d.device.enrollFinger("index", passcode: bytes(Self.pin))
        #expect(await code { try await current.getItem("k") } == .keyInvalidated)
        #expect(try await current.hasItem("k") == false)
    }

    /// keychainctl as a script runs it, with KEYCHAIN_READER=none or a mistyped --reader.
    @Test func keychainctlWithAMissingReaderKeepsBiometricItems() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        func cli(_ args: [String], input: [UInt8] = [], env: [String: String] = [:]) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, ["--store", store, "--tcti", tpm.tcti] + args, input: input, environment: env)
        }
        #expect(try cli(["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(["reader", "enroll", "thumb"], input: Array("2468\n".utf8)).status == 0)
        for control in ["biometryAny", "biometryCurrentSet"] {
            #expect(try cli(["set", control, "k", "--access-control", control], input: Array("secret".utf8)).status == 0)
            let none = try cli(["get", control, "k", "--touch", "thumb"], env: ["KEYCHAIN_READER": "none"])
            #expect(none.status == 3 && none.stderr.contains("BIOMETRY_NOT_AVAILABLE"), "\(none.stderr)")
            let missing = try cli(["--reader", "/nonexistent", "get", control, "k", "--touch", "thumb"])
            #expect(missing.status == 3 && missing.stderr.contains("BIOMETRY_NOT_AVAILABLE"), "\(missing.stderr)")
            #expect(try cli(["has", control, "k"]).status == 0, "\(control) was removed")
            #expect(try cli(["get", control, "k", "--touch", "thumb"]).stdout == Array("secret".utf8))
        }
    }
}
