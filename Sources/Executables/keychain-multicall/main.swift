import Glibc
import KeychainCLIText
import Keychaind
import KeychainDaemon
import KeychainctlFront
import KeychainctlFull
import SecretServiceCommand

// keychainctl, keychainctl-full, keychaind, keychain-secret-service and keychain-journal-relay in one executable: the command is the
// name it is run by (argv[0]'s last component: the Debian package's links /usr/bin/keychainctl and the rest).
// One copy of the Swift runtime and FoundationEssentials in the package instead of four (docs/performance.md).
let name = CommandLine.arguments.first.map { $0.split(separator: "/").last.map(String.init) ?? $0 } ?? ""
switch name {
case "keychainctl": keychainctlMain(fullToolInThisExecutable: true)
case "keychainctl-full": await KeychainctlFull.main()
case "keychaind": keychaindMain()
case "keychain-secret-service": secretServiceMain()
case "keychain-journal-relay": journalRelayMain()
default:
    let text = "keychain-multicall: run as keychainctl, keychainctl-full, keychaind, keychain-secret-service or keychain-journal-relay "
        + "(a link of that name), not as '\(escaped(name))'\n"
    _ = text.withCString { write(2, $0, strlen($0)) }
    exit(2)
}
