import Foundation
import Keychain
import KeychainStore
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// Tampered rows are DATA_CORRUPTED for that item alone; values are kept exactly; the TPM is pinned.
@Suite("Store integrity", .offThePool)
struct IntegrityTests {
    func flip(_ bytes: [UInt8], at index: Int = 0) -> [UInt8] {
        var copy = bytes
        copy[index % copy.count] ^= 0x01
        return copy
    }

    func withItems(_ body: (Fixture, Keychain, Store) async throws -> Void) async throws {
        let f = try Fixture()
        let storage = try f.storage("tamper")
        try await storage.setItem("victim", "the victim's value", options: .init(label: "label"))
        try await storage.setItem("bystander", "still readable")
        try await body(f, storage, try Store(directory: f.configuration.storeDirectory))
    }

    static let fields = ["label", "created", "modified", "writerPublic", "salt", "nonce", "ciphertext", "protection"]

    @Test(arguments: fields)
    func aFlippedByteInAnyItemFieldIsDataCorruptedForThatItemAlone(field: String) async throws {
        try await withItems { f, storage, store in
            var r = try #require(try store.item(service: "tamper", key: "victim"))
            switch field {
            case "label": r.label = "lAbel"
            case "created": r.created ^= 1
            case "modified": r.modified ^= 1
            case "writerPublic": r.writerPublic = flip(r.writerPublic, at: 5)
            case "salt": r.salt = flip(r.salt)
            case "nonce": r.nonce = flip(r.nonce)
            case "ciphertext": r.ciphertext = flip(r.ciphertext, at: 3)
            default: r.protection = "always/none"
            }
            try store.write { try $0.putItem(r) }
            await f.device.dropCaches()
            #expect(await code { try await storage.getItem("victim") } == .dataCorrupted)
            #expect(try await storage.getItem("bystander") == "still readable")
        }
    }

    @Test func swappedCiphertextsAreDataCorruptedForBothAndOthersStillRead() async throws {
        try await withItems { f, storage, store in
            try await storage.setItem("third", "third value")
            var a = try #require(try store.item(service: "tamper", key: "victim"))
            var b = try #require(try store.item(service: "tamper", key: "third"))
            swap(&a.ciphertext, &b.ciphertext)
            swap(&a.nonce, &b.nonce)
            try store.write { tx in try tx.putItem(a); try tx.putItem(b) }
            #expect(await code { try await storage.getItem("victim") } == .dataCorrupted)
            #expect(await code { try await storage.getItem("third") } == .dataCorrupted)
            #expect(try await storage.getItem("bystander") == "still readable")
        }
    }

    @Test func aRowMovedToAnotherKeyIsDataCorrupted() async throws {
        try await withItems { f, storage, store in
            var moved = try #require(try store.item(service: "tamper", key: "victim"))
            moved.key = "bystander"
            try store.write { try $0.putItem(moved) }
            #expect(await code { try await storage.getItem("bystander") } == .dataCorrupted)
        }
    }

    @Test(arguments: ["sealedPrivate", "sealedPublic", "publicKey", "policy"])
    func aTamperedWrappingKeyIsDataCorrupted(field: String) async throws {
        try await withItems { f, storage, store in
            var w = try #require(try store.wrappingKey(service: "tamper", protection: "afterFirstUnlock/none"))
            switch field {
            case "sealedPrivate": w.sealedPrivate = flip(w.sealedPrivate, at: 40)
            case "sealedPublic": w.sealedPublic = flip(w.sealedPublic, at: w.sealedPublic.count - 3)
            case "publicKey": w.publicKey = flip(w.publicKey, at: 7)
            default: w.policy = Array(String(decoding: w.policy, as: UTF8.self).replacingOccurrences(of: "afterFirstUnlock", with: "always").utf8)
            }
            try store.write { try $0.putWrappingKey(w) }
            await f.device.dropCaches()
            #expect(await code { try await storage.getItem("victim") } == .dataCorrupted)
        }
    }

    @Test func oneMebibyteValuesAndArbitraryBytesRoundTrip() async throws {
        let f = try Fixture()
        let storage = try f.storage("big")
        let value = Data(Sodium.randomBytes(1 << 20) + [0, 0xFF, 0x0A])
        try await storage.setItem("blob", value)
        await f.device.dropCaches()
        #expect(try await storage.getData("blob") == value)
        #expect(await code { try await storage.getItem("blob") } == .invalidArgument)  // not UTF-8 text
    }

    @Test func aWriteThatCannotBeProtectedLeavesTheOldValue() async throws {
        let f = try Fixture()
        let storage = try f.storage("rotate", accessible: .whenPasscodeSetThisDeviceOnly)
        try await f.device.setPasscode(bytes("2580"))
        try await storage.setItem("token", "old")
        // The same write fails when the protection can no longer be given: nothing is half-written.
        try await f.device.removePasscode(current: bytes("2580"))
        let plain = try f.storage("rotate2")
        try await plain.setItem("token", "old")
        #expect(await code { try await plain.setItem("token", "new", options: .init(accessible: .whenPasscodeSetThisDeviceOnly)) } == .passcodeNotSet)
        #expect(try await plain.getItem("token") == "old")
    }

    @Test func hasItemGetAllKeysAndInfoNeedNoTPM() async throws {
        let f = try Fixture()
        let storage = try f.storage("offline")
        try await storage.setItem("b", "2", options: .init(label: "Bee"))
        try await storage.setItem("a", "1")
        _ = await f.device.takeTPMCommandCount()
        f.tpm.stop()
        #expect(try await storage.hasItem("a"))
        #expect(try await storage.getAllKeys() == ["a", "b"])
        let info = try #require(try await storage.getItemInfo("b"))
        #expect(info.label == "Bee" && info.accessible == .afterFirstUnlock && info.securityLevel == .softwareTPM)
        #expect(await f.device.takeTPMCommandCount() == 0)
        // A read needs the TPM: with it gone, a clear HARDWARE_UNAVAILABLE.
        await f.device.dropCaches()
        #expect(await code { try await storage.getItem("a") } == .hardwareUnavailable)
    }

    @Test func aReplacedStorageRootKeyIsHardwareUnavailableNotNewKeys() async throws {
        let f = try Fixture()
        let storage = try f.storage("srk")
        try await storage.setItem("k", "v")
        let env = ["TPM2TOOLS_TCTI": f.tpm.tcti]
        let ctx = f.tpm.directory + "/other.ctx"
        #expect(try run("/usr/bin/tpm2_evictcontrol", ["-C", "o", "-c", "0x81000001"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_createprimary", ["-C", "o", "-G", "rsa", "-c", ctx], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_evictcontrol", ["-C", "o", "-c", ctx, "0x81000001"], environment: env).status == 0)
        await f.device.dropCaches()
        #expect(await code { try await storage.getItem("k") } == .hardwareUnavailable)
        #expect(await code { try await storage.setItem("new", "v", options: .init(accessible: .always)) } == .hardwareUnavailable)
        #expect(try await storage.hasItem("k"))
    }

    @Test func invalidKeysAreInvalidArgument() async throws {
        let f = try Fixture()
        let storage = try f.storage()
        #expect(await code { try await storage.setItem("", "v") } == .invalidArgument)
        #expect(await code { try await storage.getItem(String(repeating: "k", count: 2000)) } == .invalidArgument)
    }
}
