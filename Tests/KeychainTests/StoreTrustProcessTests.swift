import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

private let nobody: uid_t = 65534
private let runsAsRoot = geteuid() == 0
/// The embedded TPM is used only where there is no TPM device.
private let embeddedTPMIsUsed = !FileManager.default.fileExists(atPath: "/dev/tpmrm0")

/// `keychainctl` on store directories and files that someone else made, and on stores whose
/// database was lost, emptied or swapped: each is refused with its code, never used or read as empty.
@Suite("Store trust and identity (keychainctl processes)", .offThePool)
struct StoreTrustProcessTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    /// keychainctl on `store`: on `tcti`, or the store's embedded TPM when nil; as nobody with `asNobody`.
    func cli(_ store: String, _ args: [String], tcti: String?, input: [UInt8] = [], asNobody: Bool = false) throws
        -> (status: Int32, stdout: [UInt8], stderr: String) {
        var argv = ["--store", store] + (tcti.map { ["--tcti", $0] } ?? []) + args
        var program = ctl
        if asNobody {
            argv = ["--reuid=\(nobody)", "--regid=\(nobody)", "--clear-groups", ctl] + argv
            program = "/usr/bin/setpriv"
        }
        return try run(program, argv, input: input, environment: ["KEYCHAIN_TCTI": "", "TPM2TCTI": "", "KEYCHAIN_READER": ""])
    }

    func entries(_ path: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
    }

    /// Exit 3 with `code`, and a message naming `path`.
    func expectRefused(_ result: (status: Int32, stdout: [UInt8], stderr: String), _ code: String, naming path: String,
                       sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(result.status == 3, "\(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains("keychainctl: \(code): "), "\(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains(path), "\(result.stderr)", sourceLocation: sourceLocation)
    }

    // MARK: Directories and files made by someone else (issue 8, item 5)

    @Test(.enabled(if: runsAsRoot, "plants another user's directory"))
    func aStoreDirectoryOfAnotherUserIsRefusedAndNothingIsWrittenThere() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: false)
        #expect(chmod(store, 0o700) == 0 && chown(store, nobody, nobody) == 0)
        expectRefused(try cli(store, ["set", "svc", "k"], tcti: tpm.tcti, input: Array("secret".utf8)), "STORAGE_ERROR", naming: store)
        expectRefused(try cli(store, ["has", "svc", "k"], tcti: tpm.tcti), "STORAGE_ERROR", naming: store)
        #expect(entries(store) == [])
    }

    @Test func aStoreDirectoryWritableByOthersIsRefusedAndNothingIsWrittenThere() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: false)
        #expect(chmod(store, 0o777) == 0)
        let result = try cli(store, ["set", "svc", "k"], tcti: tpm.tcti, input: Array("secret".utf8))
        expectRefused(result, "STORAGE_ERROR", naming: store)
        #expect(result.stderr.contains("chmod 0700 \(store)"))
        #expect(entries(store) == [])
    }

    @Test(.enabled(if: runsAsRoot, "plants another user's file"))
    func aDatabasePlantedByAnotherUserIsRefusedAndLeftEmpty() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: false)
        #expect(chmod(store, 0o700) == 0)
        #expect(FileManager.default.createFile(atPath: store + "/keychain.db", contents: nil))
        #expect(chmod(store + "/keychain.db", 0o666) == 0 && chown(store + "/keychain.db", nobody, nobody) == 0)
        expectRefused(try cli(store, ["set", "svc", "k"], tcti: tpm.tcti, input: Array("secret".utf8)),
                      "STORAGE_ERROR", naming: store + "/keychain.db")
        #expect(entries(store) == ["keychain.db"])
        #expect(FileManager.default.contents(atPath: store + "/keychain.db") == Data())
    }

    @Test func aSymlinkedDatabaseIsRefusedAndItsTargetIsNotWritten() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let target = tpm.directory + "/attacker.db"
        try FileManager.default.createDirectory(atPath: store, withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: target, contents: nil))
        #expect(symlink(target, store + "/keychain.db") == 0)
        expectRefused(try cli(store, ["set", "svc", "k"], tcti: tpm.tcti, input: Array("secret".utf8)),
                      "STORAGE_ERROR", naming: store + "/keychain.db")
        #expect(FileManager.default.contents(atPath: target) == Data())
    }

    /// A reader planted by another user, whose HMAC key they hold: biometric items would be sealed
    /// to it. Refused while the directory or `reader.json` is theirs.
    @Test(.enabled(if: runsAsRoot, "plants another user's reader"))
    func aReaderPlantedByAnotherUserIsRefused() throws {
        let tpm = try SoftwareTPM()
        // The attacker's own reader, provisioned on the same TPM: a valid reader.json whose key they hold.
        let theirs = tpm.directory + "/attacker"
        #expect(try cli(theirs, ["reader", "enroll", "thumb"], tcti: tpm.tcti).status == 0)
        let planted = try #require(FileManager.default.contents(atPath: theirs + ".reader/reader.json"))

        let store = tpm.directory + "/store"
        let reader = store + ".reader"
        #expect(try cli(store, ["passcode", "set"], tcti: tpm.tcti, input: Array("2468\n".utf8)).status == 0)
        try FileManager.default.createDirectory(atPath: reader, withIntermediateDirectories: false)
        #expect(FileManager.default.createFile(atPath: reader + "/reader.json", contents: planted))
        #expect(chmod(reader, 0o700) == 0 && chown(reader, nobody, nobody) == 0)
        #expect(chown(reader + "/reader.json", nobody, nobody) == 0)
        let write = ["set", "svc", "bio", "--access-control", "biometryAny"]
        expectRefused(try cli(store, write, tcti: tpm.tcti, input: Array("secret".utf8)), "STORAGE_ERROR", naming: reader)
        expectRefused(try cli(store, ["reader", "list"], tcti: tpm.tcti), "STORAGE_ERROR", naming: reader)
        // The directory made ours, the file still theirs.
        #expect(chown(reader, 0, 0) == 0)
        expectRefused(try cli(store, write, tcti: tpm.tcti, input: Array("secret".utf8)),
                      "STORAGE_ERROR", naming: reader + "/reader.json")
        #expect(try cli(store, ["has", "svc", "bio"], tcti: tpm.tcti).status == 1, "nothing was sealed to their reader")
        #expect(FileManager.default.contents(atPath: reader + "/reader.json") == planted)
    }

    @Test(.enabled(if: runsAsRoot && embeddedTPMIsUsed, "plants another user's TPM state; needs the embedded TPM"))
    func anEmbeddedTPMStateDirectoryOfAnotherUserIsRefused() throws {
        let tpm = try SoftwareTPM()  // only for its temporary directory
        let store = tpm.directory + "/store"
        defer { EmbeddedTPM.stop(storeDirectory: store) }
        try FileManager.default.createDirectory(atPath: store + "/swtpm", withIntermediateDirectories: true)
        #expect(chmod(store, 0o700) == 0 && chmod(store + "/swtpm", 0o700) == 0)
        #expect(chown(store + "/swtpm", nobody, nobody) == 0)
        expectRefused(try cli(store, ["set", "svc", "k"], tcti: nil, input: Array("secret".utf8)),
                      "STORAGE_ERROR", naming: store + "/swtpm")
        #expect(entries(store + "/swtpm") == [], "no swtpm was started on their state")
    }

    /// The legitimate case: a second user with a store in a directory of their own.
    @Test(.enabled(if: runsAsRoot && embeddedTPMIsUsed, "runs as nobody; needs the embedded TPM"))
    func anotherUserWithAStoreInTheirOwnDirectoryWorks() throws {
        let tpm = try SoftwareTPM()  // only for its temporary directory
        #expect(chmod(tpm.directory, 0o755) == 0)
        let home = tpm.directory + "/nobody"
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: false)
        #expect(chmod(home, 0o700) == 0 && chown(home, nobody, nobody) == 0)
        let store = home + "/store"
        defer { EmbeddedTPM.stop(storeDirectory: store) }
        let set = try cli(store, ["set", "svc", "k"], tcti: nil, input: Array("theirs".utf8), asNobody: true)
        #expect(set.status == 0, "\(set.stderr)")
        #expect(try cli(store, ["get", "svc", "k"], tcti: nil, asNobody: true).stdout == Array("theirs".utf8))
        var info = stat()
        #expect(stat(store + "/keychain.db", &info) == 0 && info.st_uid == nobody)
        // The owner's store, seen by root: another user's directory.
        expectRefused(try cli(store, ["has", "svc", "k"], tcti: nil), "STORAGE_ERROR", naming: store)
    }

    // MARK: A lost, emptied or swapped database (issue 8, item 9)

    /// A store with one item, written by a process that exited normally.
    func initialisedStore(_ tpm: SoftwareTPM, _ name: String = "store") throws -> String {
        let store = tpm.directory + "/" + name
        #expect(try cli(store, ["set", "svc", "k"], tcti: tpm.tcti, input: Array("kept".utf8)).status == 0)
        return store
    }

    @Test func aDeletedDatabaseIsAnErrorNotAnEmptyKeychain() throws {
        let tpm = try SoftwareTPM()
        let store = try initialisedStore(tpm)
        for suffix in ["", "-wal", "-shm"] { unlink(store + "/keychain.db" + suffix) }
        let has = try cli(store, ["has", "svc", "k"], tcti: tpm.tcti)
        expectRefused(has, "DATA_CORRUPTED", naming: store + "/keychain.db")
        #expect(has.stderr.contains("is missing"))
        expectRefused(try cli(store, ["get", "svc", "k"], tcti: tpm.tcti), "DATA_CORRUPTED", naming: store + "/keychain.db")
        #expect(!FileManager.default.fileExists(atPath: store + "/keychain.db"))
    }

    @Test func aTruncatedDatabaseIsAnErrorNotAnEmptyKeychain() throws {
        let tpm = try SoftwareTPM()
        let store = try initialisedStore(tpm)
        #expect(truncate(store + "/keychain.db", 0) == 0)
        let get = try cli(store, ["get", "svc", "k"], tcti: tpm.tcti)
        expectRefused(get, "DATA_CORRUPTED", naming: store + "/keychain.db")
        #expect(get.stderr.contains("is empty"))
        expectRefused(try cli(store, ["ls", "svc"], tcti: tpm.tcti), "DATA_CORRUPTED", naming: store)
    }

    @Test func anotherStoresDatabaseIsAnErrorNotAnEmptyKeychain() throws {
        let tpm = try SoftwareTPM()
        let store = try initialisedStore(tpm)
        let other = tpm.directory + "/other"
        #expect(try cli(other, ["set", "svc", "unrelated"], tcti: tpm.tcti, input: [1]).status == 0)
        #expect(rename(other + "/keychain.db", store + "/keychain.db") == 0)
        let has = try cli(store, ["has", "svc", "k"], tcti: tpm.tcti)
        expectRefused(has, "DATA_CORRUPTED", naming: store + "/keychain.db")
        #expect(has.stderr.contains("belongs to another store"))
    }

    @Test func theWALIsCheckpointedAtExitSoDeletingItLosesNothing() throws {
        let tpm = try SoftwareTPM()
        let store = try initialisedStore(tpm)
        #expect(try cli(store, ["set", "svc", "k2"], tcti: tpm.tcti, input: Array("kept too".utf8)).status == 0)
        let wal = (try? FileManager.default.attributesOfItem(atPath: store + "/keychain.db-wal"))?[.size] as? Int ?? 0
        #expect(wal == 0, "the last process folded the WAL into keychain.db")
        unlink(store + "/keychain.db-wal")
        unlink(store + "/keychain.db-shm")
        #expect(try cli(store, ["get", "svc", "k"], tcti: tpm.tcti).stdout == Array("kept".utf8))
        #expect(try cli(store, ["get", "svc", "k2"], tcti: tpm.tcti).stdout == Array("kept too".utf8))
    }

    /// The embedded TPM's state lives in the store directory: with it there, a fresh store is refused
    /// even when both keychain.db and keychain.id are gone.
    @Test(.enabled(if: embeddedTPMIsUsed, "needs the embedded TPM"))
    func aStoreWipedBesideItsEmbeddedTPMStateIsAnError() throws {
        let tpm = try SoftwareTPM()  // only for its temporary directory
        let store = tpm.directory + "/store"
        defer { EmbeddedTPM.stop(storeDirectory: store) }
        #expect(try cli(store, ["set", "svc", "k"], tcti: nil, input: Array("kept".utf8)).status == 0)
        for name in ["keychain.db", "keychain.db-wal", "keychain.db-shm", "keychain.id"] { unlink(store + "/" + name) }
        let has = try cli(store, ["has", "svc", "k"], tcti: nil)
        expectRefused(has, "DATA_CORRUPTED", naming: store + "/swtpm/keychain.id")
        #expect(has.stderr.contains("keychain.db is missing"))
        #expect(!FileManager.default.fileExists(atPath: store + "/keychain.db"))
        // Both files replaced by another store's: its identity is not the one the TPM was provisioned for.
        let other = tpm.directory + "/other"
        defer { EmbeddedTPM.stop(storeDirectory: other) }
        #expect(try cli(other, ["set", "svc", "unrelated"], tcti: nil, input: [1]).status == 0)
        for name in ["keychain.db", "keychain.id"] { #expect(rename(other + "/" + name, store + "/" + name) == 0) }
        let swapped = try cli(store, ["has", "svc", "k"], tcti: nil)
        expectRefused(swapped, "DATA_CORRUPTED", naming: store + "/swtpm/keychain.id")
        #expect(swapped.stderr.contains("not the one its embedded TPM was provisioned for"))
    }
}
