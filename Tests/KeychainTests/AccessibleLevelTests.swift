import Foundation
import Keychain
import KeychainTestThreads
import SecureMemory
import Testing

/// Every `Accessible` level through reboot, unlock, lock and PCR change, on a real swtpm.
@Suite("Accessible levels on a real TPM", .offThePool)
struct AccessibleLevelTests {
    static let passcode = "4826"

    /// Writes one item per level (after setting a passcode so whenPasscodeSet can be written).
    func writeAll(_ f: Fixture) async throws -> [Accessible: Keychain] {
        try await f.device.setPasscode(bytes(Self.passcode))
        var stores: [Accessible: Keychain] = [:]
        for level in Accessible.allCases {
            let store = try f.storage("svc.\(level.rawValue)", accessible: level)
            try await store.setItem("secret", "value of \(level.rawValue)")
            stores[level] = store
        }
        return stores
    }

    @Test func everyLevelRoundTripsWhileUnlocked() async throws {
        let f = try Fixture()
        let stores = try await writeAll(f)
        await f.device.dropCaches()
        for (level, store) in stores {
            #expect(try await store.getItem("secret") == "value of \(level.rawValue)")
            #expect(try await store.getItemInfo("secret")?.accessible == level)
        }
    }

    @Test func afterRebootOnlyAlwaysLevelsReadUntilTheFirstUnlock() async throws {
        let f = try Fixture()
        let stores = try await writeAll(f)
        try await f.reboot()
        #expect(try await f.device.status().lockState == .beforeFirstUnlock)
        for (level, store) in stores {
            let result = await code { try await store.getItem("secret") }
            if level.availability == .always {
                #expect(result == nil, "\(level) must read before the first unlock")
            } else {
                #expect(result == .interactionNotAllowed, "\(level) must not read before the first unlock")
            }
        }
        try await f.device.unlock(passcode: bytes(Self.passcode))
        for (level, store) in stores {
            #expect(try await store.getItem("secret") == "value of \(level.rawValue)")
        }
    }

    @Test func lockHidesOnlyWhenUnlockedLevels() async throws {
        let f = try Fixture()
        let stores = try await writeAll(f)
        try await f.device.lock()
        await f.device.dropCaches()
        #expect(try await f.device.status().lockState == .locked)
        for (level, store) in stores {
            let result = await code { try await store.getItem("secret") }
            if level.availability == .whenUnlocked {
                #expect(result == .interactionNotAllowed, "\(level) must not read while locked")
            } else {
                #expect(result == nil, "\(level) must read while locked")
            }
        }
        try await f.device.unlock(passcode: bytes(Self.passcode))
        for store in stores.values { #expect(try await store.getItem("secret") != nil) }
    }

    @Test func lockEvictsWhenUnlockedKeysCachedInThisProcess() async throws {
        let f = try Fixture()
        let store = try f.storage("cached", accessible: .whenUnlocked)
        try await f.device.setPasscode(bytes(Self.passcode))
        try await store.setItem("k", "v")
        #expect(try await store.getItem("k") == "v")  // now cached
        try await f.device.lock()
        #expect(await code { try await store.getItem("k") } == .interactionNotAllowed)
    }

    @Test func wrongPasscodeDoesNotUnlock() async throws {
        let f = try Fixture()
        let stores = try await writeAll(f)
        try await f.device.lock()
        await f.device.dropCaches()
        #expect(await code { try await f.device.unlock(passcode: bytes("0000")) } == .authenticationFailed)
        #expect(try await f.device.status().lockState == .locked)
        #expect(await code { try await stores[.whenUnlocked]!.getItem("secret") } == .interactionNotAllowed)
    }

    @Test func pcrChangeGivesDeviceStateChangedForThisDeviceOnlyAndKeepsTheItem() async throws {
        let f = try Fixture()
        let stores = try await writeAll(f)
        try f.extendPCR(7)
        await f.device.dropCaches()
        for (level, store) in stores {
            let result = await code { try await store.getItem("secret") }
            if level.isThisDeviceOnly {
                #expect(result == .deviceStateChanged, "\(level)")
                #expect(try await store.hasItem("secret"))
            } else {
                #expect(result == nil, "\(level) is not bound to PCRs")
            }
        }
        // A reboot restores PCR 7 to its initial value: the items open again.
        try await f.reboot()
        try await f.device.unlock(passcode: bytes(Self.passcode))
        for store in stores.values { #expect(try await store.getItem("secret") != nil) }
    }

    @Test func withoutPasscodeTheDeviceCountsAsUnlockedAfterReboot() async throws {
        let f = try Fixture()
        let store = try f.storage("nopin", accessible: .whenUnlockedThisDeviceOnly)
        try await store.setItem("k", "v")
        try await f.reboot()
        #expect(try await store.getItem("k") == "v")
    }

    @Test func whenPasscodeSetNeedsAPasscodeAndDiesWithIt() async throws {
        let f = try Fixture()
        let store = try f.storage("pin", accessible: .whenPasscodeSetThisDeviceOnly)
        #expect(await code { try await store.setItem("k", "v") } == .passcodeNotSet)
        #expect(try await store.hasItem("k") == false)
        try await f.device.setPasscode(bytes(Self.passcode))
        try await store.setItem("k", "v")
        #expect(try await store.getItem("k") == "v")
        let other = try f.storage("keep", accessible: .afterFirstUnlock)
        try await other.setItem("k", "kept")
        try await f.device.removePasscode(current: bytes(Self.passcode))
        #expect(try await store.hasItem("k") == false)
        #expect(try await store.getItem("k") == nil)
        #expect(try await other.getItem("k") == "kept")
        #expect(await code { try await store.setItem("k", "v2") } == .passcodeNotSet)
        // A new passcode gives new keys; the old ones stay dead.
        try await f.device.setPasscode(bytes("9999"))
        try await store.setItem("k", "v3")
        await f.device.dropCaches()
        #expect(try await store.getItem("k") == "v3")
    }

    @Test func passcodeChangeNeedsTheCurrentOne() async throws {
        let f = try Fixture()
        try await f.device.setPasscode(bytes(Self.passcode))
        #expect(await code { try await f.device.setPasscode(bytes("1234")) } == .invalidArgument)
        #expect(await code { try await f.device.changePasscode(from: bytes("0000"), to: bytes("1234")) } == .authenticationFailed)
        try await f.device.changePasscode(from: bytes(Self.passcode), to: bytes("1234"))
        try await f.device.lock()
        #expect(await code { try await f.device.unlock(passcode: bytes(Self.passcode)) } == .authenticationFailed)
        try await f.device.unlock(passcode: bytes("1234"))
        #expect(try await f.device.status().lockState == .unlocked)
    }

    /// With the default limit (keychaind has no setting for another, so the test is the same both ways).
    @Test func theTPMLimitsWrongPasscodes() async throws {
        let f = try Fixture()
        let device = f.device
        try await device.setPasscode(bytes(Self.passcode))
        try await device.lock()
        for _ in 0..<KeychainConfiguration(storeDirectory: "/", tpm: .embedded).passcodeRetryLimit {
            #expect(await code { try await device.unlock(passcode: bytes("0000")) } == .authenticationFailed)
        }
        // The limit is reached: even the right passcode is refused until the owner resets the count.
        #expect(await code { try await device.unlock(passcode: bytes(Self.passcode)) } == .lockout)
        try await device.resetPasscodeTries()
        try await device.unlock(passcode: bytes(Self.passcode))
    }
}

import KeychainTestSupport
