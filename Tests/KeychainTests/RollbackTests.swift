import Foundation
import Keychain
import KeychainTestSupport
import Testing

/// The store bound to a TPM counter (issue 22 item 10): a copy of its files put back is refused as
/// `DATA_CORRUPTED` naming the rollback and the recovery, `status` reports it, and no crash (a kill
/// after any TPM command or any store write) ever makes an up-to-date store look rolled back.
/// Before, the copy was taken as the store: a removed item and a replaced value came back.
@Suite("The store cannot be rolled back")
struct RollbackTests {
    let tpm: SoftwareTPM
    let store: String
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path

    init() throws {
        tpm = try SoftwareTPM()
        store = tpm.directory + "/store"
    }

    @discardableResult
    func cli(_ args: [String], _ input: String = "", environment: [String: String] = [:]) throws
        -> (status: Int32, out: String, err: String)
    {
        let result = try run(ctl, ["--store", store, "--tcti", tpm.tcti, "--reader", "none"] + args, input: Array(input.utf8),
                             environment: environment)
        return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
    }

    /// Copies the store's files (database, log, identity) to `to`, or back.
    func copyStore(from: String, to: String) throws {
        let fm = FileManager.default
        try? fm.createDirectory(atPath: to, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        for name in ["keychain.db", "keychain.db-wal", "keychain.db-shm", "keychain.id"] {
            try? fm.removeItem(atPath: to + "/" + name)
            if fm.fileExists(atPath: from + "/" + name) { try fm.copyItem(atPath: from + "/" + name, toPath: to + "/" + name) }
        }
    }

    func expectRollbackRefused(_ result: (status: Int32, out: String, err: String), _ what: String) {
        #expect(result.status == 3 && result.err.contains("DATA_CORRUPTED") && result.err.contains("rolled back")
                && result.err.contains("accept-rollback"), "\(what): \(result.status) \(result.out) \(result.err)")
    }

    /// The attack: a snapshot of the store, an item removed and another replaced, the snapshot put
    /// back. Every call is refused (reads that need no TPM command too), `status` says so with the
    /// recovery, and `accept-rollback` keeps the copy and binds it again.
    @Test func aCopyOfTheStorePutBackIsRefusedAndStatusReportsIt() throws {
        #expect(try cli(["set", "bank", "token"], "refresh-1").status == 0)
        #expect(try cli(["set", "bank", "card"], "4242").status == 0)
        let bound = try cli(["status"])
        #expect(bound.status == 0 && bound.out.contains("store counter: bound"), "\(bound.out) \(bound.err)")
        let snapshot = tpm.directory + "/snapshot"
        try copyStore(from: store, to: snapshot)

        #expect(try cli(["set", "bank", "token"], "refresh-2").status == 0)  // the server rotated the token
        #expect(try cli(["rm", "bank", "card"]).status == 0)
        try copyStore(from: snapshot, to: store)

        expectRollbackRefused(try cli(["get", "bank", "token"]), "get of the replaced item")
        expectRollbackRefused(try cli(["has", "bank", "card"]), "has of the removed item")
        expectRollbackRefused(try cli(["ls", "bank"]), "ls")
        expectRollbackRefused(try cli(["set", "bank", "other"], "x"), "a write")
        let status = try cli(["status"])
        #expect(status.status == 0 && status.out.contains("store counter: ROLLED BACK") && status.out.contains("rolled back")
                && status.out.contains("accept-rollback"), "status: \(status.out) \(status.err)")

