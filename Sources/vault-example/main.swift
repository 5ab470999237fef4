import Glibc
import BiometricsVault
import Keychain
import KeychainCLIText

/// The seed's BiometricsVault example as a command: each argument is one of the vault's calls, run
/// in order on one vault made as the seed's README makes it, with the default configuration (the
/// store, TPM and reader of `KEYCHAIN_STORE`, `KEYCHAIN_TCTI`, `KEYCHAIN_READER`, or keychaind at
/// `KEYCHAIN_SOCKET`; the fingerprint prompt is the system's: the terminal, the desktop's prompter
/// or systemd's password agents).
///
///     vault-example state                         # what a restart finds, no prompt
///     vault-example sign-in                       # enableKeychainVault(saving:)
///     vault-example upgrade                       # upgradeKeychainWithBiometrics(): the prompt
///     vault-example unlock downgrade              # one process: unlock (the prompt), then downgrade
///
/// `sign-in` and `enable-biometrics` read the user's name and token from stdin, one line each (a
/// token is never in argv). After each call it prints the call and the state it left
/// (`upgrade: biometricsSecured (alice)`, with the user's name, never the token). A call that fails
/// prints the call and the error on stderr and ends the program: exit 1 for a `KeychainError` (its
/// code first), 2 for a transition the state does not allow (`VaultError`), 64 for a wrong argument.
struct Credentials: Codable, Sendable {
    var user: String
    var token: String
}

let steps = ["state", "sign-in", "enable-biometrics", "upgrade", "lock", "unlock", "downgrade", "disable", "reset",
             "reauthenticate"]
let arguments = Array(CommandLine.arguments.dropFirst())
guard !arguments.isEmpty, arguments.allSatisfy(steps.contains) else {
    writeAll(2, "usage: vault-example STEP... (\(steps.joined(separator: " | ")))\n")
    exit(64)
}

/// The credentials a sign-in saves: two lines of stdin.
func signedInCredentials() -> Credentials {
    guard let user = readLine(), let token = readLine(), !user.isEmpty, !token.isEmpty else {
        writeAll(2, "vault-example: sign-in reads the user's name and token from stdin, one line each\n")
        exit(64)
    }
    return Credentials(user: user, token: token)
}

func shown(_ state: VaultState<Credentials>) -> String {
    state.credentials.map { "\(state.kind) (\($0.user))" } ?? "\(state.kind)"
}

let vault = BiometricsVault<Credentials>(key: "biometrics_credentials")
for step in arguments {
    do {
        switch step {
        case "sign-in": try vault.enableKeychainVault(saving: signedInCredentials())
        case "enable-biometrics": try await vault.enableSecureVaultWithBiometrics(saving: signedInCredentials())
        case "upgrade": try await vault.upgradeKeychainWithBiometrics()
        case "lock": try vault.lock()
        case "unlock": try await vault.unlockWithBiometrics()
        case "downgrade": try vault.downgradeBiometricsToKeychain()
        case "disable": try vault.disableBiometricsSecureVault()
        case "reset": vault.resetEverything()
        case "reauthenticate": try await vault.reauthenticateOwner()
        default: break  // state
        }
        print("\(step): \(shown(vault.state))")
    } catch {
        writeAll(2, "\(step): \(error)\n")
        exit(error is VaultError ? 2 : 1)
    }
}
