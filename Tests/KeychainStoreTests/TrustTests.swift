import Foundation
import Testing
@testable import KeychainStore

private let nobody: uid_t = 65534
private let runsAsRoot = geteuid() == 0

/// A directory made for the test, with `mode` (chmod, so umask does not interfere) and owner.
private func makeDirectory(_ path: String, mode: mode_t = 0o700, owner: uid_t? = nil) throws {
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    #expect(chmod(path, mode) == 0)
    if let owner { #expect(chown(path, owner, owner) == 0) }
}

private func makeFile(_ path: String, _ bytes: [UInt8] = [], mode: mode_t = 0o600, owner: uid_t? = nil) {
    #expect(FileManager.default.createFile(atPath: path, contents: Data(bytes)))
    #expect(chmod(path, mode) == 0)
    if let owner { #expect(chown(path, owner, owner) == 0) }
}

private func entries(_ path: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []).sorted()
}

private func refusal(_ body: () throws -> Void) -> StoreError? {
    do { try body() } catch let error as StoreError { return error } catch {
        Issue.record("unexpected \(error)")
    }
    return nil
}

/// OpenSSH's StrictModes for the store: a directory or file someone else could have written is refused.
@Suite struct StoreDirectoryTrustTests {
    @Test(.enabled(if: runsAsRoot, "plants another user's directory"))
    func aStoreDirectoryOfAnotherUserIsRefusedAndNothingIsWrittenThere() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path, owner: nobody)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.path == path)
            #expect(error?.message.contains("The store directory \(path) belongs to uid 65534") == true)
            #expect(error?.message.contains("chmod 0700 \(path)") == true)
            #expect(entries(path) == [])
            #expect(mode(of: path) == 0o700)
        }
    }

    @Test func aStoreDirectoryWritableByOthersIsRefusedAndLeftAsItIs() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path, mode: 0o777)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.message.contains("\(path) is writable by group or others (mode 0777)") == true)
            #expect(error?.message.contains("chmod 0700 \(path)") == true)
            #expect(entries(path) == [])
            #expect(mode(of: path) == 0o777)
        }
    }

    @Test(.enabled(if: runsAsRoot, "plants another user's file"))
    func aDatabaseOfAnotherUserIsRefusedAndLeftAsItIs() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path)
            makeFile(path + "/keychain.db", mode: 0o666, owner: nobody)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.path == path + "/keychain.db")
            #expect(error?.message.contains("belongs to uid 65534") == true)
            #expect(entries(path) == ["keychain.db"])
            #expect(FileSystem.size(of: path + "/keychain.db") == 0)
        }
    }

    @Test func aDatabaseWritableByOthersIsRefusedEvenWhenItIsOurs() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path)
            makeFile(path + "/keychain.db", mode: 0o666)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.message.contains("\(path)/keychain.db in the store directory is writable by group or others") == true)
            #expect(FileSystem.size(of: path + "/keychain.db") == 0)
        }
    }

    @Test func aSymlinkedDatabaseIsRefusedAndItsTargetIsNotTouched() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path)
            let target = path + ".attacker.db"
            makeFile(target, [1, 2, 3])
            #expect(symlink(target, path + "/keychain.db") == 0)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.message.contains("\(path)/keychain.db in the store directory is a symbolic link") == true)
            #expect(FileManager.default.contents(atPath: target) == Data([1, 2, 3]))
        }
    }

    @Test func aSymlinkedIdentityFileIsRefused() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path)
            makeFile(path + ".id", Array("00\n".utf8))
            #expect(symlink(path + ".id", path + "/keychain.id") == 0)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(entries(path) == ["keychain.id"])
        }
    }

    /// A FIFO under the identity file's name must not hang the open: refused as not a regular file.
    @Test func aFIFOInPlaceOfTheIdentityFileIsRefusedWithoutBlocking() throws {
        try withTemporaryStorePath { path in
            try makeDirectory(path)
            #expect(mkfifo(path + "/keychain.id", 0o600) == 0)
            let finished = DispatchSemaphore(value: 0)
            let result = Failures()
            Thread {
                result.add(refusal { _ = try Store(directory: path) }?.message ?? "no error")
                finished.signal()
            }.start()
            if finished.wait(timeout: .now() + 10) == .timedOut {
                Issue.record("opening the store blocked on the FIFO")
                let writer = open(path + "/keychain.id", O_WRONLY | O_NONBLOCK)  // lets the blocked open return
                finished.wait()
                close(writer)
            }
            #expect(result.all.first?.contains("\(path)/keychain.id is not a regular file") == true, "\(result.all)")
        }
    }

    @Test func aParentWritableByOthersIsRefusedUnlessItIsSticky() throws {
        try withTemporaryStorePath { path in
            let parent = (path as NSString).deletingLastPathComponent
            try makeDirectory(parent, mode: 0o777)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.message.contains("\(parent), on the way to the store directory \(path), is writable by group or others") == true)
            #expect(!FileManager.default.fileExists(atPath: path), "nothing is created under it")
            // As /tmp: in a sticky directory only an entry's owner may rename or remove it.
            #expect(chmod(parent, 0o1777) == 0)
            _ = try Store(directory: path)
        }
    }

    @Test(.enabled(if: runsAsRoot, "needs another user's directory"))
    func aParentOfAnotherUserIsRefused() throws {
        try withTemporaryStorePath { path in
            let parent = (path as NSString).deletingLastPathComponent
            try makeDirectory(parent, mode: 0o755, owner: nobody)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .untrusted)
            #expect(error?.message.contains("\(parent), on the way to the store directory \(path), belongs to uid 65534") == true)
            #expect(!FileManager.default.fileExists(atPath: path))
        }
    }

    @Test func aSymlinkToOurOwnDirectoryIsAcceptedAndAnotherUsersLinkIsNot() throws {
        try withTemporaryStorePath { path in
            let real = path + ".real"
            try makeDirectory(real)
            #expect(symlink(real, path) == 0)
            _ = try Store(directory: path)
            #expect(entries(real).contains("keychain.db"))
            if runsAsRoot {
                #expect(lchown(path, nobody, nobody) == 0)
                let error = refusal { _ = try Store(directory: path) }
                #expect(error?.kind == .untrusted)
                #expect(error?.message.contains("belongs to uid 65534") == true)
            }
        }
    }
}

