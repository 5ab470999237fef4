import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainStore
import KeychainTestSupport
import Testing

/// The fingerprint reader's directory bound to the store's counter (issue 22, item 10): a bound
/// store records each enrollment change in a counted write, and a `reader.json` put back from an
/// older copy is behind that record: refused as `DATA_CORRUPTED` naming rollback.
extension RollbackTests {
    static let pin = "2468\n"

    static func readerFile(_ d: Device) -> String { d.store + ".reader/reader.json" }

    static func putBackReader(_ copy: Data, _ d: Device) {
        unlink(readerFile(d))
        #expect(FileManager.default.createFile(atPath: readerFile(d), contents: copy, attributes: [.posixPermissions: 0o600]))
    }

    @Test func aReaderDirectoryPutBackAfterARemovalIsRefusedNamingRollback() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "index"], Self.pin).status == 0)
        #expect(try d.cli(["set", "bio", "any", "--access-control", "biometryAny"], "any").status == 0)
        #expect(try d.cli(["set", "bio", "current", "--access-control", "biometryCurrentSet"], "current").status == 0)
        let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        #expect(try d.cli(["reader", "remove", "thumb"], Self.pin).status == 0)
        #expect(try d.cli(["get", "bio", "any", "--touch", "thumb"]).status != 0, "the removed finger opens")

        // The copy would bring the removed finger back, and the enrollment set the CurrentSet item was sealed to.
        Self.putBackReader(copy, d)
        expectRollback(try d.cli(["get", "bio", "any", "--touch", "thumb"]))
        expectRollback(try d.cli(["get", "bio", "current", "--touch", "index"]))
        expectRollback(try d.cli(["reader", "list"]))
        // An enrollment on top of the copy would make it current: refused too.
        expectRollback(try d.cli(["reader", "enroll", "middle"], Self.pin))
        expectRollback(try d.cli(["set", "bio", "new", "--access-control", "biometryAny"], "x"))

        // The recovery: the reader deleted (with the passcode) and enrolled again.
        let deleted = try d.cli(["reader", "delete"], Self.pin)
        #expect(deleted.status == 0, "\(deleted.stderr)")
        #expect(try d.cli(["reader", "enroll", "index"], Self.pin).status == 0)
        #expect(try d.text(["reader", "list"]) == "index\n")
        // (Another service: "bio"'s key is the deleted reader's.)
        #expect(try d.cli(["set", "after", "k", "--access-control", "biometryAny"], "after").status == 0)
        #expect(try d.text(["get", "after", "k", "--touch", "index"]) == "after")
        // The deleted reader's copy put back again is still behind the store.
        Self.putBackReader(copy, d)
        expectRollback(try d.cli(["reader", "list"]))
    }

    /// The store and the reader's directory copied together before `reader remove spare`, and put
    /// back together: the reader's file agrees with the store's record of it, so only the TPM's
    /// counter tells. Every use is refused naming rollback, the reader's as the items' (before, `reader
    /// list` printed the removed finger and `can-use` answered `unsupported`); `status` says so.
    @Test func aStoreAndItsReaderPutBackTogetherRefuseEveryUseNamingRollback() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "spare"], Self.pin).status == 0)
        #expect(try d.cli(["set", "bio", "any", "--access-control", "biometryAny"], "any").status == 0)
        let store = Self.snapshot(d.store)
        let reader = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        #expect(try d.cli(["reader", "remove", "spare"], Self.pin).status == 0)
        #expect(try d.text(["reader", "list"]) == "thumb\n")

        try Self.putBack(store, d.store)
        Self.putBackReader(reader, d)
        expectRollback(try d.cli(["get", "bio", "any", "--touch", "spare"]))
        expectRollback(try d.cli(["reader", "list"]))
        expectRollback(try d.cli(["can-use", "biometryAny"]))
        let json = try d.cli(["--json", "can-use", "biometryAny"])
        #expect(json.status == 3 && String(decoding: json.stdout, as: UTF8.self).contains(#""code":"DATA_CORRUPTED","message":"Rollback"#),
                "\(String(decoding: json.stdout, as: UTF8.self))")
        expectRollback(try d.cli(["can-use", "biometryCurrentSet"]))
        expectRollback(try d.cli(["can-use", "passcode"]))
        expectRollback(try d.cli(["reader", "enroll", "middle"], Self.pin))
        expectRollback(try d.cli(["reader", "remove", "thumb"], Self.pin))
        expectRollback(try d.cli(["set", "bio", "new", "--access-control", "biometryAny"], "x"))
        let status = try d.cli(["status"])
        #expect(status.status == 0 && String(decoding: status.stdout, as: UTF8.self).contains("rollback counter: rolled-back"), "\(status.stderr)")
    }

    /// `status` beside a reader put back from an older copy: the rest of the status as before, the
    /// reader `rolled-back` with the refusal's reason and recovery as a warning; current once deleted.
    @Test func statusShowsAReaderPutBackAsRolledBackWithItsRecovery() async throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try d.text(["status"]).contains("fingerprint reader: current (1 enrolled, enrollment changes: file 1, store 1)"))
        let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        #expect(try d.cli(["reader", "enroll", "index"], Self.pin).status == 0)
        Self.putBackReader(copy, d)
        let status = try d.cli(["status"])
        let text = String(decoding: status.stdout, as: UTF8.self)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(text.contains("passcode: set") && text.contains("rollback counter: current"), "\(text)")
        #expect(text.contains("fingerprint reader: rolled-back (1 enrolled, enrollment changes: file 1, store 2)"), "\(text)")
        #expect(text.contains("warning: Rollback: the fingerprint reader's state in \(d.store).reader is an older copy")
                && text.contains("keychainctl reader delete, then keychainctl reader enroll NAME"), "\(text)")
        // The library's call says the same.
        var configuration = d.tpm.configuration(store: d.store)
        configuration.readerDirectory = d.store + ".reader"
        let device = try await KeychainDevice(configuration: configuration).status()
        #expect(device.reader?.state == .rolledBack && device.reader?.recordedGeneration == 2, "\(String(describing: device.reader))")
        #expect(device.warnings.contains { $0.hasPrefix("Rollback: the fingerprint reader's state") }, "\(device.warnings)")

        #expect(try d.cli(["reader", "delete"], Self.pin).status == 0)
        #expect(try d.text(["status"]).contains("fingerprint reader: absent"))
    }

    @Test func aReaderEmptiedByThePasscodesRemovalIsCurrentEvenFromACopy() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "thumb"], Self.pin).status == 0)
        let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        #expect(try d.cli(["reader", "enroll", "index"], Self.pin).status == 0)
        Self.putBackReader(copy, d)
        expectRollback(try d.cli(["reader", "list"]))
        // Removing the passcode removes every finger, the copy's too: nothing of it is left to refuse.
        #expect(try d.cli(["passcode", "remove"], Self.pin).status == 0)
        let list = try d.cli(["reader", "list"])
        #expect(list.status == 0 && list.stdout.isEmpty, "\(list.stderr)")
        #expect(try d.cli(["reader", "enroll", "thumb"]).status == 0)
    }

    @Test func aReaderPutBackBesideAnUnboundStoreIsNotRefused() throws {
        let d = try Device(ctl: ctl)
        // No init: an unbound store records nothing, as before.
        #expect(try d.cli(["reader", "enroll", "thumb"]).status == 0)
        let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        #expect(try d.cli(["reader", "remove", "thumb"]).status == 0)
        Self.putBackReader(copy, d)
        #expect(try d.text(["reader", "list"]) == "thumb\n")
    }

    /// Enrollments and a removal on a bound store killed after each of their TPM commands in turn:
    /// the reader's file is written before the store's counted record, so a kill leaves the file
    /// level with the store or ahead of it, never behind: the reader is in the old state or the
    /// new one, and nothing is refused.
    @Test func anEnrollmentChangeKilledAtEveryTPMCommandNeverLooksLikeARollback() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        let changes: [(args: [String], before: String, after: String, undo: [String])] = [
            (["reader", "enroll", "thumb"], "", "thumb\n", ["reader", "remove", "thumb"]),
            (["reader", "enroll", "index"], "thumb\n", "index\nthumb\n", ["reader", "remove", "index"]),
            (["reader", "remove", "thumb"], "index\nthumb\n", "index\n", ["reader", "enroll", "thumb"]),
        ]
        for change in changes {
            var completed = false
            for n in 1...80 where !completed {
                let killed = try d.cli(change.args, Self.pin, environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
                #expect(killed.status == 134 || killed.status == 0, "\(change.args) kill \(n): \(killed.stderr)")
                let list = try d.cli(["reader", "list"])
                #expect(list.status == 0, "\(change.args) after kill \(n): \(list.stderr)")
                let fingers = String(decoding: list.stdout, as: UTF8.self)
                #expect(fingers == change.before || fingers == change.after, "\(change.args) after kill \(n): \(fingers)")
                // One ahead: the record committed before its NV_Increment; the next TPM operation catches up.
                let counter = try d.text(["status"])
                #expect(counter.contains("rollback counter: current") || counter.contains("rollback counter: one-ahead"),
                        "\(change.args) after kill \(n): \(counter)")
                completed = killed.status == 0
                if completed { print("\(change.args) on a bound store: killed at each of its first \(n - 1) TPM commands") }
                if !completed && fingers == change.after {
                    let undone = try d.cli(change.undo, Self.pin)
                    #expect(undone.status == 0, "\(change.args) after kill \(n): \(undone.stderr)")
                }
                if n % 4 == 0 { #expect(try d.cli(["passcode", "reset-tries"]).status == 0) }
            }
            #expect(completed, "\(change.args) never completed")
            #expect(try d.text(["reader", "list"]) == change.after)
        }
        // The last state is recorded: the first state's file put back would be refused (aReaderDirectoryPutBack…).
        #expect(try d.cli(["set", "bio", "k", "--access-control", "biometryAny"], "bio").status == 0)
        #expect(try d.text(["get", "bio", "k", "--touch", "index"]) == "bio")
    }

    /// `reader delete` on a bound store killed after each of its TPM commands in turn: the store
    /// records the deletion before the file goes, so whenever the file is gone the store's record
    /// is past it, and the deleted reader's copy put back is refused; a kill in between leaves the
    /// file behind the record, refused naming `reader delete`, which then completes.
    @Test func aReaderDeleteKilledAtEveryTPMCommandLeavesItsCopyRefused() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        var completed = false
        for n in 1...60 where !completed {
            if n % 4 == 0 { #expect(try d.cli(["passcode", "reset-tries"]).status == 0) }
            if !FileManager.default.fileExists(atPath: Self.readerFile(d)) {
                let enrolled = try d.cli(["reader", "enroll", "thumb"], Self.pin)
                #expect(enrolled.status == 0, "kill \(n): \(enrolled.stderr)")
            }
            let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
            let killed = try d.cli(["reader", "delete"], Self.pin, environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            completed = killed.status == 0
            if FileManager.default.fileExists(atPath: Self.readerFile(d)) {
                // Killed before the file went: as it was, or behind the deletion's record, naming its recovery.
                let list = try d.cli(["reader", "list"])
                if list.status != 0 {
                    expectRollback(list)
                    #expect(list.stderr.contains("keychainctl reader delete"), "kill \(n): \(list.stderr)")
                    let again = try d.cli(["reader", "delete"], Self.pin)
                    #expect(again.status == 0, "kill \(n): \(again.stderr)")
                } else {
                    #expect(String(decoding: list.stdout, as: UTF8.self) == "thumb\n", "kill \(n)")
                    continue
                }
            }
            if completed { print("reader delete on a bound store: killed at each of its first \(n - 1) TPM commands") }
            // The file is gone: the store recorded it, and the copy is behind.
            Self.putBackReader(copy, d)
            expectRollback(try d.cli(["reader", "list"]))
            unlink(Self.readerFile(d))
        }
        #expect(completed, "reader delete never completed")
    }

    /// `reader list` reads the store's record of the reader (`checkedReader`); where no store exists
    /// yet (a reader beside a store directory not made), it records nothing: the list is the file's,
    /// and no store is created for a look.
    @Test func readerListWhereNoStoreExistsMakesNone() throws {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["reader", "enroll", "thumb"]).status == 0)
        let elsewhere = d.tpm.directory + "/no-store"
        let list = try run(ctl, ["--store", elsewhere, "--tcti", d.tpm.tcti, "--reader", d.store + ".reader", "reader", "list"],
                           environment: ["KEYCHAIN_SOCKET": "", "KEYCHAIN_READER": ""])
        #expect(list.status == 0 && String(decoding: list.stdout, as: UTF8.self) == "thumb\n", "\(list.stderr)")
        #expect(!FileManager.default.fileExists(atPath: elsewhere), "reader list made a store at \(elsewhere)")
    }

    /// keychaind's reader (`--reader`) put back from an older copy, beside its bound store: a
    /// client's read with the removed finger is refused as `DATA_CORRUPTED` naming rollback, and
    /// so are the client's list and enrollment.
    @Test func keychaindRefusesItsReaderPutBackNamingRollback() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store", reader = tpm.directory + "/reader"
        #expect(try run(ctl, ["--direct", "--store", store, "--tcti", tpm.tcti, "init", "--allow-empty-owner-auth"]).status == 0)
        let daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader)
        func client(_ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(ctl, args, input: Array(input.utf8), environment: daemon.environment)
        }
        #expect(try client(["passcode", "set"], Self.pin).status == 0)
        #expect(try client(["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try client(["reader", "enroll", "index"], Self.pin).status == 0)
        #expect(try client(["set", "bank", "pin", "--access-control", "biometryAny"], "4321").status == 0)
        let file = reader + "/reader.json"
        let copy = try #require(FileManager.default.contents(atPath: file))
        #expect(try client(["reader", "remove", "thumb"], Self.pin).status == 0)
        #expect(try client(["get", "bank", "pin", "--touch", "thumb"]).status != 0, "the removed finger opens")
        unlink(file)
        #expect(FileManager.default.createFile(atPath: file, contents: copy, attributes: [.posixPermissions: 0o600]))
        let refused = try client(["get", "bank", "pin", "--touch", "thumb"])
        expectRollback(refused)
        #expect(refused.stderr.contains("fingerprint reader's state in \(reader) is an older copy"), "\(refused.stderr)")
        expectRollback(try client(["reader", "list"]))
        expectRollback(try client(["reader", "enroll", "middle"], Self.pin))
        #expect(try client(["get", "bank", "pin", "--touch", "index"]).status != 0)
    }

    /// The same through keychaind: its store and `--reader` directory copied together while it is
    /// stopped, `reader remove spare`, and both put back. `reader list` (root) and `can-use`, which
    /// keychaind answers for every uid (`nobody` here), are refused naming rollback.
    @Test func keychaindRefusesItsStoreAndReaderPutBackTogether() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store", reader = tpm.directory + "/reader"
        #expect(try run(ctl, ["--direct", "--store", store, "--tcti", tpm.tcti, "init", "--allow-empty-owner-auth"]).status == 0)
        let daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader)
        #expect(try client(daemon, ["passcode", "set"], Self.pin).status == 0)
        #expect(try client(daemon, ["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try client(daemon, ["reader", "enroll", "spare"], Self.pin).status == 0)
        daemon.kill()
        let copy = Self.snapshot(store)
        let file = reader + "/reader.json"
        let readerCopy = try #require(FileManager.default.contents(atPath: file))
        try daemon.start()
        #expect(try client(daemon, ["reader", "remove", "spare"], Self.pin).status == 0)
        daemon.kill()
        try Self.putBack(copy, store)
        unlink(file)
        #expect(FileManager.default.createFile(atPath: file, contents: readerCopy, attributes: [.posixPermissions: 0o600]))
        try daemon.start()
        expectRollback(try client(daemon, ["reader", "list"]))
        expectRollback(try client(daemon, ["can-use", "biometryAny"], uid: 65534))
        expectRollback(try client(daemon, ["can-use", "passcode"], uid: 65534))
        let status = try client(daemon, ["status"])
        #expect(String(decoding: status.stdout, as: UTF8.self).contains("rollback counter: rolled-back"), "\(status.stderr)")
    }

    // MARK: Failed touches

    /// A bound store with the passcode set, the finger `thumb` enrolled and the biometryAny item
    /// `bio`/`k` holding "secret".
    func boundDeviceWithABiometricItem() throws -> Device {
        let d = try Device(ctl: ctl)
        #expect(try d.cli(["init", "--allow-empty-owner-auth"]).status == 0)
        #expect(try d.cli(["passcode", "set"], Self.pin).status == 0)
        #expect(try d.cli(["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try d.cli(["set", "bio", "k", "--access-control", "biometryAny"], "secret").status == 0)
        return d
    }

    /// The failed touches of `account` as the reader's file and the store record them.
    static func failures(_ d: Device, account: String = "owner") throws -> (file: Int, store: Int) {
        let bytes = try #require(FileManager.default.contents(atPath: readerFile(d)))
        let state = try JSONDecoder().decode(FingerprintReader.State.self, from: bytes)
        let file = account == "owner" ? state.failures : state.accountFailures?[account] ?? 0
        let recorded = try Store(directory: d.store).meta(StoreMeta.readerFailures(keyName: state.keyName))
        let counts = try recorded.map { try JSONDecoder().decode([String: Int].self, from: Data($0)) } ?? [:]
        return (file, counts[account] ?? 0)
    }

    /// Before, the failure count lived in reader.json alone: a copy saved with no failures, put back
    /// after five wrong touches, ended the lockout (and ten would never be permanent). On a bound
    /// store each failure is a counted write too, and the lockout holds over the copy until the
    /// passcode, which clears both.
    @Test func aReaderCopyPutBackDoesNotEndALockout() throws {
        let d = try boundDeviceWithABiometricItem()
        let copy = try #require(FileManager.default.contents(atPath: Self.readerFile(d)))
        var answers: [String] = []
        for guess in 1...5 { answers.append(try d.cli(["get", "bio", "k", "--touch", "guess\(guess)"]).stderr) }
        #expect(answers.last!.contains("LOCKOUT"), "\(answers)")
        #expect(try d.cli(["get", "bio", "k", "--touch", "thumb"]).stderr.contains("LOCKOUT"))

        Self.putBackReader(copy, d)
        let after = try d.cli(["get", "bio", "k", "--touch", "thumb"])
        #expect(after.status != 0 && after.stderr.contains("LOCKOUT") && after.stdout.isEmpty, "the copy ended the lockout: \(after.stderr)")
        // Touches go on counting from the store's count: ten make it permanent, over the copy too.
        for _ in 1...3 { _ = try d.cli(["get", "bio", "k", "--touch", "thumb"]) }
        Self.putBackReader(copy, d)
        #expect(try d.cli(["get", "bio", "k", "--touch", "thumb"]).stderr.contains("LOCKOUT_PERMANENT"))

        // The passcode ends it, in the file and the store.
        #expect(try d.cli(["unlock"], Self.pin).status == 0)
        #expect(try Self.failures(d) == (0, 0))
        #expect(try d.text(["get", "bio", "k", "--touch", "thumb"]) == "secret")
    }

    /// keychaind's uid accounts: another uid's lockout holds over a copy put back too, and stays that
    /// uid's own (the owner still reads).
    @Test func keychaindsUidLockoutHoldsOverAReaderCopyPutBack() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store", reader = tpm.directory + "/reader"
        #expect(try run(ctl, ["--direct", "--store", store, "--tcti", tpm.tcti, "init", "--allow-empty-owner-auth"]).status == 0)
        let daemon = try KeychainDaemon(tpm: tpm, store: store, reader: reader)
        let nobody: UInt32 = 65534
        #expect(try client(daemon, ["passcode", "set"], Self.pin).status == 0)
        #expect(try client(daemon, ["reader", "enroll", "thumb"], Self.pin).status == 0)
        #expect(try client(daemon, ["set", "nbio", "k", "--access-control", "biometryAny"], "nobody's", uid: nobody).status == 0)
        #expect(try client(daemon, ["set", "rbio", "k", "--access-control", "biometryAny"], "root's").status == 0)
        let file = reader + "/reader.json"
        let copy = try #require(FileManager.default.contents(atPath: file))
        for guess in 1...5 { _ = try client(daemon, ["get", "nbio", "k", "--touch", "guess\(guess)"], uid: nobody) }
        #expect(try client(daemon, ["get", "nbio", "k", "--touch", "thumb"], uid: nobody).stderr.contains("LOCKOUT"))
        unlink(file)
        #expect(FileManager.default.createFile(atPath: file, contents: copy, attributes: [.posixPermissions: 0o600]))
        let after = try client(daemon, ["get", "nbio", "k", "--touch", "thumb"], uid: nobody)
        #expect(after.stderr.contains("LOCKOUT") && after.stdout.isEmpty, "the copy ended uid \(nobody)'s lockout: \(after.stderr)")
        #expect(String(decoding: try client(daemon, ["get", "rbio", "k", "--touch", "thumb"]).stdout, as: UTF8.self) == "root's")
    }

    /// A wrong touch killed after each of its TPM commands in turn: the store's count is written
    /// before the file's, so wherever the kill lands the store holds at least the file's count (a
    /// copy of the file put back after it loses no failure).
    @Test func aWrongTouchKilledAtEveryTPMCommandNeverLeavesTheFileAheadOfTheStore() throws {
        let d = try boundDeviceWithABiometricItem()
        var completed = false
        for n in 1...40 where !completed {
            let killed = try d.cli(["get", "bio", "k", "--touch", "wrong"], environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            completed = killed.status != 134
            #expect(completed ? killed.stderr.contains("AUTHENTICATION_FAILED") : true, "kill \(n): \(killed.stderr)")
            let (file, store) = try Self.failures(d)
            #expect(store >= file && file <= 1, "kill \(n): file \(file), store \(store)")
            if completed { print("a wrong touch on a bound store: killed at each of its first \(n - 1) TPM commands") }
            #expect(try d.cli(["unlock"], Self.pin).status == 0)
        }
        #expect(completed, "the wrong touch never completed")
    }

    /// What a failed touch costs a bound store: its counted record, as a bound overwrite's.
    @Test func aFailedTouchOnABoundStoreSendsTheCountedWritesCommands() async throws {
        let tpm = try SoftwareTPM()
        var counts: [String: Int] = [:]
        for bound in [false, true] {
            let answers = ScriptedAuthenticator()
            var configuration = tpm.configuration(store: tpm.directory + (bound ? "/bound" : "/unbound"))
            configuration.readerDirectory = tpm.directory + (bound ? "/bound.reader" : "/unbound.reader")
            configuration.authenticator = answers
            let device = KeychainDevice(configuration: configuration)
            if bound {
                try await KeychainAdministration(configuration: configuration).initialize(takingOwnership: Ownership(allowEmpty: true))
            } else {
                _ = try await device.initialize()
            }
            if !bound { try await device.setPasscode(bytes("2468")) }  // the TPM's, both stores'
            try await device.enrollFinger("thumb", passcode: bytes("2468"))
            let storage = try createKeychain(.init(service: "bio", accessControl: .biometryAny), configuration: configuration)
            try await storage.setItem("k", "v")
            answers.push(.finger("wrong"))
            _ = await device.takeTPMCommandCount()
            await #expect(throws: KeychainError.self) { try await storage.getItem("k") }
            counts[bound ? "bound" : "unbound"] = await device.takeTPMCommandCount()
        }
        print("TPM commands per failed touch: \(counts)")
        #expect(counts["bound"] == counts["unbound"].map { $0 + 2 }, "\(counts)")
    }

    /// What an enrollment change costs a bound store: its counted record, two TPM commands as a
    /// bound overwrite's (docs/performance.md).
    @Test func anEnrollmentChangeOnABoundStoreSendsTwoMoreTPMCommands() async throws {
        let tpm = try SoftwareTPM()
        var counts: [String: Int] = [:]
        for bound in [false, true] {
            var configuration = tpm.configuration(store: tpm.directory + (bound ? "/bound" : "/unbound"))
            configuration.readerDirectory = tpm.directory + (bound ? "/bound.reader" : "/unbound.reader")
            let device = KeychainDevice(configuration: configuration)
            if bound {
                try await KeychainAdministration(configuration: configuration).initialize(takingOwnership: Ownership(allowEmpty: true))
            } else {
                _ = try await device.initialize()
            }
            try await device.enrollFinger("thumb", passcode: nil)
            _ = await device.takeTPMCommandCount()
            try await device.enrollFinger("index", passcode: nil)
            counts[bound ? "bound" : "unbound"] = await device.takeTPMCommandCount()
            _ = await device.takeTPMCommandCount()
            #expect(try await device.removeFinger("index", passcode: nil))
            counts[bound ? "bound removal" : "unbound removal"] = await device.takeTPMCommandCount()
        }
        print("TPM commands per enrollment change: \(counts)")
        #expect(counts["bound"] == counts["unbound"].map { $0 + 2 }, "\(counts)")
        #expect(counts["bound removal"] == counts["unbound removal"].map { $0 + 2 }, "\(counts)")
    }
}
