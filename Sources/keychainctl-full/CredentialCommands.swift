import Glibc
import Keychain
import KeychainCLIText
import SecureMemory

extension Commands {
    /// `credential set|get|ls|rm`: the values keychaind hands systemd's system units
    /// (`LoadCredential=ID:/run/keychain/credentials.sock`, docs/credentials.md), or with `--user` the
    /// caller's own user manager's units. Through keychaind only, which answers root and the access group
    /// `admin` for the system's, and a user for their own units'.
    func credential() async throws -> Exit {
        let args = Array(inv.command.dropFirst())
        guard configuration.daemonSocket != nil else {
            throw KeychainError(.unsupported, "systemd credentials are kept by keychaind: run credential commands through it "
                                + "(without --direct, --store or --tcti; KEYCHAIN_SOCKET or \(KeychainConfiguration.systemSocket))")
        }
        let manager: SystemdCredentials.Manager = inv.switches.contains("--user") ? .init(uid: getuid()) : .system
        func unit(_ name: String) throws(KeychainError) -> Keychain {
            try createKeychain(KeychainOptions(service: name, accessGroup: SystemdCredentials.accessGroup(for: manager)),
                               configuration: configuration)
        }
        switch (args.first, args.count) {
        case ("set", 3):
            try SystemdCredentials.checkUnitName(args[1])
            try SystemdCredentials.checkCredentialName(args[2])
            var call = SetItemOptions()
            if let a = inv.flags["--accessible"] { call.accessible = try Accessible(parsing: a) }
            try await unit(args[1]).setItem(args[2], try readValue("Credential '\(escaped(args[2]))' of \(escaped(args[1]))"), options: call)
            if inv.json { printJSON(["stored": true]) }
        case ("get", 3):
            guard let value = try await unit(args[1]).getSecureBytes(args[2]) else { return notFound(Array(args.dropFirst())) }
            value.withUnsafeBytes { writeStdout($0) }
        case ("ls", 2):
            let ids = try await unit(args[1]).getAllKeys()
            if inv.json { printJSON(ids) } else { ids.forEach { print(escaped($0)) } }
        case ("ls", 1):
            // Every unit's IDs (never a value); the storage's own service is not used.
            var all: [String: [String]] = [:]
            for name in try await unit("every.service").allServicesOfScope() { all[name] = try await unit(name).getAllKeys() }
            if inv.json { printJSON(all) } else {
                for name in all.keys.sorted() { all[name]!.forEach { print("\(escaped(name)) \(escaped($0))") } }
            }
        case ("rm", 3):
            try SystemdCredentials.checkUnitName(args[1])
            try SystemdCredentials.checkCredentialName(args[2])
            let store = try unit(args[1])
            let present = try await store.hasItem(args[2])
            try await store.removeItem(args[2])
            if inv.json { printJSON(["removed": present]) }
            return present ? .ok : .notFound
        default:
            throw UsageError(message: "credential takes: set UNIT ID [--accessible A] (the value on stdin), get UNIT ID, ls [UNIT], rm UNIT ID; "
                             + "--user for a unit of your own user manager (systemctl --user)")
        }
        return .ok
    }
}
