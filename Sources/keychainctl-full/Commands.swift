import Glibc
import FoundationEssentials
import Keychain
import KeychainCLIText
import SecureMemory
import KeychainWire

struct Commands {
    let inv: Invocation
    let configuration: KeychainConfiguration

    var device: KeychainDevice { KeychainDevice(configuration: configuration) }
    /// What keychaind does not serve: UNSUPPORTED through keychaind, at the call that needs it.
    var administration: KeychainAdministration { get throws(KeychainError) { try KeychainAdministration(configuration: configuration) } }

    func storage(_ service: String, _ options: KeychainOptions = .init()) throws(KeychainError) -> Keychain {
        var options = options
        options.service = service
        if let k = inv.flags["--key-storage"] { options.android.keyStorage = try KeyStorage(parsing: k) }
        if let group = inv.flags["--access-group"] { options.accessGroup = group }
        var configuration = configuration
        if inv.command.first == "get" {
            if let scripted = try scriptedAuthenticator(inv) { configuration.authenticator = scripted }
            // The read window of the seed's authValidity: a TPM ticket kept in the store for N seconds.
            if let v = inv.flags["--auth-validity"] {
                guard let n = Int(v) else { throw KeychainError.invalidArgument("Invalid authValidity: expected a whole number of seconds, got '\(v)'") }
                // A read's 0 is the storage's default, which keeps the item's stored window: it would not ask.
                guard n != 0 else {
                    throw KeychainError.invalidArgument("get --auth-validity 0 cannot make this read ask: the window is the item's "
                                                        + "(set --auth-validity); give a number above 0 to shorten it, or store the item with 0")
                }
                options.authValidity = n
            }
        }
        return try createKeychain(options, configuration: configuration)
    }

    func arguments(_ n: Int, _ names: String) throws(UsageError) -> [String] {
        let args = Array(inv.command.dropFirst())
        guard args.count == n else { throw UsageError(message: "\(inv.command[0]) takes \(names)") }
        return args
    }

    func run() async throws -> Exit {
        if let command = inv.command.first, Self.itemCommands.contains(command) { return try await itemCommand(command) }
        switch inv.command.first {
        case "init":
            try await initialize()
        case "status":
            try await status()
        case "doctor":
            let findings = await Doctor(configuration: configuration).findings()
            output(findings) {
                $0.map { finding in
                    let verdict = finding.verdict.rawValue + String(repeating: " ", count: 8 - finding.verdict.rawValue.count)
                    return verdict + escaped("\(finding.check): \(finding.detail)") + (finding.fix.map { "\n         → " + escaped($0) } ?? "")
                }.joined(separator: "\n")
            }
            return findings.contains { $0.verdict == .problem } ? .failure : .ok
        case "accept-store":
            // Before anything else: keychaind's store is accepted where it is, as the service's user.
            let counter = try await administration.acceptStore()
            output(counter) { "rollback counter: \($0.state.rawValue)" + ($0.index.map { " (NV \(upperHex(UInt64($0))), " } ?? " (")
                + "value \($0.tpmValue ?? $0.storeValue ?? 0)): the store as it is now is the baseline" }
        case "unlock":
            let lines = try readLines([Self.passcodeIfSet])
            try await device.unlock(passcode: lines.first.flatMap { $0.count == 0 ? nil : $0 })
            done("unlocked")
        case "lock":
            try await device.lock()
            done("locked")
        case "passcode":
            return try await passcode()
        case "boot-state":
            return try await bootState()
        case "token":
            guard inv.command.dropFirst().first == "reset-tries" else { throw UsageError(message: "token takes: reset-tries") }
            try await device.resetTokenPINTries()
            done("token PIN tries reset")
        case "tpm":
            guard inv.command.dropFirst().first == "reboot" else { throw UsageError(message: "tpm takes: reboot") }
            guard case .embedded = configuration.tpm else {
                throw KeychainError.invalidArgument("tpm reboot only restarts the embedded software TPM; this store uses the TPM at --tcti / KEYCHAIN_TCTI")
            }
            EmbeddedTPM.reboot(storeDirectory: configuration.storeDirectory)
            done("rebooted the embedded software TPM")
        case "reader":
            return try await reader()
        case "biometry-types":
            let types = device.biometryTypes()
            if inv.json { printJSON(types.map(\.rawValue)) } else { types.forEach { print($0.rawValue) } }
        case "identity":
            return try await identity()
        case "seal-for":
            return try await sealFor()
        case "attest":
            return try await attest()
        case "import":
            return try await importBundle()
        case "backup":
            return try await backup()
        case "restore":
            return try await restore()
        case "demo":
            return try await Demo().run()
        case "credential":
            return try await credential()
        case "secret-service":
            return try secretService()
        case nil:
            throw UsageError(message: "no command given")
        case let other?:
            throw UsageError(message: "unknown command '\(other)'")
        }
        return .ok
    }

