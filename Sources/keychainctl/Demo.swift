import Foundation
import Keychain
import SecureMemory

/// `keychainctl demo`: the seed's sign-in flow, as far as this version reaches, on a fresh store
/// and a fresh embedded software TPM, printing each step and what the TPM did.
struct Demo {
    let json: Bool
    private let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("keychain-demo-\(getpid())").path

    func run() async throws -> Exit {
        defer {
            EmbeddedTPM.stop(storeDirectory: directory)
            try? FileManager.default.removeItem(atPath: directory)
        }
        let configuration = KeychainConfiguration(storeDirectory: directory, tpm: .embedded)
        let device = KeychainDevice(configuration: configuration)
        let session = try createKeychain(.init(service: "auth.session"), configuration: configuration)

        say("Keychain for Linux: the sign-in flow on a fresh store (\(directory))")
        say("with an embedded software TPM (swtpm): no hardware protection, the same TPM commands.\n")

        try await step("Provision: SRK at 0x81000001, device-lock NV indices", device) {
            let status = try await device.initialize()
            return "TPM \(status.tpm), security level \(status.securityLevel.rawValue)"
        }

        try await step("Sign in with a password: store the access token (afterFirstUnlock, no prompt)", device) {
            try await session.setItem("accessToken", "at-1-\(UUID().uuidString.prefix(8))")
            return "session.setItem('accessToken') done"
        }

        let offer = await canUseAccessControl(.biometryCurrentSet)
        let vaultOptions: KeychainOptions
        if offer.available {
            vaultOptions = .init(service: "auth.vault", accessible: .whenUnlockedThisDeviceOnly, accessControl: .biometryCurrentSet,
                                 prompt: .init(title: "Sign in to Example", cancel: "Use password"))
        } else {
            vaultOptions = .init(service: "auth.vault", accessible: .whenUnlockedThisDeviceOnly)
        }
        say("• Offer fingerprint sign-in? canUseAccessControl(biometryCurrentSet) = available: \(offer.available)"
            + (offer.reason.map { ", reason: \($0.rawValue)" } ?? "")
            + (offer.available ? "" : "\n    no reader on this device: the vault is whenUnlockedThisDeviceOnly, bound to this TPM and PCR 7"))
        let vault = try createKeychain(vaultOptions, configuration: configuration)

        try await step("Set the device passcode (the TPM keeps it on a PIN index with its own retry limit)", device) {
            try await device.setPasscode(SecureBytes(copying: Array("2468".utf8)))
            return "passcode set"
        }

        try await step("Store the refresh token in the vault with the username as label (no prompt)", device) {
            try await vault.setItem("refreshToken", "rt-1", options: .init(label: "ivan@example.com"))
            return "vault.setItem('refreshToken', label: 'ivan@example.com')"
        }

        try await step("At launch: hasItem, then getItemInfo for 'Continue as …' (no prompt, no TPM)", device) {
            let has = try await vault.hasItem("refreshToken")
            let info = try await vault.getItemInfo("refreshToken")
            return "hasItem = \(has); Continue as \(info?.label ?? "?") (\(info?.accessible.rawValue ?? ""), \(info?.securityLevel.rawValue ?? ""))"
        }

        try await step("Unlock the refresh token (cold: unsealed by the TPM), refresh, rotate atomically", device) {
            let token = try await vault.getItem("refreshToken") ?? "nil"
            try await session.setItem("accessToken", "at-2")
            try await vault.setItem("refreshToken", "rt-2")
            let again = try await vault.getItem("refreshToken") ?? "nil"
            return "read \(token), wrote rt-2, read back \(again) (warm: no TPM command)"
        }

        try await step("Lock the device", device) {
            try await device.lock()
            return "locked (anyone may lock; only the passcode unlocks)"
        }

        try await step("Read while locked: the vault is whenUnlocked, the session token afterFirstUnlock", device) {
            let vaultRead = await outcome { try await vault.getItem("refreshToken") }
            let sessionRead = await outcome { try await session.getItem("accessToken") }
            return "vault: \(vaultRead)\n    session: \(sessionRead)"
        }

        try await step("Unlock with a wrong passcode, then the right one", device) {
            let wrong = await outcome { try await device.unlock(passcode: SecureBytes(copying: Array("1111".utf8))); return "unlocked" }
            try await device.unlock(passcode: SecureBytes(copying: Array("2468".utf8)))
            let read = try await vault.getItem("refreshToken") ?? "nil"
            return "wrong: \(wrong)\n    right: unlocked, vault reads \(read)"
        }

        try await step("Reboot the TPM (restart swtpm) and start the app again", device) {
            EmbeddedTPM.reboot(storeDirectory: directory)
            await device.dropCaches()
            let read = await outcome { try await session.getItem("accessToken") }
            return "before the first unlock, the session token: \(read)"
        }

        try await step("First unlock after the reboot", device) {
            try await device.unlock(passcode: SecureBytes(copying: Array("2468".utf8)))
            let read = try await session.getItem("accessToken") ?? "nil"
            return "session token: \(read)"
        }

        try await step("Sign out: remove the access token, clear the vault (no prompt)", device) {
            try await session.removeItem("accessToken")
            try await vault.clear()
            return "session has accessToken: \(try await session.hasItem("accessToken")); vault keys: \(try await vault.getAllKeys())"
        }
        say("\nDone. The store and the software TPM of this demo were removed.")
        return .ok
    }

    private func say(_ text: String) { print(text); fflush(nil) }

    private func step(_ title: String, _ device: KeychainDevice, _ body: () async throws -> String) async throws {
        _ = await device.takeTPMCommandCount()
        let start = Date()
        let result = try await body()
        let ms = Date().timeIntervalSince(start) * 1000
        let commands = await device.takeTPMCommandCount()
        say("• \(title)\n    \(result)\n    [\(commands) TPM commands, \(String(format: "%.1f", ms)) ms]")
    }

    private func outcome(_ body: () async throws -> String?) async -> String {
        do { return "read \(try await body() ?? "nil")" } catch let error as KeychainError {
            return "\(error.code.rawValue): \(error.message)"
        } catch { return "\(error)" }
    }
}
