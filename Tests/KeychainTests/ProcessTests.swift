import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Synchronization
import Testing
import TPM2

/// `keychainctl` as scripts use it: separate processes on one store and one TPM.
@Suite("keychainctl processes", .offThePool)
struct ProcessTests {
    var ctl: String { buildDirectory.appendingPathComponent("keychainctl").path }

    func cli(_ tpm: SoftwareTPM, _ store: String, _ args: [String], input: [UInt8] = [], tcti: String? = nil,
             environment: [String: String] = [:]) throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run(ctl, ["--store", store, "--tcti", tcti ?? tpm.tcti] + args, input: input, environment: environment)
    }

    @Test func setAndGetKeepBytesExactlyWithTheDocumentedExitCodes() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let value: [UInt8] = [0, 1, 2, 0x0A, 0xFF, 0x0D, 0x0A] + Array("tail\n\n".utf8)
        #expect(try cli(tpm, store, ["set", "svc", "key", "--label", "L"], input: value).status == 0)
        let got = try cli(tpm, store, ["get", "svc", "key"])
        #expect(got.status == 0 && got.stdout == value)
        #expect(try cli(tpm, store, ["has", "svc", "key"]).status == 0)
        #expect(try cli(tpm, store, ["has", "svc", "nope"]).status == 1)
        #expect(try cli(tpm, store, ["get", "svc", "nope"]).status == 1)
        #expect(String(decoding: try cli(tpm, store, ["ls", "svc"]).stdout, as: UTF8.self) == "key\n")
        let bad = try cli(tpm, store, ["set", "svc", "k2", "--accessible", "sometimes"], input: [1])
        #expect(bad.status == 2)
        #expect(bad.stderr.hasPrefix("keychainctl: INVALID_ARGUMENT: Invalid accessible"))
        let json = try cli(tpm, store, ["--json", "set", "svc", "k2", "--access-control", "biometryAny"], input: [1])
        #expect(json.status == 3)
        let body = try JSONSerialization.jsonObject(with: Data(json.stdout)) as? [String: [String: String]]
        #expect(body?["error"]?["code"] == "PASSCODE_NOT_SET", "a reader exists by default; no passcode is set")
        let noReader = try cli(tpm, store, ["--json", "--reader", "none", "set", "svc", "k2", "--access-control", "biometryAny"], input: [1])
        let noReaderBody = try JSONSerialization.jsonObject(with: Data(noReader.stdout)) as? [String: [String: String]]
        #expect(noReader.status == 3 && noReaderBody?["error"]?["code"] == "BIOMETRY_NOT_AVAILABLE")
        #expect(try cli(tpm, store, ["rm", "svc", "key"]).status == 0)
        #expect(try cli(tpm, store, ["rm", "svc", "key"]).status == 1)
        #expect(try cli(tpm, store, ["frobnicate"]).status == 2)
    }

    /// A device provisioned with an owner authorization: `init` takes it from a file or stdin (never
    /// argv), and without it nothing is provisioned.
    @Test func initTakesTheOwnerAuthorizationFromAFileOrStdin() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let env = ["TPM2TOOLS_TCTI": tpm.tcti]
        try "owner-secret-4711\n".write(toFile: tpm.directory + "/owner", atomically: true, encoding: .utf8)
        #expect(try run("/usr/bin/tpm2_changeauth", ["-c", "owner", "owner-secret-4711"], environment: env).status == 0)
        let refused = try cli(tpm, store, ["--json", "init"])
        #expect(refused.status == 3)
        #expect(String(decoding: refused.stdout, as: UTF8.self).contains("AUTHENTICATION_FAILED"))
        // The owner's is set; the lockout's is empty: init sets it, written to a file first.
        #expect(try cli(tpm, store, ["init", "--owner-auth-file", tpm.directory + "/owner",
                                     "--lockout-auth-out", tpm.directory + "/lockout"]).status == 0)
        #expect(try cli(tpm, store, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        // The reader's first enrollment makes a persistent key: the owner authorization again, on stdin.
        #expect(try cli(tpm, store, ["reader", "enroll", "thumb", "--owner-auth-file", tpm.directory + "/owner"],
                        input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["passcode", "reset-tries"]).status == 3)
        #expect(try cli(tpm, store, ["passcode", "reset-tries", "--owner-auth-file", "-"],
                        input: Array("owner-secret-4711\n".utf8)).status == 0)
    }

    /// The pcap TCTI records every command and response; the passcode must be in none of them.
    @Test func thePasscodeNeverCrossesTheTPMConnectionInClear() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let capture = tpm.directory + "/tpm.pcap"
        let tcti = "pcap:" + tpm.tcti
        let env = ["TCTI_PCAP_FILE": capture]
        let pin = "739146285", newPin = "582064913"
        #expect(try cli(tpm, store, ["passcode", "set"], input: Array("\(pin)\n".utf8), tcti: tcti, environment: env).status == 0)
        #expect(try cli(tpm, store, ["lock"], tcti: tcti, environment: env).status == 0)
        #expect(try cli(tpm, store, ["unlock"], input: Array("123456\n".utf8), tcti: tcti, environment: env).status == 3)
        #expect(try cli(tpm, store, ["unlock"], input: Array("\(pin)\n".utf8), tcti: tcti, environment: env).status == 0)
        #expect(try cli(tpm, store, ["set", "s", "k", "--accessible", "whenUnlocked"], input: Array("the-value-ZQXJ".utf8), tcti: tcti, environment: env).status == 0)
        #expect(try cli(tpm, store, ["get", "s", "k"], tcti: tcti, environment: env).stdout == Array("the-value-ZQXJ".utf8))
        // A passcode-protected item: the read proves the PIN with PolicySecret in a salted session.
        #expect(try cli(tpm, store, ["set", "s", "p", "--access-control", "passcode"], input: Array("pin-guarded-WVKD".utf8), tcti: tcti, environment: env).status == 0)
        #expect(try cli(tpm, store, ["get", "s", "p", "--passcode-stdin"], input: Array("\(pin)\n".utf8), tcti: tcti, environment: env).stdout == Array("pin-guarded-WVKD".utf8))
        #expect(try cli(tpm, store, ["passcode", "change"], input: Array("\(pin)\n\(newPin)\n".utf8), tcti: tcti, environment: env).status == 0)
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: capture)))
        func contains(_ needle: [UInt8]) -> Bool {
            guard bytes.count >= needle.count else { return false }
            return (0...(bytes.count - needle.count)).contains { bytes[$0..<$0 + needle.count].elementsEqual(needle) }
        }
        // The control: the capture holds real traffic (the state index's handle appears in clear).
        #expect(bytes.count > 5_000)
        #expect(contains([0x01, 0x00, 0x4B, 0x51]))
        for secret in [pin, newPin, "the-value-ZQXJ", "pin-guarded-WVKD"] {
            #expect(!contains(Array(secret.utf8)), "\(secret) crossed the TPM connection in clear")
        }
    }

    /// A recorded HMAC keyed by a short PIN could be brute-forced offline, past the TPM's retry limit,
    /// unless its session is salted: every session that carries the passcode (PolicySecret on the
    /// PIN index, NV_ChangeAuth) is salted to the SRK, the new passcode crosses encrypted, and every
    /// Unseal's response is parameter-encrypted in a salted session.
    @Test func everySessionCarryingThePasscodeIsSaltedAndEveryUnsealEncrypted() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let capturePath = tpm.directory + "/sessions.pcap"
        let tcti = "pcap:" + tpm.tcti
        let env = ["TCTI_PCAP_FILE": capturePath]
        func ctl(_ args: [String], _ input: String = "") throws -> Int32 {
            try cli(tpm, store, args, input: Array(input.utf8), tcti: tcti, environment: env).status
        }
        #expect(try ctl(["passcode", "set"], "4711\n") == 0)
        #expect(try ctl(["lock"]) == 0)
        #expect(try ctl(["unlock"], "1234\n") == 3)
        #expect(try ctl(["unlock"], "4711\n") == 0)
        #expect(try ctl(["set", "s", "p", "--access-control", "passcode"], "guarded") == 0)
        #expect(try ctl(["set", "s", "u", "--accessible", "whenUnlocked"], "plain") == 0)
        #expect(try ctl(["get", "s", "p", "--passcode-stdin"], "4711\n") == 0)
        #expect(try ctl(["get", "s", "u"]) == 0)
        #expect(try ctl(["passcode", "change"], "4711\n8080\n") == 0)

        let capture = try TPMCapture(path: capturePath)
        let srk: UInt32 = 0x8100_0001, pinIndex: UInt32 = 0x0100_4B50
        let provingThePIN = capture.commands.filter { $0.code == CommandCode.policySecret && $0.handles.first == pinIndex }
        let changingThePIN = capture.commands.filter { $0.code == CommandCode.nvChangeAuth && $0.handles.first == pinIndex }
        let unseals = capture.commands.filter { $0.code == CommandCode.unseal }
        // The control: the capture holds each kind of command (wrong and right unlocks, a passcode read, a change).
        #expect(provingThePIN.count >= 4 && changingThePIN.count >= 1 && unseals.count >= 2,
                "\(provingThePIN.count) PolicySecret, \(changingThePIN.count) NV_ChangeAuth, \(unseals.count) Unseal")
        for command in provingThePIN {
            #expect(command.sessions.first??.saltedWith == srk, "a PolicySecret on the PIN in a session not salted to the SRK")
        }
        for command in changingThePIN {
            #expect(command.sessions.first??.saltedWith == srk, "NV_ChangeAuth in a session not salted to the SRK")
            #expect(command.authorizations.first?.decrypts == true, "the new passcode crossed unencrypted")
        }
        for command in unseals {
            #expect(command.sessions.first??.saltedWith == srk, "an Unseal in a session not salted to the SRK")
            #expect(command.authorizations.first?.encrypts == true, "an Unseal response not parameter-encrypted")
        }
    }

    /// Someone with TPM access puts their own restricted key at the SRK's handle and flushes every
    /// transient copy: new processes name the substituted storage root key, and seal nothing to it.
    @Test func aSubstitutedStorageRootKeyIsNamedAndNothingIsSealedToIt() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let env = ["TPM2TOOLS_TCTI": tpm.tcti]
        #expect(try cli(tpm, store, ["set", "old", "k", "--accessible", "always"], input: [1]).status == 0)
        let substitute = tpm.directory + "/substitute.ctx"
        #expect(try run("/usr/bin/tpm2_evictcontrol", ["-C", "o", "-c", "0x81000001"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_createprimary", ["-C", "o", "-G", "ecc256", "-a",
                        "restricted|decrypt|fixedtpm|fixedparent|sensitivedataorigin|userwithauth", "-c", substitute],
                        environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_evictcontrol", ["-C", "o", "-c", substitute, "0x81000001"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_flushcontext", ["-t"], environment: env).status == 0)
        #expect(try run("/usr/bin/tpm2_flushcontext", ["-l"], environment: env).status == 0)
        for args in [["get", "old", "k"], ["set", "new", "k", "--accessible", "always"]] {
            let result = try cli(tpm, store, args, input: [2])
            #expect(result.status == 3, "\(args[0]) with a substituted SRK")
            #expect(result.stderr.contains("HARDWARE_UNAVAILABLE") && result.stderr.contains("storage root key"),
                    "\(args[0]): \(result.stderr)")
        }
        #expect(try cli(tpm, store, ["has", "new", "k"]).status == 1, "nothing was stored under the substitute")
        #expect(try cli(tpm, store, ["has", "old", "k"]).status == 0, "the old item is kept")
    }

    /// Someone with the store file edits it with SQLite while the keychain is at rest: an item renamed
    /// within its service, or a whole storage (its wrapping key and an item) copied under another
    /// service name, decrypts with the right keys but is refused, because service and key are in the
    /// associated data of the item's encryption.
    @Test func itemsMovedInTheStoreFileToAnotherKeyOrServiceAreDataCorrupted() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        #expect(try cli(tpm, store, ["set", "bank", "pin", "--accessible", "always"], input: Array("1111".utf8)).status == 0)
        #expect(try cli(tpm, store, ["set", "bank", "token", "--accessible", "always"], input: Array("2222".utf8)).status == 0)
        let edit = """
            import sqlite3, sys
            db = sqlite3.connect(sys.argv[1])
            db.execute("UPDATE items SET key = 'renamed' WHERE service = 'bank' AND key = 'pin'")
            db.execute("INSERT INTO wrapping_keys(service, protection, public_key, sealed_public, sealed_private, policy, created) SELECT 'shop', protection, public_key, sealed_public, sealed_private, policy, created FROM wrapping_keys WHERE service = 'bank'")
            db.execute("INSERT INTO items SELECT 'shop', key, protection, label, created, modified, writer_public, salt, nonce, ciphertext FROM items WHERE service = 'bank' AND key = 'token'")
            db.commit()
            db.close()
            """
        let edited = try run("/usr/bin/python3", ["-c", edit, store + "/keychain.db"])
        #expect(edited.status == 0, "\(edited.stderr)")
        for (service, key) in [("bank", "renamed"), ("shop", "token")] {
            let got = try cli(tpm, store, ["get", service, key])
            #expect(got.status == 3 && got.stderr.contains("DATA_CORRUPTED"), "\(service)/\(key): \(got.stderr)")
            #expect(got.stdout.isEmpty)
        }
        // The control: the untouched item of the same storage still reads.
        #expect(try cli(tpm, store, ["get", "bank", "token"]).stdout == Array("2222".utf8))
    }

    /// After a new finger, someone who can write the store points a CurrentSet key's stored policy at
    /// today's enrollment set, so that this library's own check passes and the reader signs: the TPM
    /// still refuses, because the set the key was sealed to is in PolicySigned's policyRef.
    @Test func aCurrentSetKeyEditedToTodaysEnrollmentSetStillDoesNotOpen() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        #expect(try cli(tpm, store, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["reader", "enroll", "thumb"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["set", "s", "k", "--access-control", "biometryCurrentSet"],
                        input: Array("sealed-to-thumb".utf8)).status == 0)
        #expect(try cli(tpm, store, ["reader", "enroll", "intruder"], input: Array("2468\n".utf8)).status == 0)
        let edit = """
            import json, sqlite3, sys
            reader = json.load(open(sys.argv[2] + "/reader.json"))
            db = sqlite3.connect(sys.argv[1])
            (policy,) = db.execute("SELECT policy FROM wrapping_keys WHERE service = 's'").fetchone()
            policy = json.loads(policy)
            policy["biometry"]["policyRef"] = reader["enrollmentSet"]
            db.execute("UPDATE wrapping_keys SET policy = ? WHERE service = 's'", (json.dumps(policy).encode(),))
            db.commit()
            db.close()
            """
        let edited = try run("/usr/bin/python3", ["-c", edit, store + "/keychain.db", store + ".reader"])
        #expect(edited.status == 0, "\(edited.stderr)")
        for finger in ["intruder", "thumb"] {
            let got = try cli(tpm, store, ["get", "s", "k", "--touch", finger])
            #expect(got.status != 0 && got.stdout.isEmpty, "\(finger) opened the edited key: \(got.stderr)")
        }
    }

    /// authValidity across processes: the window is the item's (`set --auth-validity`); a TPM ticket
    /// stands in for the fingerprint until it ends or the TPM resets; a script of `get` calls is asked
    /// once. A `get` may ask for a shorter window, never a longer one.
    @Test func theAuthValidityWindowHoldsAcrossProcessesAndDiesWithTheTPM() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        #expect(try cli(tpm, store, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["reader", "enroll", "thumb"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["set", "s", "k", "--accessible", "always", "--access-control", "biometryAny",
                                     "--auth-validity", "300"], input: Array("windowed".utf8)).status == 0)
        #expect(try cli(tpm, store, ["set", "s", "nowindow", "--accessible", "always", "--access-control", "biometryAny"],
                        input: Array("asks".utf8)).status == 0)
        // Without a window, a second process without an answer cannot read, whatever window it asks for.
        #expect(try cli(tpm, store, ["get", "s", "nowindow", "--auth-validity", "300", "--touch", "thumb"]).stdout == Array("asks".utf8))
        #expect(try cli(tpm, store, ["get", "s", "nowindow", "--auth-validity", "300"]).status == 3)
        // The item's window: asked once, then read by later plain `get`s without an answer.
        #expect(try cli(tpm, store, ["get", "s", "k", "--touch", "thumb"]).stdout == Array("windowed".utf8))
        #expect(try cli(tpm, store, ["get", "s", "k"]).stdout == Array("windowed".utf8))
        // A read's 0 is the default and keeps the item's window: refused rather than read without asking (issue 37).
        let zero = try cli(tpm, store, ["get", "s", "k", "--auth-validity", "0"])
        #expect(zero.status == 2 && zero.stdout.isEmpty && zero.stderr.contains("INVALID_ARGUMENT: get --auth-validity 0 cannot make this read ask"))
        // A TPM reset kills the ticket: asked again.
        try tpm.reboot()
        let afterReset = try cli(tpm, store, ["get", "s", "k"])
        #expect(afterReset.status == 3 && afterReset.stderr.contains("INTERACTION_NOT_ALLOWED"))
        // A shorter window asked by the read: its ticket ends with it, and the TPM refuses it after.
        #expect(try cli(tpm, store, ["get", "s", "k", "--auth-validity", "1", "--touch", "thumb"]).status == 0)
        sleep(2)
        #expect(try cli(tpm, store, ["get", "s", "k"]).status == 3)
    }

    /// `keychainctl doctor` (issue 37): a few lines of what stands and what to do about it; a problem exits 3.
    @Test func doctorSaysWhatStandsAndWhatToDoAboutIt() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let noBus = ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(tpm.directory)/no-bus"]
        func doctor(_ args: [String] = [], environment: [String: String] = [:]) throws -> (status: Int32, text: String) {
            let result = try run(ctl, args + ["doctor"], environment: noBus.merging(environment) { $1 })
            return (result.status, String(decoding: result.stdout, as: UTF8.self) + result.stderr)
        }
        // A TPM nobody provisioned: its empty authorizations are problems, with the command that sets them.
        let unprovisioned = try doctor(["--store", store, "--tcti", tpm.tcti])
        #expect(unprovisioned.status == 3, "\(unprovisioned.text)")
        #expect(unprovisioned.text.contains("problem warning: The TPM's owner authorization is empty") && unprovisioned.text.contains("keychainctl init"),
                "\(unprovisioned.text)")
        #expect(try cli(tpm, store, ["init", "--owner-auth-out", tpm.directory + "/owner.auth",
                                     "--lockout-auth-out", tpm.directory + "/lockout.auth"]).status == 0)
        let fresh = try doctor(["--store", store, "--tcti", tpm.tcti])
        #expect(fresh.status == 0, "\(fresh.text)")
        #expect(fresh.text.contains("ok      store binding: bound to the TPM's rollback counter"), "\(fresh.text)")
        #expect(fresh.text.contains("note    keychaind: not in use: this user's items are in \(store)"), "\(fresh.text)")
        #expect(fresh.text.contains("note    passcode: not set") && fresh.text.contains("→ keychainctl passcode set"), "\(fresh.text)")
        #expect(fresh.text.contains("secret service: no session bus here"), "\(fresh.text)")
        #expect(try cli(tpm, store, ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try cli(tpm, store, ["lock"]).status == 0)
        let locked = try doctor(["--store", store, "--tcti", tpm.tcti])
        #expect(locked.status == 0 && locked.text.contains("note    lock: locked") && locked.text.contains("→ keychainctl unlock"), "\(locked.text)")
        // keychaind named and not answering: a problem, exit 3, and what to look at.
        let gone = try doctor(environment: ["KEYCHAIN_SOCKET": tpm.directory + "/no-keychaind.sock"])
        #expect(gone.status == 3, "\(gone.text)")
        #expect(gone.text.contains("problem keychain: HARDWARE_UNAVAILABLE") && gone.text.contains("→ is keychaind running?"), "\(gone.text)")
    }

    /// A writer killed with SIGKILL in the middle of `set` leaves the old or the new value.
    @Test func aKilledWriterLeavesTheOldOrTheNewValueNeverNeither() async throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let size = 1 << 20
        #expect(try cli(tpm, store, ["set", "svc", "big"], input: [UInt8](repeating: 0, count: size)).status == 0)
        var committed: Set<UInt8> = [0]
        for round in 1...12 {
            let fill = UInt8(round)
            let stdin = Pipe()
            let writer = try #require(Processes.spawn(ctl, [ctl, "--store", store, "--tcti", tpm.tcti, "set", "svc", "big"],
                                                      stdin: stdin.fileHandleForReading.fileDescriptor))
            try stdin.fileHandleForReading.close()
            _ = ignoreBrokenPipes
            try? stdin.fileHandleForWriting.write(contentsOf: Data(repeating: fill, count: size))
            try stdin.fileHandleForWriting.close()
            usleep(UInt32.random(in: 0...60_000))
            kill(writer, SIGKILL)
            _ = Processes.wait(writer)
            committed.insert(fill)  // may or may not have landed
            let got = try cli(tpm, store, ["get", "svc", "big"])
            #expect(got.status == 0, "round \(round): \(got.stderr)")
            #expect(got.stdout.count == size)
            let first = got.stdout.first ?? 0xEE
            #expect(committed.contains(first) && got.stdout.allSatisfy { $0 == first }, "round \(round): a mixed or unknown value")
            // Later rounds may only see this value or newer ones.
            committed = committed.filter { $0 >= first }
        }
        // The store is intact: a normal write and read still work.
        #expect(try cli(tpm, store, ["set", "svc", "after"], input: [7]).status == 0)
        #expect(try cli(tpm, store, ["get", "svc", "after"]).stdout == [7])
    }

    /// Several processes on one store and one TPM, through tpm2-abrmd as on a device with /dev/tpmrm0.
    @Test func concurrentProcessesThroughTheResourceManagerLoseNothing() throws {
        let tpm = try SoftwareTPM()
        let store = tpm.directory + "/store"
        let broker = try ResourceManager(tpm: tpm)
        let tcti = broker.tcti
        let env = broker.environment
        #expect(try cli(tpm, store, ["init", "--allow-empty-owner-auth"], tcti: tcti, environment: env).status == 0)
        let writers = 4, rounds = 6
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: writers) { w in
            for r in 0..<rounds {
                do {
                    let key = "w\(w)-r\(r)"
                    let level = ["afterFirstUnlock", "whenUnlockedThisDeviceOnly", "always"][r % 3]
                    let set = try cli(tpm, store, ["set", "svc", key, "--accessible", level], input: Array(key.utf8), tcti: tcti, environment: env)
                    let shared = try cli(tpm, store, ["set", "svc", "shared"], input: Array(key.utf8), tcti: tcti, environment: env)
                    let got = try cli(tpm, store, ["get", "svc", key], tcti: tcti, environment: env)
                    if set.status != 0 || shared.status != 0 || got.stdout != Array(key.utf8) {
                        failures.withLock { $0.append("\(key): \(set.stderr) \(shared.stderr) \(got.stderr)") }
                    }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
        }
        #expect(failures.withLock { $0 } == [])
        let keys = String(decoding: try cli(tpm, store, ["ls", "svc"], tcti: tcti, environment: env).stdout, as: UTF8.self)
        #expect(keys.split(separator: "\n").count == writers * rounds + 1)
    }
}

