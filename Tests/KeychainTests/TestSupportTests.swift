import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// KeychainTestSupport as the testing guide describes it: the starting state, the default
/// configuration redirected per task, the environment for child processes, the folders of dead runs.
@Suite(.offThePool) struct TestSupportTests {
    /// The guide states the starting state exactly; this holds it to it.
    @Test func aSimulatedDeviceStartsUnlockedWithItsPasscodeAndFingers() async throws {
        let d = try await SimulatedDevice(passcode: bytes("2468"), fingers: ["thumb"])
        let status = try await d.device.status()
        #expect(status.passcodeSet && status.lockState == .unlocked)
        #expect(try await d.device.enrolledFingers() == ["thumb"])
        #expect(d.answers.requests.isEmpty)
        let bare = try await SimulatedDevice()
        let none = try await bare.device.status()
        #expect(!none.passcodeSet && none.lockState == .unlocked)
        #expect(try await bare.device.enrolledFingers() == [])
        #expect(bare.tpm.directory.hasPrefix(FileManager.default.temporaryDirectory.path + "/keychain-swtpm-"))
    }

    /// The default `keychain` and `createKeychain()` inside `asDefault` use the device; two devices
    /// used at once in two tasks each keep their own; outside, the environment's default is back.
    @Test func theDefaultKeychainFollowsTheTaskDefault() async throws {
        let one = try await SimulatedDevice(), two = try await SimulatedDevice()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (d, value) in [(one, "1"), (two, "2")] {
                group.addTask {
                    try await d.asDefault {
                        #expect(try keychain.configuration.storeDirectory == d.configuration.storeDirectory)
                        try await keychain.setItem("k", value)
                        try await createKeychain(.init(service: "app.other")).setItem("k", value)
                    }
                }
            }
            try await group.waitForAll()
        }
        for (d, value) in [(one, "1"), (two, "2")] {
            let service = try #require(d.configuration.applicationIdentifier)
            #expect(try await createKeychain(.init(service: service), configuration: d.configuration).getItem("k") == value)
            #expect(try await createKeychain(.init(service: "app.other"), configuration: d.configuration).getItem("k") == value)
        }
        #expect(KeychainConfiguration.default.storeDirectory != one.configuration.storeDirectory)
        #expect(KeychainConfiguration.default.storeDirectory != one.configuration.storeDirectory)
    }

    /// An executable in a folder of PATH is found there, before the fallbacks; empty entries are
    /// skipped. (scripts/test-outside-package.sh finds keychaind so from a user's own package.)
    @Test func anExecutableOnPathIsFound() throws {
        let folder = FileManager.default.temporaryDirectory.path + "/keychain-path-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        #expect(Processes.findExecutable("keychain-probe", searchPath: "/nonexistent::\(folder)") == nil)
        #expect(FileManager.default.createFile(atPath: folder + "/keychain-probe", contents: Data("#!/bin/sh\n".utf8),
                                               attributes: [.posixPermissions: 0o755]))
        #expect(Processes.findExecutable("keychain-probe", searchPath: "/nonexistent::\(folder)") == folder + "/keychain-probe")
        #expect(Processes.findExecutable("sh", searchPath: "\(folder):/bin") == "/bin/sh")
        #expect(Processes.findExecutable("keychain-probe", searchPath: "") == nil)
    }

    /// A child process given `environment` uses the device's TPM, store and reader.
    @Test func theEnvironmentPointsAChildProcessAtTheDevice() async throws {
        let d = try await SimulatedDevice(passcode: bytes("2468"), fingers: ["thumb"])
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let set = try run(ctl, ["set", "app.child", "k"], input: Array("from-child".utf8), environment: d.environment)
        #expect(set.status == 0, "\(set.stderr)")
        #expect(try await createKeychain(.init(service: "app.child"), configuration: d.configuration).getItem("k") == "from-child")
        let status = try run(ctl, ["--json", "status"], environment: d.environment)
        #expect(String(decoding: status.stdout, as: UTF8.self).contains("\"passcodeSet\":true"), "\(status.stderr)")
        let fingers = try run(ctl, ["reader", "list"], environment: d.environment)
        #expect(String(decoding: fingers.stdout, as: UTF8.self).contains("thumb"), "\(fingers.stderr)")
    }

    /// A run killed with SIGKILL leaves its folder (no deinit ran); the next start removes it, and
    /// keeps the folders of live processes and of other users.
    @Test func foldersOfKilledRunsAreRemovedAtTheNextStart() throws {
        let temporary = try temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        var environment = ProcessInfo.processInfo.environment
        environment["TMPDIR"] = temporary
        let (pid, said) = try startBenchUntilItNamesItsStore(environment: environment)
        #expect(kill(pid, SIGKILL) == 0)
        _ = Processes.wait(pid)
        let left = try FileManager.default.contentsOfDirectory(atPath: temporary).filter { $0.hasPrefix("keychain-swtpm-") }
        #expect(left.count == 1, "keychain-bench said: \(said)")

        // A live process's folder (ours) and another user's folder of a dead process stay.
        let live = try SoftwareTPM()
        let copy = temporary + "/keychain-swtpm-live"
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: false)
        try FileManager.default.copyItem(atPath: live.directory + "/owner", toPath: copy + "/owner")
        let others = temporary + "/keychain-swtpm-nobody"
        try FileManager.default.createDirectory(atPath: others, withIntermediateDirectories: false)
        try FileManager.default.copyItem(atPath: temporary + "/" + left[0] + "/owner", toPath: others + "/owner")
        #expect(chown(others, 65534, 65534) == 0)

        SoftwareTPM.removeStaleDirectories(in: temporary)
        let after = try FileManager.default.contentsOfDirectory(atPath: temporary).sorted()
        #expect(after == ["keychain-swtpm-live", "keychain-swtpm-nobody"])
    }

    /// `SoftwareTPM()` itself cleans its temporary directory: a folder whose owner was reaped is gone.
    @Test func startingATPMRemovesAFolderOfADeadProcess() throws {
        let dead = try #require(Processes.spawn("/bin/true", ["true"]))
        let owner = try procText("/proc/self/stat")  // a start time; the pid is what is dead
        _ = Processes.wait(dead)
        let started = owner[owner.index(after: owner.lastIndex(of: ")")!)...].split(separator: " ")[19]
        let folder = FileManager.default.temporaryDirectory.path + "/keychain-swtpm-dead-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder + "/state", withIntermediateDirectories: true)
        try "\(dead) \(started)\n".write(toFile: folder + "/owner", atomically: false, encoding: .utf8)
        _ = try SoftwareTPM()
        #expect(!FileManager.default.fileExists(atPath: folder))
    }
}
