import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// The store bound to a TPM monotonic counter (issue 22, item 10): a copy of the store put back
/// after a removal or a rotated token is refused as `DATA_CORRUPTED` naming rollback, by
/// `keychainctl` in this process and by keychaind, and the administrator's `accept-store` keeps it.
@Suite("Rollback of the store", .offThePool)
struct RollbackTests {
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    /// A store on its own software TPM, driven through `keychainctl` processes.
    struct Device {
        let tpm: SoftwareTPM
        let store: String
        let ctl: String

        init(ctl: String) throws {
            tpm = try SoftwareTPM()
            store = tpm.directory + "/store"
            self.ctl = ctl
        }

        @discardableResult
        func cli(_ args: [String], _ input: String = "", environment: [String: String] = [:]) throws
            -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, ["--store", store, "--tcti", tpm.tcti] + args, input: Array(input.utf8),
                    environment: ["KEYCHAIN_SOCKET": "", "KEYCHAIN_READER": ""].merging(environment) { $1 })
        }

        func text(_ args: [String]) throws -> String { String(decoding: try cli(args).stdout, as: UTF8.self) }
    }

    static let storeFiles = ["keychain.db", "keychain.db-wal", "keychain.db-shm", "keychain.id"]

    /// The store's files as they are (no process has it open).
    static func snapshot(_ store: String) -> [String: Data] {
        var files: [String: Data] = [:]
        for name in storeFiles { files[name] = FileManager.default.contents(atPath: store + "/" + name) }
        return files
    }

    /// Puts a snapshot back in place of the store's files: what an attacker who kept a copy does.
    static func putBack(_ files: [String: Data], _ store: String) throws {
        for name in storeFiles {
            let path = store + "/" + name
            unlink(path)
            if let data = files[name] {
                #expect(FileManager.default.createFile(atPath: path, contents: data, attributes: [.posixPermissions: 0o600]))
            }
        }
    }

    /// keychainctl through `daemon`, as root or as `uid` (setpriv).
    func client(_ daemon: KeychainDaemon, _ args: [String], _ input: String = "", uid: UInt32? = nil) throws
        -> (status: Int32, stdout: [UInt8], stderr: String) {
        guard let uid else { return try run(ctl, args, input: Array(input.utf8), environment: daemon.environment) }
        return try run("/usr/bin/setpriv", ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", ctl] + args,
                       input: Array(input.utf8), environment: daemon.environment)
    }

    func expectRollback(_ result: (status: Int32, stdout: [UInt8], stderr: String), sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 3, "\(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains("DATA_CORRUPTED: Rollback"), "\(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stdout.isEmpty, sourceLocation: sourceLocation)
    }

    // MARK: The verdict, without a TPM

    @Test func theVerdictTellsCurrentOneAheadTheWindowRollbackAndForgery() {
        let boot = TPMContext.ClockCounts(resetCount: 3, restartCount: 0)
        let rebooted = TPMContext.ClockCounts(resetCount: 4, restartCount: 0)
        func record(_ value: UInt64, _ clock: TPMContext.ClockCounts = boot) -> RollbackRecord { .init(value: value, clock: clock) }
        #expect(RollbackVerdict.of(record(40), counter: 40, clock: boot, window: 256) == .current)
        #expect(RollbackVerdict.of(record(41), counter: 40, clock: boot, window: 256) == .oneAhead)
        #expect(RollbackVerdict.of(record(42), counter: 40, clock: boot, window: 256) == .forged(ahead: 2))
        #expect(RollbackVerdict.of(record(39), counter: 40, clock: boot, window: 256) == .rolledBack(behind: 1))
        // After a TPM restart the store has not seen: at most the window behind is the orderly counter's jump.
        #expect(RollbackVerdict.of(record(40), counter: 295, clock: rebooted, window: 256) == .restartWindow(behind: 255))
        #expect(RollbackVerdict.of(record(40), counter: 296, clock: rebooted, window: 256) == .restartWindow(behind: 256))
        #expect(RollbackVerdict.of(record(40), counter: 297, clock: rebooted, window: 256) == .rolledBack(behind: 257))
        // The same clock counts: no restart, so no window.
        #expect(RollbackVerdict.of(record(40, rebooted), counter: 41, clock: rebooted, window: 256) == .rolledBack(behind: 1))
        #expect(RollbackRecord(decoding: record(7, rebooted).encoded()) == record(7, rebooted))
        let binding = RollbackBinding(index: 0x0100_4C2A, window: 256, authorization: Array(repeating: 9, count: 32))
        #expect(RollbackBinding(decoding: binding.encoded()) == binding)
    }

    // MARK: The attack, in this process

    @Test func aCopyPutBackAfterARemovalAndARotationIsRefusedNamingRollback() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.text(["status"]).contains("rollback counter: current"))
        #expect(try d.cli(["set", "bank", "removed"], "old secret").status == 0)
        #expect(try d.cli(["set", "bank", "refresh"], "token-1").status == 0)
        let copy = Self.snapshot(d.store)
        #expect(try d.cli(["rm", "bank", "removed"]).status == 0)
        #expect(try d.cli(["set", "bank", "refresh"], "token-2").status == 0)
        try Self.putBack(copy, d.store)

        expectRollback(try d.cli(["get", "bank", "removed"]))
        expectRollback(try d.cli(["get", "bank", "refresh"]))
        expectRollback(try d.cli(["set", "bank", "new"], "x"))
        // status says so and does not fail.
        let status = try d.cli(["status"])
        #expect(status.status == 0, "\(status.stderr)")
        let text = String(decoding: status.stdout, as: UTF8.self)
        #expect(text.contains("rollback counter: rolled-back"), "\(text)")
        #expect(text.contains("warning: Rollback: the store is behind its TPM counter"), "\(text)")
    }

    @Test func aStoreWithNoCounterSaysSoInStatusAndStillWorks() throws {
        let d = try Device(ctl: ctl)
        // No init: the store is set up by its first write, unbound, as stores of earlier versions are.
        #expect(try d.cli(["set", "s", "k"], "v").status == 0)
        let text = try d.text(["status"])
        #expect(text.contains("rollback counter: unbound"), "\(text)")
        #expect(text.contains("warning: The store has no rollback counter"), "\(text)")
        #expect(try d.cli(["get", "s", "k"]).stdout == Array("v".utf8))
        // init binds it afterwards, the items kept.
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.text(["status"]).contains("rollback counter: current"))
        #expect(try d.cli(["get", "s", "k"]).stdout == Array("v".utf8))
    }

    // MARK: What a write costs

    /// An overwrite in a process that read the counter already: StartAuthSession and NV_Increment
    /// after the commit (docs/performance.md); no leftover check, as the turn follows this engine's
    /// last one. Unbound: none.
    @Test func aBoundOverwriteSendsTwoTPMCommandsAndAnUnboundOneNone() async throws {
        let tpm = try SoftwareTPM()
        var counts: [String: Int] = [:]
        for bound in [false, true] {
            let configuration = tpm.configuration(store: tpm.directory + (bound ? "/bound" : "/unbound"))
            let device = KeychainDevice(configuration: configuration)
            if bound {
                try await KeychainAdministration(configuration: configuration).initialize(takingOwnership: Ownership(allowEmpty: true))
            } else {
                _ = try await device.initialize()
            }
            let storage = try createKeychain(.init(service: "s"), configuration: configuration)
            try await storage.setItem("k", "v0")
            try await storage.setItem("k", "v1")
            _ = await device.takeTPMCommandCount()
            try await storage.setItem("k", "v2")
            counts[bound ? "bound" : "unbound"] = await device.takeTPMCommandCount()
            #expect(try await device.status().rollbackCounter?.state == (bound ? .current : .unbound))
        }
        #expect(counts == ["unbound": 0, "bound": 2])
    }

    // MARK: The recovery

    @Test func acceptStoreWithTheOwnerAuthorizationKeepsTheCopyAndAWrongOneChangesNothing() throws {
        let d = try Device(ctl: ctl)
        let owner = d.tpm.directory + "/owner.auth", lockout = d.tpm.directory + "/lockout.auth"
        #expect(try d.cli(["init", "--owner-auth-out", owner, "--lockout-auth-out", lockout]).status == 0)
        #expect(try d.text(["status"]).contains("rollback counter: current"))
        #expect(try d.cli(["set", "s", "a"], "copied").status == 0)
        let copy = Self.snapshot(d.store)
        #expect(try d.cli(["rm", "s", "a"]).status == 0)
        try Self.putBack(copy, d.store)
        expectRollback(try d.cli(["get", "s", "a"]))

        // Whoever put the copy back has no owner authorization: refused, and the store still refused.
        let wrong = d.tpm.directory + "/wrong.auth"
        #expect(FileManager.default.createFile(atPath: wrong, contents: Data("hex:00112233\n".utf8), attributes: [.posixPermissions: 0o600]))
        let refused = try d.cli(["accept-store", "--owner-auth-file", wrong])
        #expect(refused.status == 3 && refused.stderr.contains("AUTHENTICATION_FAILED"), "\(refused.stderr)")
        expectRollback(try d.cli(["get", "s", "a"]))
        #expect(try d.text(["status"]).contains("rollback counter: rolled-back"))

        let accepted = try d.cli(["accept-store", "--owner-auth-file", owner])
        #expect(accepted.status == 0, "\(accepted.stderr)")
        #expect(String(decoding: accepted.stdout, as: UTF8.self).contains("rollback counter: current"))
        #expect(try d.cli(["get", "s", "a"]).stdout == Array("copied".utf8))
        #expect(try d.text(["status"]).contains("rollback counter: current"))
        #expect(try d.cli(["set", "s", "b"], "after").status == 0)
        // The old counter is gone from the TPM, the new one counts: the same copy put back again is refused.
        try Self.putBack(copy, d.store)
        expectRollback(try d.cli(["get", "s", "a"]))
        #expect(try d.text(["status"]).contains("rollback counter: replaced"))
    }

    // MARK: Another user on the TPM

    @Test func anotherUserOnTheTPMCannotAdvanceRewriteOrRemoveTheCounter() throws {
        let d = try Device(ctl: ctl)
        let owner = d.tpm.directory + "/owner.auth", lockout = d.tpm.directory + "/lockout.auth"
        #expect(try d.cli(["init", "--owner-auth-out", owner, "--lockout-auth-out", lockout]).status == 0)
        #expect(try d.cli(["set", "s", "a"], "v").status == 0)
        let status = try d.text(["status"])
        let index = try #require(status.split(separator: "\n").first { $0.hasPrefix("rollback counter: current") }
            .flatMap { $0.range(of: "NV 0x").map { line in String(status[line.upperBound...].prefix(8)) } })
        let env = ["TPM2TOOLS_TCTI": d.tpm.tcti]
        func tool(_ command: String) throws -> Int32 { try run("/bin/sh", ["-c", command], environment: env).status }
        #expect(try tool("tpm2_nvread -s 8 0x\(index) >/dev/null 2>&1") != 0, "read with the empty authValue")
        #expect(try tool("tpm2_nvincrement 0x\(index) 2>/dev/null") != 0, "incremented with the empty authValue")
        #expect(try tool("tpm2_nvincrement -P str:guess 0x\(index) 2>/dev/null") != 0, "incremented with a guess")
        #expect(try tool("tpm2_nvundefine 0x\(index) 2>/dev/null") != 0, "undefined without the owner authorization")
        #expect(try tool("tpm2_nvdefine 0x\(index) -s 8 -a 'authread|authwrite|nt=counter' 2>/dev/null") != 0)
        // noDA: the wrong tries locked nothing out, and the store goes on.
        #expect(try d.cli(["get", "s", "a"]).stdout == Array("v".utf8))
        #expect(try d.cli(["set", "s", "b"], "w").status == 0)
        #expect(try d.text(["status"]).contains("rollback counter: current"))
    }

    // MARK: keychaind's store

    @Test func keychaindRefusesItsStorePutBackNamingRollback() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        // The service's provisioning, where its store is, as its user.
        #expect(try run(ctl, ["--direct", "--store", store, "--tcti", tpm.tcti, "init", "--allow-empty-owner-auth"]).status == 0)
        let daemon = try KeychainDaemon(tpm: tpm, store: store)
        func client(_ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, args, input: Array(input.utf8), environment: daemon.environment)
        }
        #expect(try client(["set", "bank", "removed"], "old").status == 0)
        #expect(try client(["set", "bank", "refresh"], "token-1").status == 0)
        daemon.kill()
        let copy = Self.snapshot(store)
        try daemon.start()
        #expect(try client(["rm", "bank", "removed"]).status == 0)
        #expect(try client(["set", "bank", "refresh"], "token-2").status == 0)
        daemon.kill()
        try Self.putBack(copy, store)
        try daemon.start()
        expectRollback(try client(["get", "bank", "removed"]))
        expectRollback(try client(["get", "bank", "refresh"]))
        expectRollback(try client(["set", "bank", "other"], "x"))
        let status = try client(["status"])
        #expect(String(decoding: status.stdout, as: UTF8.self).contains("rollback counter: rolled-back"), "\(status.stderr)")
    }

    /// keychaind's budget of wrong passcodes per non-admin uid is in the store's meta. Before, its
    /// writes were not counted: a snapshot of the store put back gave a uid its spent budget back
    /// (three more of the TPM's passcode tries). Now each is a counted write, and the snapshot is
    /// refused as a rollback.
    @Test func aSnapshotPutBackDoesNotGiveAUidItsSpentPasscodeBudgetBack() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        #expect(try run(ctl, ["--direct", "--store", store, "--tcti", tpm.tcti, "init", "--allow-empty-owner-auth"]).status == 0)
        let daemon = try KeychainDaemon(tpm: tpm, store: store)
        let nobody: UInt32 = 65534
        #expect(try client(daemon, ["passcode", "set"], "2468\n").status == 0)
        daemon.kill()
        let copy = Self.snapshot(store)
        try daemon.start()
        for _ in 1...3 { #expect(try client(daemon, ["unlock"], "0000\n", uid: nobody).stderr.contains("AUTHENTICATION_FAILED")) }
        let spent = try client(daemon, ["unlock"], "0000\n", uid: nobody)
        #expect(spent.stderr.contains("LOCKOUT") && spent.stderr.contains("uid \(nobody) gave 3 wrong passcodes"), "\(spent.stderr)")
        daemon.kill()
        try Self.putBack(copy, store)
        try daemon.start()
        // The copy's budget is unspent: refused as a rollback, not three more tries of the TPM's.
        let again = try client(daemon, ["unlock"], "0000\n", uid: nobody)
        expectRollback(again)
        #expect(!again.stderr.contains("AUTHENTICATION_FAILED"), "\(again.stderr)")
    }

    // MARK: The embedded software TPM

    @Test(.enabled(if: !FileManager.default.fileExists(atPath: "/dev/tpmrm0"), "the embedded TPM is used only without a TPM device"))
    func theEmbeddedTPMBindsItsStoreWithoutInitAndRefusesACopy() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rollback-" + UUID().uuidString).path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = directory + "/store"
        func cli(_ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, ["--store", store] + args, input: Array(input.utf8),
                    environment: ["KEYCHAIN_SOCKET": "", "KEYCHAIN_TCTI": "", "TPM2TCTI": "", "KEYCHAIN_READER": ""])
        }
        // Not `keychainctl tpm stop`: on the rolled-back store it is refused like every other command, and
        // the swtpm outlived the test (one left per run).
        defer { EmbeddedTPM.stop(storeDirectory: store) }
        #expect(try cli(["set", "s", "a"], "v1").status == 0)
        #expect(String(decoding: try cli(["status"]).stdout, as: UTF8.self).contains("rollback counter: current"))
        let copy = Self.snapshot(store)
        #expect(try cli(["rm", "s", "a"]).status == 0)
        try Self.putBack(copy, store)
        expectRollback(try cli(["get", "s", "a"]))
    }

    // MARK: TPM restarts: the window

    @Test func aTPMRestartWithoutShutdownIsAcceptedOnceAndARollbackAfterItIsNot() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["set", "s", "a"], "v").status == 0)
        let before = try d.text(["status"])
        // swtpm killed and started again: no TPM2_Shutdown, so the orderly counter comes back ahead.
        try d.tpm.reboot()
        let after = try d.cli(["get", "s", "a"])
        #expect(after.status == 0 && after.stdout == Array("v".utf8), "\(after.stderr)\n\(before)")
        #expect(try d.text(["status"]).contains("rollback counter: current"))
        // The window closed with that operation: a copy put back now is refused.
        let copy = Self.snapshot(d.store)
        #expect(try d.cli(["rm", "s", "a"]).status == 0)
        try Self.putBack(copy, d.store)
        expectRollback(try d.cli(["get", "s", "a"]))
    }

    // MARK: Kills at every TPM command

    @Test func aWriteKilledAtEveryTPMCommandNeverLooksLikeARollback() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["set", "s", "a"], "v0").status == 0)
        for n in 1...40 {
            let killed = try d.cli(["set", "s", "a"], "v\(n)", environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let read = try d.cli(["get", "s", "a"])
            #expect(read.status == 0, "after kill \(n): \(read.stderr)")
            let value = String(decoding: read.stdout, as: UTF8.self)
            #expect(value == "v\(n)" || value == "v\(n - 1)", "after kill \(n): \(value)")
            if value != "v\(n)" { #expect(try d.cli(["set", "s", "a"], "v\(n)").status == 0, "after kill \(n)") }
            let status = try d.text(["status"])
            #expect(status.contains("rollback counter: current"), "after kill \(n): \(status)")
            if killed.status == 0 {
                #expect(n > 2, "a write took only \(n - 1) TPM commands")
                print("a bound write: \(n - 1) TPM commands, each killed once")
                return
            }
        }
        Issue.record("the write never completed")
    }

    @Test func aBindingKilledAtEveryTPMCommandIsFinishedByTheNextInitWithOneCounter() throws {
        for n in 1...60 {
            let d = try Device(ctl: ctl)
            #expect(try d.cli(["set", "s", "a"], "v").status == 0)
            let killed = try d.cli(["init", "--allow-empty-owner-auth"], environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            let again = try d.cli(["init", "--allow-empty-owner-auth"])
            #expect(again.status == 0, "after kill \(n): \(again.stderr)")
            #expect(try d.text(["status"]).contains("rollback counter: current"), "after kill \(n)")
            #expect(try d.cli(["get", "s", "a"]).stdout == Array("v".utf8), "after kill \(n)")
            // Exactly one counter in the TPM: a killed binding's index was found again, not left behind.
            let handles = try run("/bin/sh", ["-c", "tpm2_getcap handles-nv-index"], environment: ["TPM2TOOLS_TCTI": d.tpm.tcti])
            let counters = String(decoding: handles.stdout, as: UTF8.self).split(separator: "\n").filter { $0.contains("0x1004C") }
            #expect(counters.count == 1, "after kill \(n): \(counters)")
            if killed.status == 0 {
                print("a binding by init: killed at each of its first \(n - 1) TPM commands")
                return
            }
        }
        Issue.record("init never completed")
    }
}
