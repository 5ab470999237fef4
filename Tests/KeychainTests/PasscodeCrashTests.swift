import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// Every passcode and enrollment change, killed after each of its TPM commands in turn (the
/// `KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS` hook): afterwards the device is in the old state or the
/// new one, in the TPM and in the store, as `keychainctl` shows it. Before, a killed `set` left
/// "passcode: set" with the empty passcode opening the device and its passcode items, and a killed
/// `remove` destroyed whenPasscodeSet items while the passcode stayed.
@Suite("Passcode and enrollment changes killed at every TPM command", .offThePool)
struct PasscodeCrashTests {
    let tpm: SoftwareTPM
    let store: String
    let ctl = buildDirectory.appendingPathComponent("keychainctl").path
    static let old = "2468", new = "97531"

    init() throws {
        tpm = try SoftwareTPM()
        store = tpm.directory + "/store"
    }

    @discardableResult
    func cli(_ args: [String], _ input: String = "", abortAfter: Int? = nil) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", store, "--tcti", tpm.tcti] + args, input: Array(input.utf8),
                environment: abortAfter.map { ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\($0)"] } ?? [:])
    }

    func text(_ args: [String], _ input: String = "") throws -> String {
        String(decoding: try cli(args, input).stdout, as: UTF8.self)
    }