/// `keychainctl demo`, as a newcomer runs it: it finishes, and names the code behind each fallback.
@Suite("keychainctl demo", .offThePool)
struct DemoTests {
    @Test func theDemoRunsTheFlowAndNamesEachFallbacksCode() throws {
        let ctl = buildDirectory.appendingPathComponent("keychainctl").path
        let demo = try run(ctl, ["demo"], environment: ["KEYCHAIN_APP_ID": "com.example.signin"])
        let text = String(decoding: demo.stdout, as: UTF8.self)
        #expect(demo.status == 0, "\(demo.stderr)")
        #expect(text.contains("the default storage (service 'com.example.signin'"), "KEYCHAIN_APP_ID names the default service")
        // Without KEYCHAIN_APP_ID the demo names its own service, not the binary's.
        let own = String(decoding: try run(ctl, ["demo"], environment: ["KEYCHAIN_APP_ID": ""]).stdout, as: UTF8.self)
        #expect(own.contains("the default storage (service 'com.example.keychain-demo'"), "\(own)")
        for line in ["USER_CANCELED → the password form", "AUTHENTICATION_FAILED → the password form",
                     "KEY_INVALIDATED → ", "INTERACTION_NOT_ALLOWED: The device is locked"] {
            #expect(text.contains(line), "\(line)")
        }
    }
}
