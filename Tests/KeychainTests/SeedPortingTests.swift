import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// What a user porting an app from the seed's library runs into (issue 21): each test is a call the
/// seed's documents make, and what it must answer on Linux.
@Suite("seed porting", .offThePool)
struct SeedPortingTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    /// A socket path where no keychaind listens.
    func absentSocket() -> String {
        NSTemporaryDirectory() + "keychaind-absent-\(getpid())-\(UInt32.random(in: 0 ... .max)).sock"
    }

    /// With keychaind stopped, "not available" would hide the feature for good; the seed's app
    /// retries on an error instead. The storage's and the device's check both say the service is down.
    @Test func canUseAccessControlThrowsHardwareUnavailableWhenKeychaindIsNotRunning() async {
        let configuration = KeychainConfiguration.daemon(socket: absentSocket())
        do {
            let storage = try createKeychain(.init(service: "vault"), configuration: configuration)
            let check = try await storage.canUseAccessControl(.biometryCurrentSet)
            Issue.record("the storage answered \(check)")
        } catch {
            #expect(error.code == .hardwareUnavailable, "\(error)")
        }
        do {
            let check = try await KeychainDevice(configuration: configuration).canUseAccessControl(.passcode)
            Issue.record("the device answered \(check)")
        } catch {
            #expect(error.code == .hardwareUnavailable, "\(error)")
        }
    }

    @Test func keychainctlCanUseExitsThreeWhenKeychaindIsNotRunning() throws {
        let result = try run(ctl, ["--json", "can-use", "passcode"], environment: ["KEYCHAIN_SOCKET": absentSocket()])
        #expect(result.status == 3, "exit \(result.status): \(String(decoding: result.stdout, as: UTF8.self)) \(result.stderr)")
        let body = try JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: [String: String]]
        #expect(body?["error"]?["code"] == "HARDWARE_UNAVAILABLE", "\(String(decoding: result.stdout, as: UTF8.self))")
    }

    /// A script that asked for `--json` parses stdout: a usage error is a JSON error too, exit 2.
    @Test func anUnknownOptionIsAJSONErrorWhenJSONIsAsked() throws {
        for args in [["--json", "get", "svc", "k", "--acess-control", "none"], ["ls", "svc", "--bogus", "--json"]] {
            let result = try run(ctl, ["--store", NSTemporaryDirectory() + "unused-store", "--reader", "none"] + args)
            #expect(result.status == 2, "\(args): exit \(result.status)")
            let body = try? JSONSerialization.jsonObject(with: Data(result.stdout)) as? [String: [String: String]]
            #expect(body?["error"]?["code"] == "INVALID_ARGUMENT", "\(args): \(String(decoding: result.stdout, as: UTF8.self))")
            #expect(body?["error"]?["message"]?.contains("unknown option") == true)
        }
        // Without --json the words stay on stderr, with the usage.
        let plain = try run(ctl, ["ls", "svc", "--bogus"])
        #expect(plain.status == 2 && plain.stdout.isEmpty && plain.stderr.contains("unknown option --bogus"))
    }
}

extension SeedPortingTests {
    /// The seed needs a passcode for every access control; Android invalidates every key bound to
    /// user authentication when the lock screen goes, iOS turns biometrics off with the passcode.
    @Test func removingThePasscodeEndsEveryAccessControlAndTheFingers() async throws {
        let pin = SecureBytes(copying: Array("2468".utf8))
        let d = try await SimulatedDevice(passcode: pin, fingers: ["thumb"])
        let vault = try createKeychain(.init(service: "vault"), configuration: d.configuration)
        let controls: [AccessControl] = [.biometryAny, .biometryAnyOrPasscode, .passcode, .biometryCurrentSetOrPasscode]
        for control in controls {
            try await vault.setItem(control.rawValue, "v", options: .init(accessControl: control))
        }
        try await vault.setItem("plain", "v")
        try await d.device.removePasscode(current: pin)
        #expect(try await d.device.enrolledFingers().isEmpty)
        for control in controls {
            // The finger the user still has, or the passcode they had.
            d.answers.push(control.usesBiometry ? .finger("thumb") : .passcode(SecureBytes(copying: Array("2468".utf8))))
            do {
                let value = try await vault.getItem(control.rawValue)
                Issue.record("\(control) read \(value ?? "nil") after the passcode was removed")
            } catch {
                #expect(error.code == .keyInvalidated, "\(control): \(error)")
            }
            #expect(try await !vault.hasItem(control.rawValue), "\(control) was not removed")
        }
        #expect(try await vault.getItem("plain") == "v")
    }
}
