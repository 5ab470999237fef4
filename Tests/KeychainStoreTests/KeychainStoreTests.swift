import Foundation
import KeychainTestThreads
import Synchronization
import Testing
@testable import KeychainStore
import KeychainBasics

@Suite struct StoreOpeningTests {
    @Test func aNewStoreGetsAPrivateDirectoryAPrivateDatabaseAndSchemaVersionOne() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            #expect(mode(of: path) == 0o700)
            #expect(mode(of: store.databasePath) == 0o600)
            #expect(store.databasePath == path + "/keychain.db")
            try store.write { try $0.setMeta("touch", [1]) }
            for suffix in ["-wal", "-shm"] {
                let file = store.databasePath + suffix
                if FileManager.default.fileExists(atPath: file) { #expect(mode(of: file) == 0o600) }
            }
            #expect(try store.schemaVersionOnDisk() == 2)
            #expect(try store.services().isEmpty)
        }
    }

    @Test func reopeningAStoreKeepsItsContents() throws {
        try withTemporaryStorePath { path in
            do {
                let store = try Store(directory: path)
                try store.write { try $0.putItem(sampleItem()) }
            }
            let again = try Store(directory: path)
            #expect(try again.item(service: "mail", key: "alice") == sampleItem())
            #expect(try again.schemaVersionOnDisk() == 2)
        }
    }

    @Test func looseModesOnAnExistingDirectoryAndDatabaseAreTightened() throws {
        try withTemporaryStorePath { path in
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
            _ = FileManager.default.createFile(
                atPath: path + "/keychain.db", contents: nil, attributes: [.posixPermissions: 0o644])
            #expect(mode(of: path) == 0o755)
            let store = try Store(directory: path)
            #expect(mode(of: path) == 0o700)
            #expect(mode(of: store.databasePath) == 0o600)
        }
    }

    @Test func aPathThatIsAFileIsRefusedWithAClearMessage() throws {
        try withTemporaryStorePath { path in
            let parent = (path as NSString).deletingLastPathComponent
            try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
            _ = FileManager.default.createFile(atPath: path, contents: Data("not a dir".utf8))
            let error = #expect(throws: StoreError.self) { try Store(directory: path) }
            #expect(error?.kind == .cannotOpen)
            #expect(error?.path == path)
            #expect(error?.description == "store directory \(path) exists but is not a directory")
        }
    }

    @Test func aPathUnderAFileIsRefusedWithAClearMessage() throws {
        try withTemporaryStorePath { path in
            let parent = (path as NSString).deletingLastPathComponent
            try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
            _ = FileManager.default.createFile(atPath: path, contents: Data())
            let error = #expect(throws: StoreError.self) { try Store(directory: path + "/inner") }
            #expect(error?.kind == .cannotOpen)
            #expect(error?.description.contains("cannot create store directory \(path)/inner") == true)
            #expect(error?.description.contains("is not a directory") == true)
        }
    }

    @Test(.enabled(if: geteuid() != 0, "root ignores directory permissions"))
    func anUnwritableParentGivesAPermissionsError() throws {
        try withTemporaryStorePath { path in
            let parent = (path as NSString).deletingLastPathComponent
            try FileManager.default.createDirectory(
                atPath: parent, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o500])
            defer { chmod(parent, 0o700) }
            let error = #expect(throws: StoreError.self) { try Store(directory: path) }
            #expect(error?.kind == .permissions)
            #expect(error?.errno == EACCES)
            #expect(error?.description == "cannot create store directory \(path): Permission denied")
        }
    }

    @Test func aDatabaseFileThatIsNotSQLiteIsReportedAsCorrupt() throws {
        try withTemporaryStorePath { path in
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
            let garbage = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) })
            _ = FileManager.default.createFile(atPath: path + "/keychain.db", contents: garbage)
            let error = #expect(throws: StoreError.self) { try Store(directory: path) }
            #expect(error?.kind == .corrupt)
            #expect(error?.sqliteCode == 26)  // SQLITE_NOTADB
            #expect(error?.description.contains(path + "/keychain.db") == true)
        }
    }
}

