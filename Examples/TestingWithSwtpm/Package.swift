// swift-tools-version:6.0
// An app's package tested against a software TPM: docs/guides/testing-with-swtpm.md.
import PackageDescription

let package = Package(
    name: "Accounts",
    platforms: [.macOS(.v13)],
    dependencies: [
        // This repository by path; from elsewhere: .package(url: "<this repository's URL>", branch: "main").
        .package(name: "Keychain", path: "../.."),
    ],
    targets: [
        .target(name: "Accounts", dependencies: [.product(name: "Keychain", package: "Keychain")]),
        .testTarget(name: "AccountsTests", dependencies: [
            "Accounts",
            .product(name: "Keychain", package: "Keychain"),
            .product(name: "KeychainTestSupport", package: "Keychain"),
        ]),
    ]
)
