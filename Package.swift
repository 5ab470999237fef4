// swift-tools-version:6.0
// SPDX-License-Identifier: MIT
import PackageDescription

let package = Package(
    name: "Keychain",
    platforms: [.macOS(.v13)],
    products: [
        .library(name: "Keychain", targets: ["Keychain"]),
        // For a program that only talks to keychaind: the item calls over its socket, linking no
        // Foundation, tpm2-tss, libcrypto, p11-kit, SQLite or libsodium (scripts/test-outside-package.sh).
        .library(name: "KeychainClient", targets: ["KeychainClient"]),
        // The command users run: a lean front (no Foundation) that does the simple item commands through
        // keychaind itself and runs keychainctl-full, installed next to it, for everything else.
        .executable(name: "keychainctl", targets: ["keychainctl"]),
        .executable(name: "keychainctl-full", targets: ["keychainctl-full"]),
        .executable(name: "keychain-bench", targets: ["keychain-bench"]),
        // The keychain service: one store and TPM per device, callers told apart by SO_PEERCRED.
        .executable(name: "keychaind", targets: ["keychaind"]),
        // The freedesktop Secret Service (org.freedesktop.secrets) on the keychain: docs/secret-service.md.
        .executable(name: "keychain-secret-service", targets: ["keychain-secret-service"]),
        // The four commands above in one executable, as the Debian package ships them (links named after each
        // command): one copy of the Swift runtime and FoundationEssentials instead of four.
        .executable(name: "keychain-multicall", targets: ["keychain-multicall"]),
        // For our users' own test suites: a private software TPM per test or suite.
        .library(name: "KeychainTestSupport", targets: ["KeychainTestSupport"]),
        .library(name: "BiometricsVault", targets: ["BiometricsVault"]),
        .library(name: "SignInFlow", targets: ["SignInFlow"]),
        // Not for users: the token tests' PKCS#11 module, SoftHSM2 behind a front that refuses or drops
        // the template attributes a test names (Sources/KeychainTestRefusingToken). A dynamic library
        // product so that SwiftPM's own C compiler builds it wherever the package builds.
        .library(name: "KeychainTestRefusingToken", type: .dynamic, targets: ["KeychainTestRefusingToken"]),
        // Not for users: TSSCryptoTests' LD_PRELOAD probe, which says at a program's exit whether
        // OpenSSL's clean-up ran (Sources/KeychainTestExitProbe).
        .library(name: "KeychainTestExitProbe", type: .dynamic, targets: ["KeychainTestExitProbe"]),
    ],
    targets: [
        // C libraries, seen only by the modules directly above them.
        .systemLibrary(name: "CTSS2", pkgConfig: "tss2-esys tss2-tctildr tss2-rc tss2-mu",
                       providers: [.apt(["libtss2-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CP11Kit", pkgConfig: "p11-kit-1", providers: [.apt(["libp11-kit-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        // OpenSSL's libcrypto: P-256 ECDH and AES-CFB for TPM2 duplication blobs (seal-for, no TPM needed);
        // ECDSA P-256 PEM keys and offline signing of boot policies (docs/boot-state.md).
        .systemLibrary(name: "COpenSSL", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // sd-bus from libsystemd: keychain-secret-service's D-Bus connection (no GLib).
        .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
        // glibc's spawn, pipe and thread-name calls that Swift's Glibc module leaves out.
        .systemLibrary(name: "CSpawn"),

        // tpm2-tss's OpenSSL contexts: one private OSSL_LIB_CTX per process instead of one per hash, HMAC
        // and nonce (it interposes OSSL_LIB_CTX_new and _free in every program linking TPM2; docs/performance.md).
        .target(name: "CTSSCrypto"),
        // The TPM 2.0 layer: one ESYS call point, sessions, policies, offline policy digests.
        .target(name: "TPM2", dependencies: ["CTSS2", "CTSSCrypto", "CSodium", "COpenSSL", "SecureMemory", "KeychainBasics"]),
        // Secrets on sodium_malloc, and the libsodium primitives the keychain uses.
        .target(name: "SecureMemory", dependencies: ["CSodium"]),
        // What every layer shares and no C library defines: the errno path of system calls (`valueOrErrno`), the hex codec,
        // printf's %.1f.
        .target(name: "KeychainBasics"),
        // The SQLite store: one database per store directory.
        .target(name: "KeychainStore", dependencies: ["CSQLite", "KeychainBasics"]),
        // PKCS#11 tokens through p11-kit: one module, one logged-in session, wrap/unwrap on the token.
        .target(name: "PKCS11", dependencies: ["CP11Kit", "SecureMemory", "KeychainBasics"]),
        // keychaind's protocol: framing and messages, no Foundation (a small client links it alone).
        .target(name: "KeychainWire", dependencies: ["KeychainBasics"]),
        // keychaind's item calls for a program that links nothing else: the wire, blocking calls.
        .target(name: "KeychainClient", dependencies: ["KeychainWire"]),
        // What keychainctl's front and keychainctl-full print alike (terminal-safe text, the option names), and the
        // text the executables write without Foundation (hex, whole writes to stdout and stderr).
        .target(name: "KeychainCLIText", dependencies: ["KeychainBasics"]),
        // The public API.
        // D-Bus over sd-bus (the connection, its values, the DH session crypto): the Secret Service
        // provider, and the keychain's desktop prompt (gcr's system prompter).
        .target(name: "DBus", dependencies: ["CSystemd", "COpenSSL", "SecureMemory", "KeychainBasics"]),
        // The keychain's values and protocols: the options, KeychainError, item and status values, the scopes, StorageRef,
        // Caller, the authenticator protocol; no TPM, SQLite, token, D-Bus or daemon.
        .target(name: "KeychainCore", dependencies: ["KeychainBasics", "KeychainWire", "SecureMemory"]),
        // The engine: the Engine actor, the TPM and token backends, backup, provisioning, the local service, quotas and
        // budgets, the store's meta and the item envelope. Names no daemon code: keychaind's service depends on it.
        .target(name: "KeychainEngine", dependencies: ["KeychainCore", "TPM2", "SecureMemory", "KeychainStore", "PKCS11", "CSpawn",
                                                       "COpenSSL", "KeychainWire", "KeychainBasics"]),
        // The public API on the engine: Keychain, KeychainDevice, the administration API, the prompters, and the
        // client of keychaind the library uses when the configuration names its socket.
        .target(name: "Keychain", dependencies: ["KeychainEngine", "KeychainCore", "SecureMemory", "CSpawn",
                                                 "KeychainWire", "KeychainCLIText", "DBus", "KeychainBasics"]),

        // keychaind's service over the engine: the socket server, the request handler, access groups, the limits
        // on connections and each uid's turn, the log, and the systemd credentials socket. keychaind alone links it.
        .target(name: "KeychainDaemon", dependencies: ["KeychainEngine", "KeychainWire", "SecureMemory", "TPM2", "KeychainCLIText", "KeychainBasics", "CSystemd"]),

        .target(name: "KeychainTestSupport", dependencies: ["Keychain", "TPM2", "KeychainTestThreads", "KeychainBasics"]),
        // C: the token tests' PKCS#11 module (see its product); p11-kit's pkcs11.h only, no C library of its own.
        .target(name: "KeychainTestRefusingToken", dependencies: ["CP11Kit"]),
        .target(name: "KeychainTestExitProbe", dependencies: ["COpenSSL"]),
        // Our test suites' trait that runs tests which block off Swift's cooperative pool (Swift Testing: tests only).
        .target(name: "KeychainTestThreads", dependencies: ["KeychainBasics"]),
        // The Secret Service API over the public Keychain API: the bus (sd-bus), the sessions' crypto, the items.
        .target(name: "SecretService", dependencies: ["Keychain", "KeychainEngine", "DBus", "SecureMemory", "KeychainCLIText", "KeychainBasics"]),
        // BiometricsVault: biometric sign-in as a state machine over the public Keychain API.
        .target(name: "BiometricsVault", dependencies: ["Keychain"]),
        // The seed's "sign in with Face ID" guide as code: where each token lives, the fallbacks.
        .target(name: "SignInFlow", dependencies: ["Keychain"]),

        // Each command is a module with one entry point (Sources/<command>), which its own executable
        // (Sources/Executables/<command>) and keychain-multicall call.
        .target(name: "KeychainctlFull", dependencies: ["Keychain", "TPM2", "SignInFlow", "KeychainCLIText", "KeychainWire", "DBus", "KeychainBasics"],
                path: "Sources/keychainctl-full"),
        .target(name: "KeychainctlFront", dependencies: ["KeychainWire", "KeychainCLIText", "KeychainBasics"], path: "Sources/keychainctl"),
        .target(name: "Keychaind", dependencies: ["KeychainDaemon", "KeychainEngine", "KeychainCLIText", "CSystemd"], path: "Sources/keychaind"),
        .target(name: "SecretServiceCommand", dependencies: ["SecretService", "Keychain", "KeychainCLIText"],
                path: "Sources/keychain-secret-service"),
        .executableTarget(name: "keychainctl-full", dependencies: ["KeychainctlFull"], path: "Sources/Executables/keychainctl-full"),
        // Loads no Foundation, ICU, tpm2-tss, OpenSSL or SQLite: start-up is a static Swift runtime's.
        .executableTarget(name: "keychainctl", dependencies: ["KeychainctlFront"], path: "Sources/Executables/keychainctl",
                          linkerSettings: [.unsafeFlags(["-static-stdlib"])]),
        .executableTarget(name: "keychaind", dependencies: ["Keychaind"], path: "Sources/Executables/keychaind"),
        .executableTarget(name: "keychain-secret-service", dependencies: ["SecretServiceCommand"],
                          path: "Sources/Executables/keychain-secret-service"),
        .executableTarget(name: "keychain-multicall", dependencies: ["KeychainctlFront", "KeychainctlFull", "Keychaind", "KeychainDaemon",
                                                                        "SecretServiceCommand"],
                          path: "Sources/Executables/keychain-multicall"),
        .executableTarget(name: "keychain-bench", dependencies: ["Keychain", "TPM2", "KeychainTestSupport", "BiometricsVault",
                                                                "KeychainClient", "KeychainWire"]),
        // The parsers at each trust boundary as libFuzzer targets: a real one only as scripts/fuzz.sh builds it
        // (-DFUZZING -sanitize=fuzzer,address); the default build makes a stub that says so.
        .executableTarget(name: "keychain-fuzz", dependencies: ["Keychain", "KeychainEngine", "KeychainDaemon", "Keychaind", "KeychainWire", "PKCS11", "SecretService",
                                                                "SecureMemory", "KeychainCLIText", "DBus", "CSystemd"]),
        // The seed's BiometricsVault example as a command, one vault call per argument (the vault's kill tests run it).
        .executableTarget(name: "vault-example", dependencies: ["BiometricsVault", "Keychain", "KeychainCLIText"]),

        .testTarget(name: "SecureMemoryTests", dependencies: ["SecureMemory"]),
        .testTarget(name: "KeychainBasicsTests", dependencies: ["KeychainBasics"]),
        .testTarget(name: "TPM2Tests", dependencies: ["TPM2", "SecureMemory", "KeychainTestSupport", "KeychainTestThreads"]),
        .testTarget(name: "PKCS11Tests", dependencies: ["PKCS11", "SecureMemory", "KeychainTestThreads"]),
        .testTarget(name: "BiometricsVaultTests", dependencies: ["BiometricsVault", "Keychain", "KeychainTestSupport", "KeychainTestThreads"]),
        // Every Swift block of README.md and docs/, generated by scripts/doc-snippets.py: compiled, not run.
        .testTarget(name: "DocSnippetTests", dependencies: ["Keychain", "KeychainTestSupport", "BiometricsVault", "SignInFlow"]),
        .testTarget(name: "SignInFlowTests", dependencies: ["SignInFlow", "Keychain", "KeychainTestSupport", "SecureMemory", "KeychainTestThreads"]),
        .testTarget(name: "KeychainStoreTests", dependencies: ["KeychainStore", "KeychainBasics", "KeychainTestThreads"]),
        // Unit tests of the protocol logic, and the real clients (secret-tool, python's secretstorage and keyring,
        // libsecret through python3-gi) on a private dbus-daemon.
        .testTarget(name: "SecretServiceTests", dependencies: ["SecretService", "Keychain", "SecureMemory", "KeychainTestSupport",
                                                          "KeychainTestThreads"]),
        .testTarget(name: "KeychainTests", dependencies: ["Keychain", "KeychainEngine", "TPM2", "KeychainStore", "SecureMemory", "KeychainTestSupport", "KeychainWire",
                                                     "KeychainClient", "KeychainTestThreads", "CTSSCrypto", "COpenSSL", "KeychainCLIText", "Keychaind",
                                                     "KeychainDaemon"]),
    ],
    swiftLanguageModes: [.v6]
)