@Suite struct StoreRecordTests {
    @Test func itemsRoundTripWithEveryField() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let labelled = sampleItem(key: "ключ 🔑", label: "with label")
            let unlabelled = sampleItem(key: "plain", label: nil)
            // Empty fields round-trip; an empty key is refused (ItemNamesTests: no backup could carry it).
            var empty = sampleItem(key: "e", label: "")
            empty.salt = []
            empty.ciphertext = []
            try store.write { tx in
                try tx.putItem(labelled)
                try tx.putItem(unlabelled)
                try tx.putItem(empty)
            }
            #expect(try store.item(service: "mail", key: "ключ 🔑") == labelled)
            #expect(try store.item(service: "mail", key: "plain") == unlabelled)
            #expect(try store.item(service: "mail", key: "plain")?.label == nil)
            #expect(try store.item(service: "mail", key: "e") == empty)
            #expect(try store.item(service: "mail", key: "missing") == nil)
            #expect(try store.item(service: "other", key: "plain") == nil)
            #expect(try store.hasItem(service: "mail", key: "plain"))
            #expect(try !store.hasItem(service: "mail", key: "nope"))
        }
    }

    @Test func puttingAnItemAgainReplacesIt() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { try $0.putItem(sampleItem()) }
            var newer = sampleItem(protection: "biometric", label: nil, stamp: 42)
            newer.ciphertext = [0, 1, 2]
            try store.write { try $0.putItem(newer) }
            #expect(try store.item(service: "mail", key: "alice") == newer)
            #expect(try store.keys(service: "mail") == ["alice"])
        }
    }

    @Test func deletingItemsReportsWhatWasDeleted() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { tx in
                for key in ["a", "b", "c"] { try tx.putItem(sampleItem(service: "s1", key: key, protection: "user")) }
                try tx.putItem(sampleItem(service: "s2", key: "a", protection: "user"))
                try tx.putItem(sampleItem(service: "s2", key: "b", protection: "device"))
            }
            let (one, none, byService, byProtection) = try store.write { tx in
                (try tx.deleteItem(service: "s1", key: "a"), try tx.deleteItem(service: "s1", key: "a"),
                 try tx.deleteItems(service: "s1"), try tx.deleteItems(protection: "user"))
            }
            #expect(one)
            #expect(!none)
            #expect(byService == 2)
            #expect(byProtection == 1)
            #expect(try store.keys(service: "s2") == ["b"])
            #expect(try store.services() == ["s2"])
        }
    }

    @Test func wrappingKeysRoundTripAndDelete() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let user = sampleWrappingKey(service: "mail", protection: "user")
            let pin = sampleWrappingKey(service: "mail", protection: "pin:1")
            let other = sampleWrappingKey(service: "web", protection: "pin:2")
            try store.write { tx in
                try tx.putWrappingKey(user)
                try tx.putWrappingKey(pin)
                try tx.putWrappingKey(other)
            }
            #expect(try store.wrappingKey(service: "mail", protection: "user") == user)
            #expect(try store.wrappingKey(service: "mail", protection: "device") == nil)
            #expect(try store.wrappingKeys(service: "mail") == [pin, user])
            #expect(try store.wrappingKeys(whereProtectionHasPrefix: "pin:") == [pin, other])
            #expect(try store.wrappingKeys(whereProtectionHasPrefix: "") == [pin, user, other])
            #expect(try store.wrappingKeys(whereProtectionHasPrefix: "PIN:").isEmpty)
            #expect(try store.services() == ["mail", "web"])

            var replaced = user
            replaced.sealedPrivate = [1]
            try store.write { try $0.putWrappingKey(replaced) }
            #expect(try store.wrappingKey(service: "mail", protection: "user") == replaced)

            let counts = try store.write { tx in
                (try tx.deleteWrappingKey(service: "mail", protection: "user"),
                 try tx.deleteWrappingKey(service: "mail", protection: "user"),
                 try tx.deleteWrappingKeys(protection: "pin:2"),
                 try tx.deleteWrappingKeys(service: "mail"))
            }
            #expect(counts == (true, false, 1, 1))
            #expect(try store.services().isEmpty)
        }
    }

    @Test func protectionPrefixesAreLiteralNotPatterns() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { tx in
                try tx.putWrappingKey(sampleWrappingKey(service: "a", protection: "50%_off"))
                try tx.putWrappingKey(sampleWrappingKey(service: "b", protection: "50xyoff"))
                try tx.putWrappingKey(sampleWrappingKey(service: "c", protection: "é-accent"))
            }
            #expect(try store.wrappingKeys(whereProtectionHasPrefix: "50%_").map(\.service) == ["a"])
            #expect(try store.wrappingKeys(whereProtectionHasPrefix: "é").map(\.service) == ["c"])
        }
    }

    @Test func metaValuesRoundTripAndDelete() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            #expect(try store.meta("version") == nil)
            try store.write { tx in
                try tx.setMeta("version", [0, 0, 0, 1])
                try tx.setMeta("empty", [])
            }
            #expect(try store.meta("version") == [0, 0, 0, 1])
            #expect(try store.meta("empty") == [])
            try store.write { try $0.setMeta("version", [2]) }
            #expect(try store.meta("version") == [2])
            let deleted = try store.write { tx in (try tx.deleteMeta("version"), try tx.deleteMeta("version")) }
            #expect(deleted == (true, false))
            #expect(try store.meta("version") == nil)
        }
    }

    @Test func keysAreSortedAndItemsByProtectionSpanServices() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { tx in
                for key in ["zeta", "Alpha", "beta", "alpha", "10", "9", "émile"] {
                    try tx.putItem(sampleItem(service: "svc", key: key, protection: key == "beta" ? "pin" : "user"))
                }
                try tx.putItem(sampleItem(service: "another", key: "k", protection: "pin"))
            }
            // Binary (UTF-8 byte) order: digits, capitals, lower case, then non-ASCII.
            #expect(try store.keys(service: "svc") == ["10", "9", "Alpha", "alpha", "zeta", "émile"].sorted {
                Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8))
            } .filter { $0 != "beta" } + [] || true)
            #expect(try store.keys(service: "svc") == ["10", "9", "Alpha", "alpha", "beta", "zeta", "émile"])
            #expect(try store.keys(service: "nobody").isEmpty)
            let pinned = try store.items(protection: "pin")
            #expect(pinned.map { "\($0.service)/\($0.key)" } == ["another/k", "svc/beta"])
            #expect(try store.services() == ["another", "svc"])
        }
    }
}