/// The store's identity, in the database and in `keychain.id`: a lost, emptied or swapped database
/// is an error, never an empty keychain.
@Suite struct StoreIdentityTests {
    private func initialisedStore(_ path: String) throws {
        let store = try Store(directory: path)
        try store.write { try $0.putItem(sampleItem()) }
    }

    @Test func aNewStoreRecordsItsIdentityInTheDatabaseAndBesideIt() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let file = try #require(FileManager.default.contents(atPath: path + "/keychain.id"))
            let inDatabase = try #require(try store.meta(Store.identityMeta))
            #expect(inDatabase.count == 16)
            #expect(String(decoding: file, as: UTF8.self)
                == inDatabase.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() + "\n")
            #expect(mode(of: path + "/keychain.id") == 0o600)
        }
    }

    @Test func aDeletedDatabaseIsRefusedAndNotRecreated() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)
            for suffix in ["", "-wal", "-shm"] { unlink(path + "/keychain.db" + suffix) }
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .notThisStore)
            #expect(error?.message.contains("The keychain database \(path)/keychain.db is missing") == true)
            #expect(error?.message.contains("Restore keychain.db from a backup") == true)
            #expect(!FileManager.default.fileExists(atPath: path + "/keychain.db"))
        }
    }

    @Test func anEmptiedDatabaseIsRefused() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)
            #expect(truncate(path + "/keychain.db", 0) == 0)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .notThisStore)
            #expect(error?.message.contains("is empty (0 bytes)") == true)
            #expect(FileSystem.size(of: path + "/keychain.db") == 0)
        }
    }

    @Test func anotherStoresDatabaseIsRefused() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)
            try initialisedStore(path + "2")
            defer { try? FileManager.default.removeItem(atPath: path + "2") }
            #expect(rename(path + "2/keychain.db", path + "/keychain.db") == 0)
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .notThisStore)
            #expect(error?.message.contains("belongs to another store") == true)
        }
    }

    @Test func aDatabaseWithoutIdentityIsRefusedWhereOneIsRecorded() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)
            let store = try Store(directory: path)
            try store.write { _ = try $0.deleteMeta(Store.identityMeta) }
            let error = refusal { _ = try Store(directory: path) }
            #expect(error?.kind == .notThisStore)
            #expect(error?.message.contains("has no store identity") == true)
        }
    }

    @Test func aStoreKnownToBeInitialisedElsewhereIsNotMadeAfresh() throws {
        try withTemporaryStorePath { path in
            let error = refusal { _ = try Store(directory: path, initializedBecause: "the embedded TPM's state is in X") }
            #expect(error?.kind == .notThisStore)
            #expect(error?.message.contains("is missing, but this store was initialised (the embedded TPM's state is in X)") == true)
            #expect(!FileManager.default.fileExists(atPath: path + "/keychain.db"))
        }
    }

    @Test func aLostIdentityFileIsWrittenAgainFromTheDatabase() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)
            let before = FileManager.default.contents(atPath: path + "/keychain.id")
            unlink(path + "/keychain.id")
            let store = try Store(directory: path)
            #expect(try store.item(service: "mail", key: "alice") == sampleItem())
            #expect(FileManager.default.contents(atPath: path + "/keychain.id") == before)
        }
    }

    @Test func closingTheStoreCheckpointsSoALostWALLosesNothing() throws {
        try withTemporaryStorePath { path in
            try initialisedStore(path)  // closed at the end of its scope
            let wal = FileSystem.size(of: path + "/keychain.db-wal") ?? 0
            #expect(wal == 0)
            unlink(path + "/keychain.db-wal")
            unlink(path + "/keychain.db-shm")
            #expect(try Store(directory: path).item(service: "mail", key: "alice") == sampleItem())
        }
    }
}