        // The administrator keeps the copy: what was written after it is lost, the store works again.
        let accepted = try cli(["accept-rollback"])
        #expect(accepted.status == 0, "\(accepted.out) \(accepted.err)")
        #expect(try cli(["get", "bank", "token"]).out == "refresh-1")
        #expect(try cli(["set", "bank", "token"], "refresh-3").status == 0)
        #expect(try cli(["get", "bank", "token"]).out == "refresh-3")
        #expect(try cli(["status"]).out.contains("store counter: bound"))
    }

    /// A snapshot put back between two runs of keychaind: the restarted daemon refuses every call
    /// with the same error, and `status` through it reports it.
    @Test func aCopyPutBackUnderKeychaindIsRefused() throws {
        var daemon: KeychainDaemon? = try KeychainDaemon(tpm: tpm, store: store)
        func viaDaemon(_ args: [String], _ input: String = "") throws -> (status: Int32, out: String, err: String) {
            let result = try run(ctl, args, input: Array(input.utf8), environment: daemon!.environment)
            return (result.status, String(decoding: result.stdout, as: UTF8.self), result.stderr)
        }
        #expect(try viaDaemon(["set", "bank", "token"], "refresh-1").status == 0)
        #expect(try viaDaemon(["set", "bank", "card"], "4242").status == 0)
        _ = daemon!.kill()
        daemon = nil
        let snapshot = tpm.directory + "/snapshot"
        try copyStore(from: store, to: snapshot)
        daemon = try KeychainDaemon(tpm: tpm, store: store)
        #expect(try viaDaemon(["set", "bank", "token"], "refresh-2").status == 0)
        #expect(try viaDaemon(["rm", "bank", "card"]).status == 0)
        _ = daemon!.kill()
        daemon = nil
        try copyStore(from: snapshot, to: store)
        daemon = try KeychainDaemon(tpm: tpm, store: store)
        expectRollbackRefused(try viaDaemon(["get", "bank", "token"]), "get through keychaind")
        expectRollbackRefused(try viaDaemon(["has", "bank", "card"]), "has through keychaind")
        let status = try viaDaemon(["status"])
        #expect(status.status == 0 && status.out.contains("store counter: ROLLED BACK"), "status: \(status.out) \(status.err)")
    }

    /// A `set` and an `rm` of a bound store killed after each of their TPM commands, then after each
    /// of their store writes: the next run is never refused as a rollback, reads the old value or the
    /// new one, and a write after it is acknowledged and read back (nothing acknowledged is lost).
    @Test(arguments: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS", "KEYCHAIN_TEST_ABORT_AFTER_STORE_WRITES"])
    func aWriteKilledAnywhereIsNeverTakenForARollback(hook: String) throws {
        #expect(try cli(["set", "svc", "k"], "v0").status == 0)
        var acknowledged = "v0"
        var completed = 0
        var kills = 0
        for n in 1...60 where completed < 2 {
            let value = "v\(n)"
            let args = n % 2 == 0 ? ["rm", "svc", "k"] : ["set", "svc", "k"]
            let killed = try cli(args, value, environment: [hook: "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "\(hook)=\(n): \(killed.err)")
            let read = try cli(["get", "svc", "k"])
            #expect(!read.err.contains("rolled back") && !read.err.contains("DATA_CORRUPTED"), "\(hook)=\(n): \(read.err)")
            let possible = n % 2 == 0 ? [acknowledged, ""] : [acknowledged, value]
            #expect(possible.contains(read.status == 0 ? read.out : ""), "\(hook)=\(n): read '\(read.out)' \(read.err)")
            if killed.status == 0 { completed += 1 } else { kills += 1 }
            // An acknowledged write after the kill, read back.
            acknowledged = "ack\(n)"
            #expect(try cli(["set", "svc", "k"], acknowledged).status == 0, "\(hook)=\(n)")
            #expect(try cli(["get", "svc", "k"]).out == acknowledged, "\(hook)=\(n)")
        }
        #expect(completed >= 1, "\(hook): no run completed")
        #expect(kills >= 4, "\(hook): only \(kills) runs were killed")
        print("\(hook): \(kills) runs killed, \(completed) completed")
        #expect(try cli(["status"]).out.contains("store counter: bound"))
    }

    /// The binding itself (an unbound store getting its counter: the handle recorded, the index
    /// defined, incremented, read, the binding written) killed after each TPM command: no run after
    /// it is refused, and the store ends up bound.
    @Test func theFirstBindingKilledAtEveryTPMCommandEndsBound() throws {
        #expect(try cli(["set", "svc", "k"], "v").status == 0)
        var completed = false
        for n in 1...40 where !completed {
            try unbind()
            let killed = try cli(["has", "svc", "k"], environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.err)")
            completed = killed.status == 0
            let read = try cli(["get", "svc", "k"])
            #expect(read.status == 0 && read.out == "v", "kill \(n): \(read.status) \(read.err)")
            #expect(try cli(["status"]).out.contains("store counter: bound"), "kill \(n)")
        }
        #expect(completed)
    }

    /// Makes the store unbound again, as before this version: its record removed (sqlite3) and its
    /// counter undefined (tpm2_nvundefine; the test TPM's owner authorization is empty).
    func unbind() throws {
        let db = store + "/keychain.db"
        #expect(try run("/usr/bin/sqlite3", [db, "DELETE FROM meta WHERE name LIKE 'tpm.store-counter%'"]).status == 0)
        for handle in 0x0100_4B60...0x0100_4B6F {
            let hex = "0x0" + String(handle, radix: 16)
            _ = try run("/usr/bin/tpm2_nvundefine", ["-T", tpm.tcti, hex])
        }
    }
}