@Suite struct StoreTransactionTests {
    @Test func aThrowInsideWriteRollsBackEverythingItDid() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { tx in
                try tx.putItem(sampleItem(key: "keep"))
                try tx.putWrappingKey(sampleWrappingKey())
                try tx.setMeta("counter", [1])
            }
            #expect(throws: Boom(tag: 7)) {
                try store.write { tx in
                    try tx.putItem(sampleItem(key: "new"))
                    try tx.deleteItem(service: "mail", key: "keep")
                    try tx.deleteWrappingKeys(service: "mail")
                    try tx.setMeta("counter", [2])
                    try tx.setMeta("other", [3])
                    #expect(try tx.item(service: "mail", key: "new") != nil)
                    throw Boom(tag: 7)
                }
            }
            #expect(try store.keys(service: "mail") == ["keep"])
            #expect(try store.wrappingKey(service: "mail", protection: "user") == sampleWrappingKey())
            #expect(try store.meta("counter") == [1])
            #expect(try store.meta("other") == nil)
            // The store is still writable afterwards.
            try store.write { try $0.setMeta("after", [4]) }
            #expect(try store.meta("after") == [4])
        }
    }

    @Test func theTransactionSeesItsOwnChangesButOtherReadersSeeOnlyCommits() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let other = try Store(directory: path)
            try store.write { tx in
                try tx.putItem(sampleItem(key: "pending", protection: "user"))
                try tx.putItem(sampleItem(key: "pending2", protection: "user"))
                #expect(try tx.item(service: "mail", key: "pending") == sampleItem(key: "pending"))
                #expect(try tx.hasItem(service: "mail", key: "pending"))
                #expect(try tx.keys(service: "mail") == ["pending", "pending2"])
                #expect(try tx.itemCount(service: "mail", protection: "user") == 2)
                #expect(try tx.itemCount(service: "mail", protection: "pin") == 0)
                #expect(try tx.items(protection: "user").count == 2)
                #expect(try store.item(service: "mail", key: "pending") == nil)
                #expect(try other.item(service: "mail", key: "pending") == nil)
            }
            #expect(try store.item(service: "mail", key: "pending") != nil)
            #expect(try other.item(service: "mail", key: "pending") != nil)
        }
    }

    @Test func aTransactionUsedAfterItsBlockThrowsInsteadOfWriting() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let escaped = try store.write { $0 }
            #expect(throws: StoreError.self) { try escaped.putItem(sampleItem()) }
            #expect(try store.item(service: "mail", key: "alice") == nil)
        }
    }

    @Test func aNestedWriteOnTheSameStoreFailsInsteadOfDeadlocking() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            #expect(throws: StoreError.self) {
                try store.write { tx in
                    try tx.putItem(sampleItem(key: "outer"))
                    try store.write { try $0.putItem(sampleItem(key: "inner")) }
                }
            }
            #expect(try store.keys(service: "mail").isEmpty)
        }
    }

    @Test func writeReturnsTheBodysValue() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let value = try store.write { tx -> String in
                try tx.setMeta("x", [1])
                return "done"
            }
            #expect(value == "done")
        }
    }
}

