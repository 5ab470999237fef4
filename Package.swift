// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Keychain",
    platforms: [.macOS(.v13)],
    products: [
        .library(name: "Keychain", targets: ["Keychain"]),
        .executable(name: "keychainctl", targets: ["keychainctl"]),
        .executable(name: "keychain-bench", targets: ["keychain-bench"]),
        // For our users' own test suites: a private software TPM per test or suite.
        .library(name: "KeychainTestSupport", targets: ["KeychainTestSupport"]),
        .library(name: "BiometricsVault", targets: ["BiometricsVault"]),
        .library(name: "SignInFlow", targets: ["SignInFlow"]),
    ],
    targets: [
        // C libraries, seen only by the modules directly above them.
        .systemLibrary(name: "CTSS2", pkgConfig: "tss2-esys tss2-tctildr tss2-rc tss2-mu",
                       providers: [.apt(["libtss2-dev"])]),
        .systemLibrary(name: "CSodium", pkgConfig: "libsodium", providers: [.apt(["libsodium-dev"])]),
        .systemLibrary(name: "CP11Kit", pkgConfig: "p11-kit-1", providers: [.apt(["libp11-kit-dev"])]),
        .systemLibrary(name: "CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),

        // The TPM 2.0 layer: one ESYS call point, sessions, policies, offline policy digests.
        .target(name: "TPM2", dependencies: ["CTSS2", "CSodium", "SecureMemory"]),
        // Secrets on sodium_malloc, and the libsodium primitives the keychain uses.
        .target(name: "SecureMemory", dependencies: ["CSodium"]),
        // The SQLite store: one database per store directory.
        .target(name: "KeychainStore", dependencies: ["CSQLite"]),
        // PKCS#11 tokens through p11-kit: one module, one logged-in session, wrap/unwrap on the token.
        .target(name: "PKCS11", dependencies: ["CP11Kit", "SecureMemory"]),
        // The public API.
        .target(name: "Keychain", dependencies: ["TPM2", "SecureMemory", "KeychainStore"]),

        .target(name: "KeychainTestSupport", dependencies: ["Keychain", "TPM2"]),
        // BiometricsVault: biometric sign-in as a state machine over the public Keychain API.
        .target(name: "BiometricsVault", dependencies: ["Keychain"]),
        // The seed's "sign in with Face ID" guide as code: where each token lives, the fallbacks.
        .target(name: "SignInFlow", dependencies: ["Keychain"]),

        .executableTarget(name: "keychainctl", dependencies: ["Keychain", "SignInFlow"]),
        .executableTarget(name: "keychain-bench", dependencies: ["Keychain", "TPM2", "KeychainTestSupport"]),

        .testTarget(name: "SecureMemoryTests", dependencies: ["SecureMemory"]),
        .testTarget(name: "TPM2Tests", dependencies: ["TPM2", "SecureMemory", "KeychainTestSupport"]),
        .testTarget(name: "PKCS11Tests", dependencies: ["PKCS11", "SecureMemory"]),
        .testTarget(name: "BiometricsVaultTests", dependencies: ["BiometricsVault", "Keychain", "KeychainTestSupport"]),
        .testTarget(name: "SignInFlowTests", dependencies: ["SignInFlow", "Keychain", "KeychainTestSupport", "SecureMemory"]),
        .testTarget(name: "KeychainStoreTests", dependencies: ["KeychainStore"]),
        .testTarget(name: "KeychainTests", dependencies: ["Keychain", "TPM2", "KeychainStore", "SecureMemory", "KeychainTestSupport"]),
    ],
    swiftLanguageModes: [.v6]
)
