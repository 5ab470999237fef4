import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// `keychainctl backup` and `restore` across two devices: two software TPMs, A and B, each with its
/// own store, as two machines would be.
@Suite("backup and restore", .offThePool)
struct BackupTests: TwoDeviceTest {
    typealias Device = CLIDevice

    /// Every level and access control on A; the backup holds exactly the migratable ones, the passcode
    /// asked once for two passcode items; B gets them back with label, protection and dates, and a
    /// passcode item only once B has a passcode.
    @Test func aBackupOfAHoldsEveryMigratableItemAndBGetsThemBackWithTheirProtection() throws {
        let a = try Device(), b = try Device()
        #expect(try cli(a, ["passcode", "set"], "2468\n").status == 0)
        #expect(try cli(a, ["reader", "enroll", "thumb"], "2468\n").status == 0)
        for level in Accessible.allCases {
            #expect(try cli(a, ["set", "svc", "level-\(level.rawValue)", "--accessible", level.rawValue, "--label", "L \(level.rawValue)"],
                            "value of \(level.rawValue)").status == 0)
        }
        #expect(try cli(a, ["set", "svc", "pc1", "--access-control", "passcode"], "pc one").status == 0)
        #expect(try cli(a, ["set", "other", "pc2", "--access-control", "passcode", "--accessible", "whenUnlocked"], "pc two").status == 0)
        #expect(try cli(a, ["set", "svc", "bio", "--access-control", "biometryAny"], "finger").status == 0)
        #expect(try cli(a, ["set", "svc", "bio-or-pc", "--access-control", "biometryAnyOrPasscode"], "finger or pc").status == 0)

        let file = a.tpm.directory + "/backup.kcb"
        // One answer for two passcode items: a second question would get none (SYSTEM_CANCELED).
        let made = try cli(a, ["--json", "backup", "--passphrase-stdin", "--passcode-stdin", "--cost", "interactive", "--out", file],
                           "correct horse\n2468\n")
        #expect(made.status == 0, "\(made.stderr)")
        let report = try JSONDecoder().decode(BackupReport.self, from: Data(made.stdout))
        let migratable = Set(["level-whenUnlocked", "level-afterFirstUnlock", "level-always", "pc1", "pc2"])
        #expect(Set(report.backedUp.map(\.key)) == migratable)
        #expect(Set(report.skipped.map { "\($0.key):\($0.reason.rawValue)" }) == [
            "level-whenUnlockedThisDeviceOnly:thisDeviceOnly", "level-afterFirstUnlockThisDeviceOnly:thisDeviceOnly",
            "level-alwaysThisDeviceOnly:thisDeviceOnly", "level-whenPasscodeSetThisDeviceOnly:thisDeviceOnly",
            "bio:biometric", "bio-or-pc:biometric"])
        // Not one value in clear in the file.
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: file)))
        for value in ["value of always", "pc one", "pc two"] {
            #expect(!bytes.windows(Array(value.utf8)), "\(value) is in the backup in clear")
        }

        // B has no passcode: the passcode items are skipped and said so, never stored with less.
        let first = try cli(b, ["--json", "restore", file, "--passphrase-stdin"], "correct horse\n")
        #expect(first.status == 0, "\(first.stderr)")
        let restored = try JSONDecoder().decode(RestoreReport.self, from: Data(first.stdout))
        #expect(Set(restored.restored.map(\.key)) == ["level-whenUnlocked", "level-afterFirstUnlock", "level-always"])
        #expect(Set(restored.skipped.map { "\($0.key):\($0.reason.rawValue)" }) == ["pc1:passcodeNotSet", "pc2:passcodeNotSet"])
        #expect(try text(b, ["get", "svc", "level-always"]) == "value of always")
        let infoA = try text(a, ["--json", "info", "svc", "level-whenUnlocked"])
        let infoB = try text(b, ["--json", "info", "svc", "level-whenUnlocked"])
        #expect(infoA == infoB, "protection, label and dates come back as they were")
        #expect(try text(b, ["ls", "svc"]).split(separator: "\n").allSatisfy { !$0.contains("ThisDeviceOnly") && !$0.contains("bio") })

        // With a passcode, a second restore brings the passcode items; the others exist and stay.
        #expect(try cli(b, ["passcode", "set"], "1357\n").status == 0)
        let second = try JSONDecoder().decode(RestoreReport.self, from: Data(
            try cli(b, ["--json", "restore", file, "--passphrase-stdin"], "correct horse\n").stdout))
        #expect(Set(second.restored.map(\.key)) == ["pc1", "pc2"])
        #expect(second.skipped.allSatisfy { $0.reason == .exists } && second.skipped.count == 3)
        #expect(try text(b, ["get", "svc", "pc1", "--passcode-stdin"], "1357\n") == "pc one")
        #expect(errorCode(try cli(b, ["--json", "get", "other", "pc2"])) == "INTERACTION_NOT_ALLOWED", "still behind the passcode")
        #expect(try text(b, ["--json", "info", "other", "pc2"]).contains("\"accessControl\":\"passcode\""))
    }

    /// The passphrase is checked (Argon2id, then the key check); any change to the chunks, their order
    /// or their number is DATA_CORRUPTED, and B is left without a single item.
    @Test func aWrongPassphraseOrAChangedFileRestoresNothing() throws {
        let a = try Device(), b = try Device()
        for n in 0..<3 { #expect(try cli(a, ["set", "svc", "k\(n)"], "value \(n)").status == 0) }
        let made = try cli(a, ["backup", "--passphrase-stdin", "--cost", "interactive"], "pass phrase\n")
        #expect(made.status == 0)
        let file = made.stdout
        let path = b.tpm.directory + "/changed.kcb"
        func restore(_ bytes: [UInt8], _ passphrase: String = "pass phrase") throws -> String? {
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            return errorCode(try cli(b, ["--json", "restore", path, "--passphrase-stdin"], passphrase + "\n"))
        }
        #expect(try restore(file, "pass phrasf") == "AUTHENTICATION_FAILED")

        // The chunks: [u32 length][sealed], after the 96-byte header: start, three items, end.
        var chunks: [Range<Int>] = []
        var at = BackupFile.headerLength
        while at < file.count {
            let n = Int(file[at..<at + 4].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
            chunks.append(at..<at + 4 + n)
            at += 4 + n
        }
        #expect(chunks.count == 5 && at == file.count)
        func flipped(_ offset: Int) -> [UInt8] { var f = file; f[offset] ^= 0x01; return f }
        var changed: [String: [UInt8]] = [
            "the stream header": flipped(80),
            "the start chunk": flipped(chunks[0].upperBound - 1),
            "an item": flipped(chunks[2].lowerBound + 10),
            "the end chunk": flipped(chunks[4].upperBound - 1),
            "the end cut off": Array(file[..<chunks[4].lowerBound]),
            "a chunk dropped": Array(file[..<chunks[2].lowerBound] + file[chunks[2].upperBound...]),
            "two items swapped": Array(file[..<chunks[1].lowerBound] + file[chunks[2]] + file[chunks[1]] + file[chunks[3].lowerBound...]),
            "an item repeated": Array(file[..<chunks[2].upperBound] + file[chunks[2]] + file[chunks[2].upperBound...]),
            "bytes after the end": file + [0],
        ]
        // A chunk of another backup with the same passphrase (another salt, another key).
        let other = try cli(a, ["backup", "--passphrase-stdin", "--cost", "interactive"], "pass phrase\n").stdout
        changed["a chunk from another backup"] = Array(file[..<chunks[3].lowerBound] + other[chunks[3]] + file[chunks[4].lowerBound...])
        for (what, bytes) in changed.sorted(by: { $0.key < $1.key }) {
            #expect(try restore(bytes) == "DATA_CORRUPTED", "\(what)")
        }
        #expect(try text(b, ["ls", "svc"]).isEmpty, "nothing was restored")
        #expect(try restore(file) == nil)
        #expect(try text(b, ["ls", "svc"]) == "k0\nk1\nk2\n")
    }

    /// `backup --to B`: no passphrase; the key is sealed to B's TPM (its EK), so B restores it and A
    /// cannot; B restores it only unlocked; a changed header is DATA_CORRUPTED.
    @Test func aBackupSealedToBRestoresOnBAndNotOnA() throws {
        let a = try Device(), b = try Device()
        for n in 0..<3 { #expect(try cli(a, ["set", "svc", "k\(n)", "--accessible", "whenUnlocked"], "value \(n)").status == 0) }
        #expect(try cli(a, ["set", "svc", "tdo", "--accessible", "alwaysThisDeviceOnly"], "stays").status == 0)
        let identity = b.tpm.directory + "/b.identity"
        #expect(try cli(b, ["identity", "--out", identity]).status == 0)
        #expect(try cli(b, ["passcode", "set"], "1357\n").status == 0)
        let file = a.tpm.directory + "/to-b.kcb"
        let made = try cli(a, ["--json", "backup", "--to", identity, "--out", file])
        #expect(made.status == 0, "\(made.stderr)")
        #expect(try JSONDecoder().decode(BackupReport.self, from: Data(made.stdout)).backedUp.count == 3)

        // On A: its TPM cannot open the key.
        let onA = try cli(a, ["--json", "restore", file])
        #expect(errorCode(onA) == "INVALID_ARGUMENT" && String(decoding: onA.stdout, as: UTF8.self).contains("another device"))
        // B locked: the key's policy (whenUnlocked) refuses.
        #expect(try cli(b, ["lock"]).status == 0)
        #expect(errorCode(try cli(b, ["--json", "restore", file])) == "INTERACTION_NOT_ALLOWED")
        #expect(try cli(b, ["ls", "svc"]).stdout.isEmpty)
        // A changed sealed key in the header: refused, nothing restored.
        var bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let changed = b.tpm.directory + "/changed.kcb"
        bytes[200] ^= 0x01
        try Data(bytes).write(to: URL(fileURLWithPath: changed))
        #expect(try cli(b, ["unlock"], "1357\n").status == 0)
        #expect(["DATA_CORRUPTED"].contains(errorCode(try cli(b, ["--json", "restore", changed]))))
        #expect(try cli(b, ["ls", "svc"]).stdout.isEmpty)
        // Unlocked B, no passphrase: every migratable item.
        let restored = try cli(b, ["--json", "restore", file])
        #expect(restored.status == 0, "\(restored.stderr)")
        #expect(try JSONDecoder().decode(RestoreReport.self, from: Data(restored.stdout)).restored.count == 3)
        #expect(try text(b, ["get", "svc", "k2"]) == "value 2")
        #expect(try cli(b, ["has", "svc", "tdo"]).status == 1)
    }

    /// A restore killed after each of its TPM commands in turn leaves whole items only (each item is
    /// one transaction), and the same restore run again completes it: the items already there are
    /// skipped as `exists`, the others restored.
    @Test func aRestoreKilledAtEveryTPMCommandLeavesWholeItemsAndCompletesWhenRunAgain() throws {
        let a = try Device()
        for (n, level) in ["always", "afterFirstUnlock", "whenUnlocked"].enumerated() {
            #expect(try cli(a, ["set", "svc", "k\(n)", "--accessible", level], "value \(n)").status == 0)
        }
        let made = try cli(a, ["backup", "--passphrase-stdin", "--cost", "interactive"], "pass\n")
        let file = a.tpm.directory + "/crash.kcb"
        try Data(made.stdout).write(to: URL(fileURLWithPath: file))
        for n in 1...60 {
            let b = try Device()
            // Provisioned first: a first provisioning killed half-way is another matter (left to its owner).
            #expect(try cli(b, ["status"]).status == 0)
            let killed = try run(ctl, ["--store", b.store, "--tcti", b.tpm.tcti, "restore", file, "--passphrase-stdin"],
                                 input: Array("pass\n".utf8), environment: ["KEYCHAIN_TEST_ABORT_AFTER_TPM_COMMANDS": "\(n)"])
            #expect(killed.status == 134 || killed.status == 0, "kill \(n): \(killed.stderr)")
            for k in 0..<3 {
                let got = try cli(b, ["get", "svc", "k\(k)"])
                #expect(got.status == 1 || got.stdout == Array("value \(k)".utf8), "kill \(n), k\(k): \(got.stderr)")
            }
            if killed.status == 0 { return }
            let again = try cli(b, ["restore", file, "--passphrase-stdin"], "pass\n")
            #expect(again.status == 0, "after kill \(n): \(again.stderr)")
            #expect(try text(b, ["ls", "svc"]) == "k0\nk1\nk2\n")
        }
        Issue.record("the restore never completed")
    }

    /// A token's items stay on the token: a backup leaves them out and says so.
    @Test func aBackupLeavesTheTokensItemsOut() throws {
        let t = try TokenBackendTests.Token()
        #expect(try t.cli(["set", "svc", "on-token", "--key-storage", "strongbox"], input: Array("token value".utf8)).status == 0)
        #expect(try t.cli(["set", "svc", "on-tpm"], input: Array("tpm value".utf8)).status == 0)
        let made = try t.cli(["--json", "backup", "--passphrase-stdin", "--cost", "interactive", "--out", t.tpm.directory + "/b.kcb"],
                             input: Array("pass\n".utf8))
        #expect(made.status == 0, "\(made.stderr)")
        let report = try JSONDecoder().decode(BackupReport.self, from: Data(made.stdout))
        #expect(report.backedUp.map(\.key) == ["on-tpm"])
        #expect(report.skipped.map { "\($0.key):\($0.reason.rawValue)" } == ["on-token:token"])
    }

    /// `whenUnlocked` items need the device unlocked: a locked device writes no byte of a backup.
    @Test func aLockedDeviceWritesNoBackupOfWhenUnlockedItems() throws {
        let a = try Device()
        #expect(try cli(a, ["passcode", "set"], "2468\n").status == 0)
        #expect(try cli(a, ["set", "svc", "u", "--accessible", "whenUnlocked"], "unlocked only").status == 0)
        #expect(try cli(a, ["lock"]).status == 0)
        let refused = try cli(a, ["backup", "--passphrase-stdin", "--cost", "interactive"], "pass phrase\n")
        #expect(refused.status == 3 && refused.stdout.isEmpty && refused.stderr.contains("INTERACTION_NOT_ALLOWED"), "\(refused.stderr)")
        // An afterFirstUnlock-only backup needs no unlock now.
        #expect(try cli(a, ["set", "only", "f", "--accessible", "afterFirstUnlock"], "first").status == 0)
        #expect(try cli(a, ["backup", "--passphrase-stdin", "--service", "only", "--cost", "interactive"], "pass phrase\n").status == 0)
        #expect(try cli(a, ["unlock"], "2468\n").status == 0)
        #expect(try cli(a, ["backup", "--passphrase-stdin", "--cost", "interactive"], "pass phrase\n").stdout.count > 96)
    }
}

/// The backup parser against arbitrary input: clear errors only, never a crash and never a success.
@Suite("backup file parser", .offThePool)
struct BackupParserFuzzTests {
    func written(_ items: Int) throws -> [UInt8] {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("kcb-\(UUID().uuidString)").path
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0o600)
        defer { close(fd); unlink(path) }
        // The cheapest Argon2id libsodium accepts: this test is about the parser, not the cost.
        let writer = try BackupWriter(fd: fd, passphrase: bytes("fuzz"), opsLimit: 1, memLimit: 8192)
        for n in 0..<items {
            try writer.append(BackupItem(service: "svc", key: "k\(n)", accessible: .always, accessControl: .none, authValidity: 0,
                                         label: n % 2 == 0 ? "label" : nil, created: 1, modified: 2, value: bytes("v\(n)")))
        }
        try writer.finish()
        lseek(fd, 0, SEEK_SET)
        var out = [UInt8](repeating: 0, count: 1 << 16)
        let n = read(fd, &out, out.count)
        return Array(out[..<n])
    }

    func readAll(_ contents: [UInt8]) -> Result<Int, KeychainError> {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("kcb-\(UUID().uuidString)").path
        #expect(FileManager.default.createFile(atPath: path, contents: Data(contents)))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        do throws(KeychainError) {
            let reader = try BackupReader(fd: fd, passphrase: bytes("fuzz"))
            var n = 0
            while try reader.next() != nil { n += 1 }
            return .success(n)
        } catch {
            return .failure(error)
        }
    }

    @Test func everyMutationOfAFileIsRefusedWithAClearCode() throws {
        let file = try written(4)
        #expect(try readAll(file).get() == 4)
        var rng = SystemRandomNumberGenerator()
        // INVALID_ARGUMENT: a kind byte changed to 2 ("sealed to a device") asks for no passphrase.
        let allowed: Set<KeychainError.Code> = [.dataCorrupted, .authenticationFailed, .unsupported, .invalidArgument]
        for round in 0..<600 {
            var f = file
            switch round % 4 {
            case 0: f[Int.random(in: 0..<f.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            case 1: f = Array(f[..<Int.random(in: 0..<f.count, using: &rng)])
            case 2: f.insert(UInt8.random(in: 0...255, using: &rng), at: Int.random(in: 0...f.count, using: &rng))
            default:
                let at = Int.random(in: 0..<f.count - 4, using: &rng)
                f.replaceSubrange(at..<at + 4, with: (0..<4).map { _ in UInt8.random(in: 0...255, using: &rng) })
                if f == file { continue }
            }
            switch readAll(f) {
            case .success: Issue.record("a changed file was read to its end (round \(round))")
            case .failure(let error):
                #expect(allowed.contains(error.code), "round \(round): \(error)")
                #expect(!error.message.isEmpty)
            }
        }
        for length in [0, 1, 8, 95, 96, 97, 100] {
            #expect((try? readAll(Array(repeating: 0x41, count: length)).get()) == nil)
        }
    }

    /// The parser of an authenticated chunk's body, on random and truncated bodies.
    @Test func chunkBodiesThatDoNotParseAreDataCorrupted() {
        let good = BackupFile.itemBody(BackupItem(service: "s", key: "k", accessible: .whenUnlocked, accessControl: .passcode,
                                                 authValidity: 5, label: "l", created: 3, modified: 4, value: bytes("value")))
        guard case .item(let item)? = try? BackupFile.parse(good) else { Issue.record("a good body does not parse"); return }
        #expect(item.key == "k" && item.authValidity == 5 && item.label == "l" && item.value == bytes("value"))
        let raw = good.withUnsafeBytes { Array($0) }
        for cut in 0..<raw.count {
            #expect(throws: KeychainError(.dataCorrupted)) { try BackupFile.parse(SecureBytes(copying: raw[..<cut])) }
        }
        for _ in 0..<2000 {
            let noise = (0..<Int.random(in: 0...64)).map { _ in UInt8.random(in: 0...255) }
            do { _ = try BackupFile.parse(SecureBytes(copying: noise)) } catch {
                #expect(error.code == .dataCorrupted)
            }
        }
    }
}

extension Array where Element == UInt8 {
    func windows(_ needle: [UInt8]) -> Bool {
        guard count >= needle.count else { return false }
        return (0...(count - needle.count)).contains { self[$0..<$0 + needle.count].elementsEqual(needle) }
    }
}