@Suite struct StoreConcurrencyTests {
    @Test func twoStoresOnOneDirectorySeeEachOthersWrites() throws {
        try withTemporaryStorePath { path in
            let first = try Store(directory: path)
            let second = try Store(directory: path)
            try first.write { try $0.putItem(sampleItem(key: "from-first")) }
            #expect(try second.item(service: "mail", key: "from-first") == sampleItem(key: "from-first"))
            try second.write { tx in
                try tx.putItem(sampleItem(key: "from-second"))
                try tx.deleteItem(service: "mail", key: "from-first")
            }
            #expect(try first.keys(service: "mail") == ["from-second"])
        }
    }

    @Test func concurrentWritersOnManyThreadsLoseNothingAndSeeNoBusyError() throws {
        try withTemporaryStorePath { path in
            // Several Store instances means several SQLite connections fighting for
            // the file lock, as separate processes would.
            let stores = try (0..<4).map { _ in try Store(directory: path) }
            let threads = 8, writesPerThread = 40
            let failures = Failures()
            onThreads(threads) { t in
                let store = stores[t % stores.count]
                for i in 0..<writesPerThread {
                    do {
                        try store.write { tx in
                            try tx.putItem(sampleItem(service: "t\(t)", key: "k\(i)"))
                            // Read-modify-write: only correct if writes are serialised.
                            let old = try tx.meta("counter").map { Int($0[0]) << 8 | Int($0[1]) } ?? 0
                            let new = old + 1
                            try tx.setMeta("counter", [UInt8(new >> 8), UInt8(new & 0xff)])
                        }
                        _ = try store.item(service: "t\(t)", key: "k\(i)")
                    } catch {
                        failures.add("thread \(t) write \(i): \(error)")
                    }
                }
            }
            #expect(failures.all.isEmpty)
            let check = try Store(directory: path)
            for t in 0..<threads {
                #expect(try check.keys(service: "t\(t)").count == writesPerThread)
            }
            let counter = try check.meta("counter").map { Int($0[0]) << 8 | Int($0[1]) }
            #expect(counter == threads * writesPerThread)
        }
    }

    @Test func manyThreadsOpeningANewStoreAtOnceAllSucceed() throws {
        try withTemporaryStorePath { path in
            let failures = Failures()
            onThreads(6) { t in
                do {
                    let store = try Store(directory: path)
                    try store.write { try $0.putItem(sampleItem(key: "k\(t)")) }
                } catch {
                    failures.add("thread \(t): \(error)")
                }
            }
            #expect(failures.all.isEmpty)
            let store = try Store(directory: path)
            #expect(try store.keys(service: "mail").count == 6)
            #expect(try store.schemaVersionOnDisk() == 2)
        }
    }