    /// `init`: provisioning (ownership taken here, or by keychaind's service), then a vendor's boot-policy key if given.
    private func initialize() async throws {
        let ownership = Ownership(ownerAuthorizationFile: inv.flags["--owner-auth-out"],
                                  lockoutAuthorizationFile: inv.flags["--lockout-auth-out"],
                                  allowEmpty: inv.switches.contains("--allow-empty-owner-auth"))
        // Through keychaind the service's own provisioning took ownership (it holds the files).
        var status = configuration.daemonSocket != nil ? try await device.initialize()
            : try await administration.initialize(takingOwnership: ownership)
        if let key = inv.flags["--boot-policy-key"] {
            // Vendor-signed boot states (docs/boot-state.md): after provisioning, before any item.
            guard let pem = FileManager.default.contents(atPath: key) else {
                throw KeychainError.invalidArgument("Cannot read the boot-policy key \(key)")
            }
            try await administration.useBootPolicyKey(publicKeyPEM: Array(pem))
            status = try await device.status()
        }
        output(status) {
            "initialized: \($0.tpm) (\($0.securityLevel.rawValue)), passcode \($0.passcodeSet ? "set" : "not set")\n"
                + authorizationLines($0)
        }
    }

    /// `status`: the device, the token and the boot state.
    private func status() async throws {
        struct Status: Encodable { let device: DeviceStatus; let token: TokenStatus?; let bootState: BootStateStatus? }
        let status = Status(device: try await device.status(), token: try await device.tokenStatus(),
                            bootState: try? await administration.bootState())
        output(status) {
            var text = "tpm: \($0.device.tpm)\nsecurity level: \($0.device.securityLevel.rawValue)\n"
                + "passcode: \($0.device.passcodeSet ? "set" : "not set")\nlock: \($0.device.lockState.rawValue)\n"
                + authorizationLines($0.device)
            if let boot = $0.bootState { text += "\n" + bootStateLine(boot) }
            if let t = $0.token {
                text += "\ntoken: " + escaped("\(t.label) (\(t.manufacturer), \(t.model), serial \(t.serial))")
                text += "\ntoken PIN: locked \(t.userPinLocked), final try \(t.userPinFinalTry), count low \(t.userPinCountLow)"
            }
            return text
        }
    }

    /// The commands on one storage's items (and `can-use`, a question of its backend).
    static let itemCommands: Set<String> = ["set", "get", "has", "rm", "ls", "info", "clear", "can-use"]

    private func itemCommand(_ command: String) async throws -> Exit {
        switch command {
        case "set":
            let args = try arguments(2, "SERVICE KEY")
            var call = SetItemOptions()
            if let a = inv.flags["--accessible"] { call.accessible = try Accessible(parsing: a) }
            if let c = inv.flags["--access-control"] { call.overrideAccessControl(with: try AccessControl(parsing: c)) }
            if let l = inv.flags["--label"] { call.label = l }
            if let v = inv.flags["--auth-validity"] {
                guard let n = Int(v) else { throw KeychainError.invalidArgument("Invalid authValidity: expected a whole number of seconds, got '\(v)'") }
                call.authValidity = n
            }
            if inv.switches.contains("--synchronizable") { call.synchronizable = true }
            let store = try storage(args[0])
            try await store.setItem(args[1], try readValue("Value of '\(escaped(args[1]))' in '\(escaped(args[0]))'"), options: call)
            if inv.json { printJSON(["stored": true]) }
        case "get":
            let args = try arguments(2, "SERVICE KEY")
            guard let value = try await storage(args[0]).getSecureBytes(args[1]) else {
                return notFound(args)
            }
            value.withUnsafeBytes { writeStdout($0) }
        case "has":
            let args = try arguments(2, "SERVICE KEY")
            let present = try await storage(args[0]).hasItem(args[1])
            if inv.json { printJSON(["present": present]) }
            return present ? .ok : .notFound
        case "rm":
            let args = try arguments(2, "SERVICE KEY")
            let store = try storage(args[0])
            let present = try await store.hasItem(args[1])
            try await store.removeItem(args[1])
            if inv.json { printJSON(["removed": present]) }
            return present ? .ok : .notFound
        case "ls":
            let args = try arguments(1, "SERVICE")
            let keys = try await storage(args[0]).getAllKeys()
            if inv.json { printJSON(keys) } else { keys.forEach { print(escaped($0)) } }
        case "info":
            let args = try arguments(2, "SERVICE KEY")
            guard let info = try await storage(args[0]).getItemInfo(args[1]) else { return notFound(args) }
            output(info) { info in
                return ["service: \(escaped(info.service))", "key: \(escaped(info.key))", "accessible: \(info.accessible.rawValue)",
                        "accessControl: \(info.accessControl.rawValue)", "label: \(escaped(info.label ?? ""))",
                        "created: \(info.created.formatted(.iso8601))", "modified: \(info.modified.formatted(.iso8601))",
                        "securityLevel: \(info.securityLevel.rawValue)"].joined(separator: "\n")
                    + (info.token.map { "\ntoken: \(escaped($0))" } ?? "")
            }
        case "clear":
            let args = try arguments(1, "SERVICE")
            try await storage(args[0]).clear()
            if inv.json { printJSON(["cleared": true]) }
        case "can-use":
            let args = try arguments(1, "ACCESS_CONTROL")
            let value = try AccessControl(parsing: args[0])
            // With --key-storage, the answer of that backend (a token has its PIN and no reader).
            let check = inv.flags["--key-storage"] == nil
                ? try await device.canUseAccessControl(value)
                : try await (try storage("keychainctl")).canUseAccessControl(value)
            output(check) { "available: \($0.available)" + ($0.reason.map { "\nreason: \($0.rawValue)" } ?? "") }
        default:
            throw UsageError(message: "unknown command '\(command)'")
        }
        return .ok
    }

