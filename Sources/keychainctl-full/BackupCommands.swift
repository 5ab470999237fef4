import Glibc
import FoundationEssentials
import Keychain
import KeychainCLIText
import SecureMemory

/// `backup` and `restore`: the passphrase (and for backup the passcode) come on stdin, never argv.
extension Commands {
    func backup() async throws -> Exit {
        _ = try arguments(0, "no arguments (--service S, --out FILE, --cost C)")
        let sealedTo = inv.flags["--to"]
        guard inv.switches.contains("--passphrase-stdin") != (sealedTo != nil) else {
            throw KeychainError.invalidArgument("backup needs --passphrase-stdin (the passphrase on the first line of stdin) or --to IDENTITY, not both")
        }
        let out = inv.flags["--out"]
        if out == nil, isatty(1) == 1 {
            throw KeychainError.invalidArgument("backup writes the encrypted file to stdout: redirect it (> FILE) or use --out FILE")
        }
        let cost = try inv.flags["--cost"].map { (text: String) throws(KeychainError) in try BackupCost(parsing: text) } ?? .moderate
        let passcodeOnStdin = inv.switches.contains("--passcode-stdin")
        let prompts = (sealedTo == nil ? ["Backup passphrase"] : []) + (passcodeOnStdin ? ["Device passcode"] : [])
        let expected = prompts.count
        let lines = expected == 0 ? [] : try readLines(prompts)
        let passphrase = sealedTo == nil ? lines.first : nil
        if sealedTo == nil, (passphrase?.count ?? 0) == 0 {
            throw KeychainError.invalidArgument("No passphrase on stdin: give it on the first line")
        }
        var configuration = configuration
        if passcodeOnStdin {
            guard lines.count == expected else { throw KeychainError.invalidArgument("--passcode-stdin: give the device passcode on its line of stdin") }
            configuration.authenticator = ScriptedAuthenticator([.passcode(lines[expected - 1])], attemptsPerRead: 1)
        } else if isatty(0) == 1 && isatty(2) == 1 {
            configuration.authenticator = TerminalAuthenticator()
        } else {
            configuration.authenticator = nil
        }
        let administration = { () throws(KeychainError) in try KeychainAdministration(configuration: configuration) }
        let service = inv.flags["--service"]
        let report: BackupReport
        if let sealedTo {
            let identity = try DeviceIdentity(json: try readFile(sealedTo, limit: 1 << 20, what: "the identity"))
            let ekCA = try inv.flags["--ek-ca"].map { (path: String) throws(KeychainError) in [UInt8](try readFile(path, limit: 1 << 20, what: "the EK CA file")) }
            let parent = try inv.flags["--parent"].map { (t: String) throws(KeychainError) in try Provisioning.Parent(parsing: t) }
            let unattestedSRK = inv.switches.contains("--unattested-srk")
            report = if let out {
                try await administration().backup(toFile: out, sealedTo: identity, parent: parent, ekCA: ekCA, unattestedSRK: unattestedSRK, service: service)
            } else {
                try await administration().backup(to: 1, sealedTo: identity, parent: parent, ekCA: ekCA, unattestedSRK: unattestedSRK, service: service)
            }
        } else if let out {
            report = try await administration().backup(toFile: out, passphrase: passphrase!, service: service, cost: cost)
        } else {
            report = try await administration().backup(to: 1, passphrase: passphrase!, service: service, cost: cost)
        }
        // With the file on stdout, the report goes to stderr.
        var text: String
        if inv.json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            text = String(decoding: try encoder.encode(report), as: UTF8.self)
        } else {
            text = report.backedUp.map { "backed up: \(escaped($0.service)) \(escaped($0.key))" }
                .joined(separator: "\n")
            text += report.skipped.map { "\nleft out: \(Self.named($0)) (\($0.detail.map { "invalidName: " + $0 } ?? $0.reason.rawValue))" }.joined()
            text += "\n\(report.backedUp.count) backed up, \(report.skipped.count) left out"
        }
        if out != nil { print(text) } else { writeAll(2, text + "\n") }
        return .ok
    }

    func restore() async throws -> Exit {
        let args = try arguments(1, "FILE")
        // Without --passphrase-stdin: a backup sealed to this device's TPM (backup --to).
        // --passcode-stdin: this device's passcode on the next line (a sealed backup with passcode items).
        let withPassphrase = inv.switches.contains("--passphrase-stdin"), withPasscode = inv.switches.contains("--passcode-stdin")
        let prompts = (withPassphrase ? ["Backup passphrase"] : []) + (withPasscode ? ["Device passcode"] : [])
        let expected = prompts.count
        let lines = expected == 0 ? [] : try readLines(prompts)
        var passphrase: SecureBytes?
        if withPassphrase {
            guard let line = lines.first, line.count > 0 else {
                throw KeychainError.invalidArgument("No passphrase on stdin: give it on the first line")
            }
            passphrase = line
        }
        guard lines.count == expected else { throw KeychainError.invalidArgument("--passcode-stdin: give the device passcode on its line of stdin") }
        let report = try await administration.restore(fromFile: args[0], passphrase: passphrase, passcode: withPasscode ? lines[expected - 1] : nil)
        output(report) { report in
            var lines = report.restored.map { "restored: \(escaped($0.service)) \(escaped($0.key))" }
            lines += report.skipped.map { "skipped: \(Self.named($0)) (\(Self.why($0)))" }
            lines.append("\(report.restored.count) restored, \(report.skipped.count) skipped")
            return lines.joined(separator: "\n")
        }
        return .ok
    }

    /// A skipped item's service and key; a name out of bounds (maybe 150 KB) shown by its start and size.
    private static func named(_ skip: BackupSkip) -> String {
        func shown(_ name: String) -> String {
            guard skip.reason == .invalidName, name.unicodeScalars.count > 64 else { return escaped(name) }
            return escaped(String(String.UnicodeScalarView(name.unicodeScalars.prefix(32)))) + "… (\(name.utf8.count) bytes)"
        }
        return "\(shown(skip.service)) \(shown(skip.key))"
    }

    private static func why(_ skip: BackupSkip) -> String {
        switch skip.reason {
        case .invalidName: "invalidName: \(skip.detail ?? "a name out of bounds"); the other items were restored"
        case .exists: "exists: an item with this service and key is already here; remove it to restore this one"
        case .passcodeNotSet: "passcodeNotSet: it needs a device passcode; set one (keychainctl passcode set) and restore again"
        case .thisDeviceOnly: "thisDeviceOnly"
        case .biometric: "biometric"
        case .token: "token"
        }
    }
}