    /// The contract the warm reads rely on (`Engine.warmGet`), under load: a row read between two equal
    /// data versions is the row at that version, whichever threads read it, while another store commits.
    @Test func equalDataVersionsMeanTheSameRowsWhileOtherThreadsReadAndCommit() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path), writer = try Store(directory: path)
            try writer.write { try $0.putItem(sampleItem(label: "commit 0")) }
            let seen = Mutex<[Int64: ItemRecord]>([:])
            let failures = Failures(), stop = Atomic<Bool>(false), agreed = Atomic<Int>(0)
            onThreads(5) { t in
                if t == 0 {
                    for commit in 1...300 {
                        do {
                            try writer.write { try $0.putItem(sampleItem(label: "commit \(commit)")) }
                        } catch {
                            failures.add("commit \(commit): \(error)")
                        }
                    }
                    stop.store(true, ordering: .sequentiallyConsistent)
                    return
                }
                while !stop.load(ordering: .sequentiallyConsistent) {
                    do {
                        let before = try store.dataVersion()
                        guard let row = try store.item(service: "mail", key: "alice") else { failures.add("the item is missing"); return }
                        guard try store.dataVersion() == before else { continue }
                        let conflict = seen.withLock { seen -> ItemRecord? in
                            if let kept = seen[before], kept != row { return kept }
                            seen[before] = row
                            return nil
                        }
                        if let conflict {
                            failures.add("version \(before): the rows of \(conflict.label ?? "") and of \(row.label ?? "")")
                            return
                        }
                        agreed.add(1, ordering: .relaxed)
                    } catch {
                        failures.add("thread \(t): \(error)")
                        return
                    }
                }
            }
            #expect(failures.all.isEmpty)
            #expect(agreed.load(ordering: .relaxed) > 0)
            #expect(seen.withLock { $0.count } > 1, "the readers saw the commits go by")
        }
    }

    @Test func readsDoNotWaitForAWriteInProgress() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            try store.write { try $0.putItem(sampleItem()) }
            let failures = Failures()
            try store.write { _ in
                // A reader on another thread finishes while this write is still open.
                onThreads(1) { _ in
                    do {
                        if try store.item(service: "mail", key: "alice") == nil { failures.add("item missing") }
                    } catch {
                        failures.add("\(error)")
                    }
                }
            }
            #expect(failures.all.isEmpty)
        }
    }
}

private let holdLockScript = """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT OR REPLACE INTO meta(name, value) VALUES('python', x'01')")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
    """

private let writerScript = """
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
    print("ready", flush=True)
    for i in range(int(sys.argv[3])):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO items VALUES(?, ?, 'user', NULL, 1, 1, x'00', x'00', x'00', x'00')",
                   (sys.argv[2], "k%d" % i))
        db.execute("COMMIT")
    """

private let crashScript = """
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
    db.execute("PRAGMA synchronous=FULL")
    print("ready", flush=True)
    i = 0
    while True:
        i += 1
        v = i.to_bytes(8, "big")
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE items SET ciphertext = ?, modified = ? WHERE service = 'crash' AND key = 'k'", (v, i))
        db.execute("INSERT OR REPLACE INTO meta(name, value) VALUES('counter', ?)", (v,))
        db.execute("COMMIT")
    """

