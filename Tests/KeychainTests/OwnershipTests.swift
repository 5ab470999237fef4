import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// Taking ownership of the TPM: with an empty owner authorization anyone with TPM access undefines
/// the passcode's PIN index and defines their own (same name, their authValue), passes PolicySecret
/// and reads passcode items; with an empty lockout authorization anyone clears the TPM.
@Suite("TPM ownership", .offThePool)
struct OwnershipTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }
    static let pinIndex = "0x01004B50"

    func cli(_ tpm: SoftwareTPM, _ args: [String], input: [UInt8] = []) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", tpm.directory + "/store", "--tcti", tpm.tcti, "--reader", "none"] + args, input: input)
    }

    func tools(_ tpm: SoftwareTPM, _ tool: String, _ args: [String]) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run("/usr/bin/" + tool, args, environment: ["TPM2TOOLS_TCTI": tpm.tcti])
    }

    func statusJSON(_ tpm: SoftwareTPM) throws -> [String: Any] {
        let out = try cli(tpm, ["--json", "status"])
        let body = try JSONSerialization.jsonObject(with: Data(out.stdout)) as? [String: Any]
        return try #require(body?["device"] as? [String: Any], "status --json: \(out.stderr)")
    }

    func mode(_ path: String) -> mode_t {
        var info = stat()
        return lstat(path, &info) == 0 ? info.st_mode & 0o7777 : 0
    }

    /// After `init` with out files, the TPM itself refuses the attacks that an empty authorization allowed.
    @Test func initTakesOwnershipSoTheTPMRefusesUndefiningThePINIndexAndClear() throws {
        let tpm = try SoftwareTPM()
        let owner = tpm.directory + "/owner.auth", lockout = tpm.directory + "/lockout.auth"
        let initialized = try cli(tpm, ["init", "--owner-auth-out", owner, "--lockout-auth-out", lockout])
        #expect(initialized.status == 0, "\(initialized.stderr)")
        for file in [owner, lockout] {
            #expect(mode(file) == 0o600)
            let text = try String(contentsOfFile: file, encoding: .utf8)
            #expect(text.hasPrefix("hex:") && text.count == 4 + 64 + 1, "32 random bytes as tpm2-tools reads them")
        }
        #expect(try String(contentsOfFile: owner, encoding: .utf8) != String(contentsOfFile: lockout, encoding: .utf8))
        let status = try statusJSON(tpm)
        #expect(status["ownerAuthorizationSet"] as? Bool == true && status["lockoutAuthorizationSet"] as? Bool == true)
        #expect((status["warnings"] as? [String]) == [])
        #expect(try cli(tpm, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        // The attacks, with the empty authorization an attacker would try: refused by the TPM.
        let undefine = try tools(tpm, "tpm2_nvundefine", ["-C", "o", Self.pinIndex])
        #expect(undefine.status != 0 && undefine.stderr.contains("authorization failure"), "\(undefine.stderr)")
        let reset = try tools(tpm, "tpm2_nvwrite", ["-C", "o", "-i", "/dev/null", Self.pinIndex])
        #expect(reset.status != 0)
        let clear = try tools(tpm, "tpm2_clear", ["-c", "l"])
        #expect(clear.status != 0 && clear.stderr.contains("(0x98E)"), "\(clear.stderr)")
        // The administrator's file is the authorization: it reads back exactly as tpm2-tools uses it.
        let ownerAuth = try String(contentsOfFile: owner, encoding: .utf8).trimmingCharacters(in: .newlines)
        #expect(try tools(tpm, "tpm2_nvdefine", ["-C", "o", "-P", ownerAuth, "-s", "4", "0x01500010"]).status == 0)
        #expect(try cli(tpm, ["passcode", "reset-tries", "--owner-auth-file", owner]).status == 0)
        // Items keep working; a second init takes nothing and overwrites nothing.
        #expect(try cli(tpm, ["set", "s", "k"], input: [7]).status == 0)
        #expect(try cli(tpm, ["get", "s", "k"]).stdout == [7])
        let before = try Data(contentsOf: URL(fileURLWithPath: owner))
        #expect(try cli(tpm, ["init", "--owner-auth-file", owner]).status == 0)
        #expect(try Data(contentsOf: URL(fileURLWithPath: owner)) == before)
    }

    /// HierarchyChangeAuth runs in a session salted to the SRK that encrypts the new value: the pcap
    /// TCTI's record of `init` never holds the bytes written to the out files.
    @Test func theNewAuthorizationsNeverCrossTheTPMConnectionInClear() throws {
        let tpm = try SoftwareTPM()
        let capture = tpm.directory + "/init.pcap"
        let owner = tpm.directory + "/owner.auth", lockout = tpm.directory + "/lockout.auth"
        let initialized = try run(ctl, ["--store", tpm.directory + "/store", "--tcti", "pcap:" + tpm.tcti, "--reader", "none",
                                        "init", "--owner-auth-out", owner, "--lockout-auth-out", lockout],
                                  environment: ["TCTI_PCAP_FILE": capture])
        #expect(initialized.status == 0, "\(initialized.stderr)")
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: capture)))
        #expect(bytes.count > 2_000)
        for file in [owner, lockout] {
            let hex = Array(try String(contentsOfFile: file, encoding: .utf8).dropFirst(4).prefix(64))
            let value = stride(from: 0, to: 64, by: 2).map { UInt8(String(hex[$0...$0 + 1]), radix: 16)! }
            let found = (0...(bytes.count - value.count)).contains { bytes[$0..<$0 + value.count].elementsEqual(value) }
            #expect(!found, "\(file)'s authorization crossed the TPM connection in clear")
        }
    }

    /// After `init`, the owner-authorized commands of later operations (the passcode count reset,
    /// the reader's persistent key) authorize in an HMAC session salted to the SRK: the owner
    /// authorization itself never crosses the connection, as it would in a password session.
    @Test func theOwnerAuthorizationNeverCrossesTheConnectionInLaterOwnerCommands() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store", capture = tpm.directory + "/owner.pcap"
        let owner = tpm.directory + "/owner.auth", lockout = tpm.directory + "/lockout.auth"
        let binary = ctl
        func keychainctl(_ args: [String], _ input: String = "") throws -> (status: Int32, stdout: [UInt8], stderr: String) {
            try run(binary, ["--store", store, "--tcti", "pcap:" + tpm.tcti] + args, input: Array(input.utf8),
                    environment: ["TCTI_PCAP_FILE": capture])
        }
        #expect(try keychainctl(["init", "--owner-auth-out", owner, "--lockout-auth-out", lockout]).status == 0)
        #expect(try keychainctl(["passcode", "set"], "2468\n").status == 0)
        let enrolled = try keychainctl(["reader", "enroll", "thumb", "--owner-auth-file", owner], "2468\n")
        #expect(enrolled.status == 0, "\(enrolled.stderr)")
        let reset = try keychainctl(["passcode", "reset-tries", "--owner-auth-file", owner])
        #expect(reset.status == 0, "\(reset.stderr)")
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: capture)))
        let hex = Array(try String(contentsOfFile: owner, encoding: .utf8).dropFirst(4).prefix(64))
        let value = stride(from: 0, to: 64, by: 2).map { UInt8(String(hex[$0...$0 + 1]), radix: 16)! }
        #expect(bytes.count > 5_000)
        let found = (0...(bytes.count - value.count)).contains { bytes[$0..<$0 + value.count].elementsEqual(value) }
        #expect(!found, "the owner authorization crossed the TPM connection in clear")
    }

    /// The control: with the authorizations left empty (as the flag allows), the same tpm2-tools
    /// commands succeed, and status says what that costs, in words and in JSON.
    @Test func anEmptyOwnerAuthorizationIsAllowedOnlyOnRequestAndStatusWarns() throws {
        let tpm = try SoftwareTPM()
        let refused = try cli(tpm, ["init"])
        #expect(refused.status == 2)
        #expect(refused.stderr.contains("INVALID_ARGUMENT") && refused.stderr.contains("owner authorization is empty")
                && refused.stderr.contains("--owner-auth-out FILE") && refused.stderr.contains("--lockout-auth-out FILE")
                && refused.stderr.contains("--allow-empty-owner-auth"), "\(refused.stderr)")
        #expect(try statusJSON(tpm)["ownerAuthorizationSet"] as? Bool == false)

        #expect(try cli(tpm, ["init", "--allow-empty-owner-auth"]).status == 0)
        let text = String(decoding: try cli(tpm, ["status"]).stdout, as: UTF8.self)
        #expect(text.contains("owner authorization: EMPTY\nlockout authorization: EMPTY"))
        #expect(text.contains("warning: The TPM's owner authorization is empty: anyone who can open the TPM can replace the passcode's PIN index"))
        #expect(text.contains("warning: The TPM's lockout authorization is empty: anyone who can open the TPM can clear it"))
        let status = try statusJSON(tpm)
        #expect(status["ownerAuthorizationSet"] as? Bool == false && status["lockoutAuthorizationSet"] as? Bool == false)
        #expect((status["warnings"] as? [String])?.count == 2)
        // The attack is real when the authorization is empty.
        #expect(try tools(tpm, "tpm2_nvundefine", ["-C", "o", Self.pinIndex]).status == 0)
        #expect(try tools(tpm, "tpm2_clear", ["-c", "l"]).status == 0)
    }

    /// Out files are never overwritten nor followed through a link, and each is written before the
    /// TPM takes its value: a file that cannot be written leaves that authorization empty, never lost.
    @Test func outFilesAreNeverOverwrittenAndWrittenBeforeTheTPMChanges() throws {
        let tpm = try SoftwareTPM()
        let existing = tpm.directory + "/existing", fresh = tpm.directory + "/fresh"
        try "keep me\n".write(toFile: existing, atomically: false, encoding: .utf8)
        let taken = try cli(tpm, ["init", "--owner-auth-out", fresh, "--lockout-auth-out", existing])
        #expect(taken.status == 2 && taken.stderr.contains("already exists"), "\(taken.stderr)")
        #expect(try String(contentsOfFile: existing, encoding: .utf8) == "keep me\n")
        #expect(!FileManager.default.fileExists(atPath: fresh), "nothing is written when one path is taken")
        // A planted link to a file the attacker wants overwritten (or read back) is not followed.
        let link = tpm.directory + "/link"
        #expect(symlink(existing, link) == 0)
        #expect(try cli(tpm, ["init", "--owner-auth-out", link, "--lockout-auth-out", fresh]).status == 2)
        #expect(try String(contentsOfFile: existing, encoding: .utf8) == "keep me\n")
        var status = try statusJSON(tpm)
        #expect(status["ownerAuthorizationSet"] as? Bool == false && status["lockoutAuthorizationSet"] as? Bool == false)
        // The lockout file cannot be written: the owner is taken, the lockout stays empty (not set to a lost value).
        let owner = tpm.directory + "/owner.auth"
        let failed = try cli(tpm, ["init", "--owner-auth-out", owner, "--lockout-auth-out", tpm.directory + "/missing/dir/lockout"])
        #expect(failed.status == 3 && failed.stderr.contains("STORAGE_ERROR"), "\(failed.stderr)")
        status = try statusJSON(tpm)
        #expect(status["ownerAuthorizationSet"] as? Bool == true && status["lockoutAuthorizationSet"] as? Bool == false)
        #expect(mode(owner) == 0o600)
        #expect(try tools(tpm, "tpm2_clear", ["-c", "l"]).status == 0, "the lockout authorization was never changed: still empty")
    }

    /// The embedded software TPM takes its own random authorizations on first start, kept 0600 in its
    /// 0700 directory; the library uses them, and the TPM refuses the empty ones.
    @Test func theEmbeddedTPMGetsRandomAuthorizationsInItsOwnDirectory() async throws {
        let embedded = EmbeddedStore("keychain-owner")
        defer { embedded.remove() }
        let store = embedded.directory
        let device = KeychainDevice(configuration: embedded.configuration)
        let status = try await device.initialize()
        #expect(status.ownerAuthorizationSet && status.lockoutAuthorizationSet && status.warnings.isEmpty)
        #expect(mode(store + "/swtpm") == 0o700)
        #expect(mode(store + "/swtpm/owner.auth") == 0o600 && mode(store + "/swtpm/lockout.auth") == 0o600)
        // Owner-authorized work of the library (the passcode's retry count) uses the kept value.
        try await device.setPasscode(bytes("2468"))
        try await device.resetPasscodeTries()
        let env = ["TPM2TOOLS_TCTI": status.tpm]
        let undefine = try run("/usr/bin/tpm2_nvundefine", ["-C", "o", Self.pinIndex], environment: env)
        #expect(undefine.status != 0 && undefine.stderr.contains("authorization failure"), "\(undefine.stderr)")
        #expect(try run("/usr/bin/tpm2_clear", ["-c", "l"], environment: env).status != 0)
        // A restart (TPM reset) keeps them.
        EmbeddedTPM.reboot(storeDirectory: store)
        try await device.resetPasscodeTries()
        #expect(try await device.status().ownerAuthorizationSet)
    }

    /// A crash after the file was written and before the TPM took the value: the next start applies
    /// the kept file rather than making a new one.
    @Test func theEmbeddedTPMAppliesAKeptFileItHasNotTakenYet() async throws {
        let embedded = EmbeddedStore("keychain-owner")
        defer { embedded.remove() }
        let store = embedded.directory
        try FileManager.default.createDirectory(atPath: store + "/swtpm", withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let kept = "hex:" + String(repeating: "5a", count: 32)
        #expect(FileManager.default.createFile(atPath: store + "/swtpm/owner.auth", contents: Data((kept + "\n").utf8),
                                               attributes: [.posixPermissions: 0o600]))
        let status = try await KeychainDevice(configuration: embedded.configuration).initialize()
        #expect(status.ownerAuthorizationSet)
        let env = ["TPM2TOOLS_TCTI": status.tpm]
        #expect(try run("/usr/bin/tpm2_nvdefine", ["-C", "o", "-P", kept, "-s", "4", "0x01500011"], environment: env).status == 0)
        #expect(try String(contentsOfFile: store + "/swtpm/owner.auth", encoding: .utf8) == kept + "\n")
    }

    /// `status` names a missing or substituted storage root key in words and in JSON, before any read fails.
    @Test func statusReportsAMissingOrReplacedStorageRootKey() async throws {
        let tpm = try SoftwareTPM()
        #expect(try cli(tpm, ["set", "s", "k"], input: [1]).status == 0)
        #expect(try statusJSON(tpm)["storageRootKey"] as? String == "pinned")
        #expect(try tools(tpm, "tpm2_evictcontrol", ["-C", "o", "-c", "0x81000001"]).status == 0)
        var json = try statusJSON(tpm)
        #expect(json["storageRootKey"] as? String == "missing")
        #expect((json["warnings"] as? [String])?.contains { $0.contains("storage root key at 0x81000001 is missing") } == true)
        var text = String(decoding: try cli(tpm, ["status"]).stdout, as: UTF8.self)
        #expect(text.contains("storage root key: missing\n"))
        // A different restricted key at the same handle: the name no longer matches the pinned one.
        let ctx = tpm.directory + "/other.ctx"
        #expect(try tools(tpm, "tpm2_createprimary", ["-C", "o", "-G", "rsa", "-c", ctx]).status == 0)
        #expect(try tools(tpm, "tpm2_evictcontrol", ["-C", "o", "-c", ctx, "0x81000001"]).status == 0)
        json = try statusJSON(tpm)
        #expect(json["storageRootKey"] as? String == "replaced")
        text = String(decoding: try cli(tpm, ["status"]).stdout, as: UTF8.self)
        #expect(text.contains("storage root key: replaced\n")
                && text.contains("warning: The TPM's storage root key at 0x81000001 is not the one this store was made with"))
        // The library says the same.
        let status = try await KeychainDevice(configuration: tpm.configuration()).status()
        #expect(status.storageRootKey == .replaced)
    }
}