    /// Runs `args` killed after its 1st, 2nd, … TPM command until it completes; `check` runs after
    /// each kill (and once after the completed run) and puts the device back in the old state.
    func killAtEveryCommand(_ args: [String], _ input: String, check: (Int) throws -> Void) throws {
        for n in 1...80 {
            let result = try cli(args, input, abortAfter: n)
            #expect(result.status == 134 || result.status == 0, "kill \(n): \(result.stderr)")
            try check(n)
            if result.status == 0 { return }
            // The checks spend up to three of the PIN's ten tries per round (wrong unlocks, the probe).
            if n % 2 == 0 { #expect(try cli(["passcode", "reset-tries"]).status == 0) }
        }
        Issue.record("\(args) never completed")
    }

    func passcodeSet() throws -> Bool {
        let status = try cli(["--json", "status"])
        let body = try JSONSerialization.jsonObject(with: Data(status.stdout)) as? [String: [String: Any]]
        return try #require(body?["device"]?["passcodeSet"] as? Bool, "\(status.stderr)")
    }

    /// Which passcode the TPM holds ("" for none), by unlocking (the PolicySecret that passcode items
    /// need too); the status must say the same.
    func heldPasscode(_ candidates: [String], n: Int) throws -> String? {
        let set = try passcodeSet()
        let opening = try candidates.filter { try cli(["unlock"], $0 + "\n").status == 0 }
        #expect(opening.count == 1, "kill \(n): \(opening) unlock the device")
        guard let held = opening.first else { return nil }
        #expect(set == !held.isEmpty, "kill \(n): status says passcode \(set ? "set" : "not set"), but '\(held)' unlocks")
        return held
    }

    @Test func passcodeSetIsAtomic() throws {
        try killAtEveryCommand(["passcode", "set"], Self.new + "\n") { n in
            let held = try heldPasscode(["", Self.new], n: n)
            if held == Self.new {
                // The new state: passcode items can be made, and only the passcode opens them.
                #expect(try cli(["set", "s\(n)", "pc", "--access-control", "passcode"], "pc").status == 0)
                #expect(try text(["get", "s\(n)", "pc", "--passcode-stdin"], Self.new + "\n") == "pc")
                #expect(try cli(["passcode", "remove"], Self.new + "\n").status == 0)
            } else {
                let refused = try cli(["set", "s", "pc", "--access-control", "passcode"], "pc")
                #expect(refused.status == 3 && refused.stderr.contains("PASSCODE_NOT_SET"), "kill \(n): \(refused.stderr)")
            }
        }
    }

    @Test func passcodeRemoveIsAtomic() throws {
        func setUpOldState() throws {
            #expect(try cli(["passcode", "set"], Self.old + "\n").status == 0)
            #expect(try cli(["set", "s", "wps", "--accessible", "whenPasscodeSetThisDeviceOnly"], "wps").status == 0)
            #expect(try cli(["set", "s", "pc", "--access-control", "passcode"], "pc").status == 0)
            #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0)
            #expect(try cli(["set", "s", "bio", "--access-control", "biometryAny"], "bio").status == 0)
        }
        try setUpOldState()
        var completed = false
        try killAtEveryCommand(["passcode", "remove"], Self.old + "\n") { n in
            let held = try heldPasscode(["", Self.old], n: n)
            if held == Self.old {
                // The old state: nothing destroyed, the passcode items open with the passcode only.
                #expect(try text(["get", "s", "wps"]) == "wps", "kill \(n)")
                #expect(try text(["get", "s", "pc", "--passcode-stdin"], Self.old + "\n") == "pc")
                #expect(try text(["get", "s", "bio", "--touch", "thumb"]) == "bio", "kill \(n)")
            } else {
                // The new state: the whenPasscodeSet item is gone from the store and dead in the TPM;
                // every item behind an access control is dead in the TPM: KEY_INVALIDATED, then gone.
                #expect(try cli(["has", "s", "wps"]).status == 1, "kill \(n)")
                let bio = try cli(["get", "s", "bio", "--touch", "thumb"])
                #expect(bio.status == 3 && bio.stderr.contains("KEY_INVALIDATED"), "kill \(n): \(bio.stderr)")
                #expect(try cli(["has", "s", "bio"]).status == 1, "kill \(n)")
                completed = try text(["reader", "list"]).isEmpty
                try setUpOldState()
            }
        }
        #expect(completed, "a completed removal leaves no finger enrolled")
    }

    @Test func passcodeChangeIsAtomic() throws {
        #expect(try cli(["passcode", "set"], Self.old + "\n").status == 0)
        #expect(try cli(["set", "s", "pc", "--access-control", "passcode"], "pc").status == 0)
        try killAtEveryCommand(["passcode", "change"], Self.old + "\n" + Self.new + "\n") { n in
            let held = try heldPasscode(["", Self.old, Self.new], n: n)
            #expect(held != "", "kill \(n)")
            #expect(try text(["get", "s", "pc", "--passcode-stdin"], (held ?? "") + "\n") == "pc")
            if held == Self.new { #expect(try cli(["passcode", "change"], Self.new + "\n" + Self.old + "\n").status == 0) }
        }
    }

    /// A set killed right after NV_ChangeAuth, seen first by a store whose PIN count is at its limit:
    /// the question (is the PIN empty?) has no answer, yet the owner can still reset the count.
    @Test func anUnfinishedSetDoesNotBlockResettingTheTries() throws {
        var n = 1
        while try cli(["passcode", "set"], Self.new + "\n", abortAfter: n).status == 134, try !passcodeSet() { n += 1 }
        for _ in 0..<10 { try cli(["unlock"], "1111\n") }
        #expect(try cli(["unlock"], Self.new + "\n").stderr.contains("LOCKOUT"))
        let other = tpm.directory + "/other-store"
        let reset = try run(ctl, ["--store", other, "--tcti", tpm.tcti, "passcode", "reset-tries"])
        #expect(reset.status == 0, "\(reset.stderr)")
        #expect(try cli(["unlock"], Self.new + "\n").status == 0)
        #expect(try run(ctl, ["--store", other, "--tcti", tpm.tcti, "unlock"], input: Array((Self.new + "\n").utf8)).status == 0)
    }

    /// The persistent handles in the readers' range (0x81000010–0x8100001F) the TPM holds.
    func readerHandles() throws -> [UInt32] {
        try TPMContext(device: tpm.device).handles(from: 0x8100_0000).filter { (0x8100_0010...0x8100_001F).contains($0) }
    }

    func readerFileHandle(_ directory: String) throws -> UInt32? {
        guard let data = FileManager.default.contents(atPath: directory + "/reader.json") else { return nil }
        return (try JSONSerialization.jsonObject(with: data) as? [String: Any])?["tpmHandle"] as? UInt32
    }

    /// A first enrollment killed mid-way (after its EvictControl, before the reader's file) used to
    /// leave a persistent key nobody owned: 16 such kills and no reader could ever enroll.
    @Test func aKilledFirstEnrollmentLeavesNoKeyBehind() throws {
        #expect(try cli(["passcode", "set"], Self.old + "\n").status == 0)
        let reader = store + ".reader"
        try killAtEveryCommand(["reader", "enroll", "thumb"], Self.old + "\n") { n in
            let fingers = try text(["reader", "list"])
            #expect(fingers == "" || fingers == "thumb\n", "kill \(n): \(fingers)")
            if fingers == "" { #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0, "kill \(n)") }
            // Exactly the reader's key is in the TPM: the killed attempt's key and the deleted reader's are gone.
            #expect(try readerHandles() == [try readerFileHandle(reader)].compactMap { $0 }, "kill \(n)")
            #expect(try cli(["set", "bio-\(n)", "k", "--access-control", "biometryAny"], "bio").status == 0)
            #expect(try text(["get", "bio-\(n)", "k", "--touch", "thumb"]) == "bio", "kill \(n)")
            try FileManager.default.removeItem(atPath: reader)  // a deleted reader: its key comes back at the next enrollment
        }
    }

    @Test func readerRemoveIsAtomic() throws {
        #expect(try cli(["passcode", "set"], Self.old + "\n").status == 0)
        #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0)
        #expect(try cli(["reader", "enroll", "index"], Self.old + "\n").status == 0)
        try killAtEveryCommand(["reader", "remove", "thumb"], Self.old + "\n") { n in
            let fingers = try text(["reader", "list"])
            #expect(fingers == "index\nthumb\n" || fingers == "index\n", "kill \(n): \(fingers)")
            if fingers == "index\n" { #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0) }
        }
    }

    /// Readers give their TPM key back, whether deleted with `reader delete` or with their
    /// directory: more readers than the 16 handles, one after another.
    @Test func deletedReadersGiveTheirHandleBack() throws {
        for round in 0..<18 {
            let reader = tpm.directory + "/reader-\(round)"
            let enrolled = try run(ctl, ["--store", store, "--tcti", tpm.tcti, "--reader", reader, "reader", "enroll", "thumb"])
            #expect(enrolled.status == 0, "reader \(round): \(enrolled.stderr)")
            if round % 2 == 0 {
                #expect(try run(ctl, ["--store", store, "--tcti", tpm.tcti, "--reader", reader, "reader", "delete"]).status == 0)
                #expect(try readerHandles() == [], "reader \(round)")
            } else {
                try FileManager.default.removeItem(atPath: reader)
            }
        }
        #expect(try readerHandles().count == 1)
    }

    @Test func readerDeleteIsAtomic() throws {
        #expect(try cli(["passcode", "set"], Self.old + "\n").status == 0)
        #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0)
        try killAtEveryCommand(["reader", "delete"], Self.old + "\n") { n in
            let fingers = try text(["reader", "list"])
            #expect(fingers == "" || fingers == "thumb\n", "kill \(n): \(fingers)")
            // Deleted: a key left by a kill is recorded, and the next enrollment evicts it.
            if fingers == "" { #expect(try cli(["reader", "enroll", "thumb"], Self.old + "\n").status == 0, "kill \(n)") }
            #expect(try readerHandles() == [try readerFileHandle(store + ".reader")].compactMap { $0 }, "kill \(n)")
        }
    }
}