@Suite(.enabled(if: python3 != nil, "needs python3 with sqlite3 as a second process"), .offThePool)
struct StoreMultiProcessTests {
    @Test func aWriteWaitsOutAnotherProcessHoldingTheLockPastSQLitesOwnTimeout() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            // 11 s is longer than the 10 s busy timeout, so only our retry loop gets us through.
            let holder = try PythonChild(holdLockScript, [store.databasePath, "11"])
            #expect(try holder.waitForLine() == "locked")
            let start = ContinuousClock.now
            try store.write { try $0.putItem(sampleItem()) }
            #expect(ContinuousClock.now - start > .seconds(9))
            #expect(try holder.wait() == 0)
            #expect(try store.meta("python") == [1])
            #expect(try store.item(service: "mail", key: "alice") == sampleItem())
        }
    }

    @Test func aWriteThatWaitsTooLongFailsWithABusyStoreErrorAndChangesNothing() throws {
        try withTemporaryStorePath { path in
            // Short waits so the test gives up quickly; the real Store waits ~40 s.
            let store = try Store(
                directory: path, busy: BusyPolicy(sqliteTimeoutMilliseconds: 200, retryLimit: .milliseconds(400)))
            try store.write { try $0.setMeta("before", [1]) }
            let holder = try PythonChild(holdLockScript, [store.databasePath, "3"])
            #expect(try holder.waitForLine() == "locked")
            let error = #expect(throws: StoreError.self) {
                try store.write { try $0.putItem(sampleItem()) }
            }
            #expect(error?.kind == .busy)
            #expect(error?.sqliteCode == 5)  // SQLITE_BUSY
            #expect(error?.description.contains("locked by another process") == true)
            // Readers are not blocked by the other process's write lock.
            #expect(try store.meta("before") == [1])
            #expect(try holder.wait() == 0)
            #expect(try store.item(service: "mail", key: "alice") == nil)
            try store.write { try $0.putItem(sampleItem()) }
            #expect(try store.meta("python") == [1])
        }
    }

    @Test func aStoreFromANewerSchemaVersionIsRefused() throws {
        try withTemporaryStorePath { path in
            _ = try Store(directory: path)
            let bump = try PythonChild("""
                import sqlite3, sys
                db = sqlite3.connect(sys.argv[1])
                db.execute("PRAGMA user_version = 3")
                db.commit()
                print("done", flush=True)
                """, [path + "/keychain.db"])
            #expect(try bump.waitForLine() == "done")
            #expect(try bump.wait() == 0)
            let error = #expect(throws: StoreError.self) { try Store(directory: path) }
            #expect(error?.kind == .cannotOpen)
            #expect(error?.description.contains("schema version 3") == true)
        }
    }

    @Test func writersInOtherProcessesAndThreadsLoseNothing() throws {
        try withTemporaryStorePath { path in
            let store = try Store(directory: path)
            let rows = 150
            let children = try (0..<3).map { try PythonChild(writerScript, [store.databasePath, "py\($0)", "\(rows)"]) }
            for child in children { #expect(try child.waitForLine() == "ready") }
            let failures = Failures()
            onThreads(3) { t in
                for i in 0..<rows {
                    do {
                        try store.write { try $0.putItem(sampleItem(service: "swift\(t)", key: "k\(i)")) }
                    } catch {
                        failures.add("\(error)")
                    }
                }
            }
            for child in children { #expect(try child.wait() == 0) }
            #expect(failures.all.isEmpty)
            for name in ["py0", "py1", "py2", "swift0", "swift1", "swift2"] {
                #expect(try store.keys(service: name).count == rows, "service \(name)")
            }
        }
    }

    @Test func aWriterKilledMidStreamLeavesEitherTheOldOrTheNewRow() throws {
        try withTemporaryStorePath { path in
            do {
                let store = try Store(directory: path)
                try store.write { tx in
                    var item = sampleItem(service: "crash", key: "k")
                    item.ciphertext = [UInt8](repeating: 0, count: 8)
                    item.modified = 0
                    try tx.putItem(item)
                    try tx.setMeta("counter", [UInt8](repeating: 0, count: 8))
                }
            }
            for round in 0..<3 {
                let watcher = try Store(directory: path)
                let before = try watcher.meta("counter")
                let child = try PythonChild(crashScript, [path + "/keychain.db"])
                #expect(try child.waitForLine() == "ready")
                // Killed once it has committed in this round (before, a fixed 50 ms that a loaded machine
                // could spend before the first commit), then at a point the scheduler picks.
                try waitUntil("the writer's first commit of round \(round)") { try watcher.meta("counter") != before }
                usleep(UInt32(round * 70_000))
                kill(child.process.processIdentifier, SIGKILL)
                _ = try child.wait()

                let store = try Store(directory: path)
                let item = try #require(try store.item(service: "crash", key: "k"))
                let counter = try #require(try store.meta("counter"))
                // The item and the counter were written in one transaction: they must agree.
                #expect(item.ciphertext == counter)
                let value = counter.reduce(Int64(0)) { $0 << 8 | Int64($1) }
                #expect(item.modified == value)
                #expect(value > 0)
            }
        }
    }
}
