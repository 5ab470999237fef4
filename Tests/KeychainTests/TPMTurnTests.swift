import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Synchronization
import Testing
import TPM2

/// A TPM without a resource manager (swtpm, `/dev/tpm0`) shared by processes that may die at any
/// command: they take turns (a lock per TPM) and each turn starts by flushing what the dead left.
@Suite("TPM turns and leftovers", .offThePool)
struct TPMTurnTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    /// The embedded TPM, as `keychainctl` finds it with no TCTI configured.
    func embedded(_ store: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:]) throws
        -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", store] + args, input: input,
                environment: ["KEYCHAIN_TCTI": "", "TPM2TCTI": ""].merging(environment) { $1 })
    }

    /// Without turns, concurrent processes failed up to a quarter of their calls (0x902: out of
    /// object memory, or one process's command between another's). 8 processes × 8 reads here;
    /// docs/performance.md has the 8 × 50 run.
    @Test func concurrentReadersOnTheEmbeddedTPMNeverFail() throws {
        let tpm = try SoftwareTPM()  // only for its temporary directory
        let store = tpm.directory + "/store"
        // Started here, not by a keychainctl child: its daemon would keep the test's pipes to that child open.
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        _ = try EmbeddedTPM.ensureRunning(storeDirectory: store)
        defer { EmbeddedTPM.stop(storeDirectory: store) }
        #expect(try embedded(store, ["set", "svc", "k"], input: Array("value".utf8)).status == 0)
        #expect(try embedded(store, ["set", "svc", "d", "--accessible", "whenUnlockedThisDeviceOnly"], input: Array("device".utf8)).status == 0)
        let failures = Mutex<[String]>([])
        // Eight threads, not concurrentPerform: that runs only as many at once as there are cores.
        let done = DispatchGroup()
        for p in 0..<8 {
            done.enter()
            Thread { defer { done.leave() }; for r in 0..<8 {
                let (key, value) = (p + r) % 2 == 0 ? ("k", "value") : ("d", "device")
                do {
                    let got = try embedded(store, ["--reader", "none", "get", "svc", key])
                    if got.stdout != Array(value.utf8) { failures.withLock { $0.append("\(p)/\(r): \(got.stderr)") } }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            } }.start()
        }
        done.wait()
        #expect(failures.withLock { $0 } == [])
    }

    /// Each read killed mid-way used to leak its session (and object): after three, every read,
    /// unlock and first write failed with 0x903 until a TPM reboot. Kills at every command of a read.
    @Test func readsKilledMidwayLeaveNothingThatStopsTheNextCommand() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        func cli(_ args: [String], input: [UInt8] = [], abortAfter: Int? = nil) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, ["--store", store, "--tcti", tpm.tcti, "--reader", "none"] + args, input: input,
                    environment: abortAfter.map { ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\($0)"] } ?? [:])
        }
        #expect(try cli(["set", "svc", "k", "--accessible", "whenUnlockedThisDeviceOnly"], input: Array("value".utf8)).status == 0)
        #expect(try cli(["get", "svc", "k"]).stdout == Array("value".utf8))
        let context = try TPMContext(device: tpm.device)
        func leftovers() throws -> [UInt32] { try context.handles(from: 0x0200_0000) + context.handles(from: 0x8000_0000) }
        var leftBehind = 0
        for kill in 0..<30 {
            // A read is about 8 commands: the leftover check, the passcode mark, StartAuthSession, Load, the policy, Unseal, FlushContext.
            let killed = try cli(["get", "svc", "k"], abortAfter: 2 + kill % 7)
            #expect(killed.status == 134, "kill \(kill): the test hook did not end the read (\(killed.stderr))")
            if try !leftovers().isEmpty { leftBehind += 1 }
        }
        #expect(leftBehind >= 10, "the kills should have left sessions or objects in the TPM")
        #expect(try cli(["get", "svc", "k"]).stdout == Array("value".utf8))
        #expect(try cli(["set", "new-service", "k"], input: [1]).status == 0)
        #expect(try cli(["get", "new-service", "k"]).stdout == [1])
        #expect(try cli(["lock"]).status == 0)
        #expect(try cli(["unlock"], input: []).status == 0)
        #expect(try cli(["status"]).status == 0)
        #expect(try leftovers() == [])
    }

    /// A turn that directly follows this engine's last (which ended well) skips the leftover check: no
    /// process can have been killed in between. One that follows another process's turn makes it, and
    /// flushes what that process left when it was killed. The lock's mark tells them apart
    /// (`TPMTurn.mark`): with the mark ignored, the killed process's session is still in the TPM after
    /// the read.
    @Test func onlyATurnThatFollowsAnotherProcesssChecksForLeftovers() async throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let configuration = tpm.configuration(store: store)
        let keychain = try createKeychain(.init(service: "svc"), configuration: configuration)
        let device = KeychainDevice(configuration: configuration)
        try await keychain.setItem("k", "value")
        func coldRead() async throws -> Int {
            await device.dropCaches()
            _ = await device.takeTPMCommandCount()
            #expect(try await keychain.getItem("k") == "value")
            return await device.takeTPMCommandCount()
        }
        _ = try await coldRead()  // the engine's first TPM operation also reads the passcode mark and the rollback counter
        let followingOurs = try await coldRead()
        #expect(try await coldRead() == followingOurs)

        // Another process's turn, killed at the first command after which it holds a session in the TPM.
        let context = try TPMContext(device: tpm.device)
        for commands in 2...12 where try context.handles(from: 0x0200_0000).isEmpty {
            let killed = try run(ctl, ["--store", store, "--tcti", tpm.tcti, "--reader", "none", "get", "svc", "k"],
                                 environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(commands)"])
            #expect(killed.status == 134, "the test hook did not end the read: \(killed.stderr)")
        }
        #expect(try context.handles(from: 0x0200_0000) != [], "no killed read left a session")

        let followingAnother = try await coldRead()
        #expect(try context.handles(from: 0x0200_0000) + context.handles(from: 0x8000_0000) == [], "leftovers after the read")
        // The leftover check (one GetCapability when nothing is left) and the flush of what was.
        #expect(followingAnother > followingOurs, "\(followingAnother) commands after another process's turn, \(followingOurs) after ours")
        #expect(try await coldRead() == followingOurs)
    }

    /// Another user made the directory where the TPM lock would go (`$XDG_RUNTIME_DIR/keychain`,
    /// or `/tmp/keychain-<uid>`), open to all: the lock goes to the store instead, nothing is made
    /// in the planted directory, and the keychain works. The control: our own directory gets it.
    @Test func aLockDirectoryAnotherUserMadeIsNotUsed() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let planted = tpm.directory + "/xdg-planted", ours = tpm.directory + "/xdg-ours"
        for dir in [planted + "/keychain", ours] {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        }
        chmod(tpm.directory + "/xdg-planted", 0o755)
        chown(planted + "/keychain", 65534, 65534)
        chmod(planted + "/keychain", 0o777)
        let binary = ctl
        func keychainctl(_ xdg: String, _ args: [String], _ input: String = "") throws -> Int32 {
            try run(binary, ["--store", store, "--tcti", tpm.tcti] + args, input: Array(input.utf8),
                    environment: ["XDG_RUNTIME_DIR": xdg]).status
        }
        #expect(try keychainctl(planted, ["set", "s", "k", "--accessible", "always"], "v") == 0)
        #expect(try keychainctl(planted, ["get", "s", "k"]) == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: planted + "/keychain") == [], "a lock in the planted directory")
        #expect(try FileManager.default.contentsOfDirectory(atPath: store).contains { $0.hasPrefix("tpm-") && $0.hasSuffix(".lock") })
        #expect(try keychainctl(ours, ["get", "s", "k"]) == 0)
        #expect(try FileManager.default.contentsOfDirectory(atPath: ours + "/keychain").contains { $0.hasSuffix(".lock") })
    }

    /// Each test's software TPM is a TPM of its own, and the lock file of its turns
    /// (`tpm-<hash of the TCTI>.lock` in `/tmp/keychain-<uid>`) outlived it: 20,898 of them were left
    /// on the shared machine. Three TPMs, each given a turn by a keychainctl child and one in this
    /// process: while they live their three locks are there; released, none is. A run killed with
    /// its TPM (its folder left, its owner gone) loses its lock with the folder at the next start.
    @Test func theLockFilesOfATestsTPMsGoAwayWithThem() async throws {
        var locks: [String] = []
        do {
            var tpms: [SoftwareTPM] = []
            for _ in 0..<3 {
                let tpm = try SoftwareTPM()
                #expect(try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none",
                                      "set", "s", "k", "--accessible", "always"], input: [1]).status == 0)
                let keychain = try createKeychain(.init(service: "s"), configuration: tpm.configuration())
                #expect(try await keychain.getItem("k") == "\u{1}")
                let lock = try #require(TPMTurn.userLock(of: tpm.device), "this user has no lock directory")
                locks.append(lock)
                tpms.append(tpm)
            }
            withExtendedLifetime(tpms) {
                #expect(locks.filter { FileManager.default.fileExists(atPath: $0) }.count == 3, "the turns took no lock")
            }
        }
        #expect(locks.filter { FileManager.default.fileExists(atPath: $0) } == [], "locks of released TPMs")

        // A killed run: its folder names an owner that is gone.
        let killed = try SoftwareTPM()
        #expect(try run(ctl, ["--store", killed.directory + "/store", "--tcti", killed.tcti, "--reader", "none",
                              "set", "s", "k", "--accessible", "always"], input: [1]).status == 0)
        let lock = try #require(TPMTurn.userLock(of: killed.device))
        #expect(FileManager.default.fileExists(atPath: lock))
        let dead = try #require(Processes.spawn("/bin/true", ["true"]))
        _ = Processes.wait(dead)
        try "\(dead) 1\n".write(toFile: killed.directory + "/owner", atomically: false, encoding: .utf8)
        SoftwareTPM.removeStaleDirectories(in: (killed.directory as NSString).deletingLastPathComponent)
        #expect(!FileManager.default.fileExists(atPath: killed.directory), "the killed run's folder")
        #expect(!FileManager.default.fileExists(atPath: lock), "the killed run's lock")
    }
}