    private func reader() async throws -> Exit {
        let args = Array(inv.command.dropFirst())
        switch (args.first, args.count) {
        case ("enroll", 2):
            try await device.enrollFinger(args[1], passcode: try readLines([Self.passcodeIfSet]).first)
            done("enrolled \(args[1])")
        case ("remove", 2):
            let removed = try await device.removeFinger(args[1], passcode: try readLines([Self.passcodeIfSet]).first)
            if !removed {
                writeAll(2, "keychainctl: no finger '\(escaped(args[1]))' is enrolled\n")
                return .notFound
            }
            done("removed \(args[1])")
        case ("delete", 1):
            guard try await device.deleteReader(passcode: try readLines([Self.passcodeIfSet]).first) else {
                writeAll(2, "keychainctl: there is no reader to delete\n")
                return .notFound
            }
            done("deleted the reader and its TPM key")
        case ("list", 1):
            let fingers = try await device.enrolledFingers()
            if inv.json { printJSON(fingers) } else { fingers.forEach { print(escaped($0)) } }
        default:
            throw UsageError(message: "reader takes: enroll NAME, remove NAME, delete or list")
        }
        return .ok
    }

    private func passcode() async throws -> Exit {
        switch inv.command.dropFirst().first {
        case "set":
            let lines = try readLines(["New passcode"] + Self.again)
            guard let pin = lines.first else { throw KeychainError.invalidArgument("passcode set reads the new passcode from stdin") }
            try Self.sameTwice(lines)
            try await device.setPasscode(pin)
            done("passcode set")
        case "change":
            let lines = try readLines(["Current passcode", "New passcode"] + Self.again)
            guard lines.count >= 2 else {
                throw KeychainError.invalidArgument("passcode change reads two lines from stdin: the current passcode, then the new one")
            }
            try Self.sameTwice(Array(lines.dropFirst()))
            try await device.changePasscode(from: lines[0], to: lines[1])
            done("passcode changed")
        case "remove":
            let lines = try readLines(["Current passcode"])
            guard let pin = lines.first else { throw KeychainError.invalidArgument("passcode remove reads the current passcode from stdin") }
            try await device.removePasscode(current: pin)
            done("passcode removed; whenPasscodeSetThisDeviceOnly items were destroyed")
        case "reset-tries":
            try await device.resetPasscodeTries()
            done("passcode tries reset")
        default:
            throw UsageError(message: "passcode takes: set, change, remove or reset-tries")
        }
        return .ok
    }

    /// The prompt of a passcode that is asked for whether or not one is set.
    static let passcodeIfSet = "Passcode (Enter alone when none is set)"

    /// On a terminal a new passcode is typed twice (it is not shown); a pipe gives it once.
    static var again: [String] { TerminalInput.isTerminal ? ["New passcode again"] : [] }

    /// `INVALID_ARGUMENT` when a new passcode typed twice differs.
    static func sameTwice(_ typed: [SecureBytes]) throws(KeychainError) {
        guard typed.count == 2 else { return }
        let same = typed[0].withUnsafeBytes { a in typed[1].withUnsafeBytes { b in a.elementsEqual(b) } }
        guard same else { throw KeychainError.invalidArgument("The new passcode typed the second time differs from the first: nothing was changed") }
    }

    /// The TPM's authorizations and storage root key, then each warning on its own line.
    private func authorizationLines(_ status: DeviceStatus) -> String {
        (["owner authorization: \(status.ownerAuthorizationSet ? "set" : "EMPTY")",
          "lockout authorization: \(status.lockoutAuthorizationSet ? "set" : "EMPTY")",
          "storage root key: \(status.storageRootKey.rawValue)"]
            + (status.rollbackCounter.map { [rollbackLine($0)] } ?? [])
            + (status.reader.map { [readerLine($0)] } ?? [])
            + status.warnings.map { "warning: \($0)" }).joined(separator: "\n")
    }

    /// `rollback counter: current (NV 0x01004C2A, store 12, TPM 12, window 256)`.
    private func rollbackLine(_ counter: RollbackCounterStatus) -> String {
        var details: [String] = []
        if let index = counter.index { details.append("NV " + upperHex(UInt64(index))) }
        if let value = counter.storeValue { details.append("store \(value)") }
        if let value = counter.tpmValue { details.append("TPM \(value)") }
        if let window = counter.window { details.append("window \(window)") }
        return "rollback counter: \(counter.state.rawValue)" + (details.isEmpty ? "" : " (" + details.joined(separator: ", ") + ")")
    }

    /// `fingerprint reader: rolled-back (2 enrolled, enrollment changes: file 2, store 3)`.
    private func readerLine(_ reader: ReaderStatus) -> String {
        var details: [String] = []
        if let enrolled = reader.enrolled { details.append("\(enrolled) enrolled") }
        if let generation = reader.generation, let recorded = reader.recordedGeneration {
            details.append("enrollment changes: file \(generation), store \(recorded)")
        }
        return "fingerprint reader: \(reader.state.rawValue)" + (details.isEmpty ? "" : " (" + details.joined(separator: ", ") + ")")
    }

    func notFound(_ args: [String]) -> Exit {
        if inv.json { printJSON(["error": ["code": "NOT_FOUND", "message": "No item '\(args[1])' in service '\(args[0])'"]]) }
        else { writeAll(2, "keychainctl: no item '\(escaped(args[1]))' in service '\(escaped(args[0]))'\n") }
        return .notFound
    }

    func done(_ text: String) {
        if inv.json { printJSON(["ok": text]) } else { print(escaped(text)) }
    }

    func output<T: Encodable>(_ value: T, text: (T) -> String) {
        if inv.json { printJSON(value) } else { print(text(value)) }
    }
}

/// keychainctl-full's entry point.
public enum KeychainctlFull {
    public static func main() async {
        let code: Exit
        var words: [String] = []
        do {
            let args = try strictArguments()
            words = commandWords(args)
            let inv = try Invocation(args)
            // An option the command does not take is refused first, with --help too (it names the command).
            try Usage.checkOptions(inv)
            if inv.switches.contains("--help") || inv.switches.contains("-h") || inv.command.first == "help" {
                print(try Usage.help(inv.command.first == "help" ? Array(inv.command.dropFirst()) : inv.command))
                exit(0)
            }
            let configuration = try inv.configuration()
            if configuration.daemonSocket == nil, case .embedded = configuration.tpm, inv.command.first != "demo",
               inv.command.first != "biometry-types", inv.command.first != "seal-for", inv.command.first != "secret-service",
               !Commands.attestOnServer(inv.command) {
                writeAll(2, "keychainctl: no TPM device or --tcti: using the embedded software TPM in \(escaped(configuration.storeDirectory))/swtpm (security level: software)\n")
            }
            let progress = configuration.daemonSocket == nil ? TerminalProgress.start(inv.command) : nil
            defer { progress?.finish() }
            code = try await Commands(inv: inv, configuration: configuration).run()
        } catch let error as UsageError where CommandLine.arguments.contains("--json") {
            // A script that asked for JSON reads stdout: the usage error is INVALID_ARGUMENT there (exit 2).
            code = report(KeychainError(.invalidArgument, error.message), json: true)
        } catch let error as UsageError {
            // One line that says what was wrong, then that command's usage (not the whole page).
            writeAll(2, "keychainctl: \(escaped(error.message))\n\(Usage.afterError(words))\n")
            code = .usage
        } catch let error as KeychainError {
            code = report(error, json: CommandLine.arguments.contains("--json"))
        } catch {
            code = report(KeychainError(.internal, "\(error)"), json: CommandLine.arguments.contains("--json"))
        }
        // Checkpoints the WAL into keychain.db: a lost -wal file then loses nothing.
        await KeychainDevice.closeStores()
        fflush(nil)
        exit(code.rawValue)
    }
}
