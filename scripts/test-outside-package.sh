#!/usr/bin/env bash
# A user's own package, outside this checkout, that depends on it by path and tests through keychaind
# found on PATH only (nothing beside its test bundle, nothing in /usr/bin or /usr/local/bin): the
# project's own tests cannot see how KeychainTestSupport finds programs, since keychaind sits beside
# their bundle. Run by scripts/test.sh after the suite; needs `swift build` of this package first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keychaind="$root/.build/debug/keychaind"
[ -x "$keychaind" ] || { echo "build this package first: $keychaind is missing" >&2; exit 1; }
for fallback in /usr/bin/keychaind /usr/local/bin/keychaind; do
    [ ! -e "$fallback" ] || { echo "$fallback is installed: the test would not show PATH is searched" >&2; exit 1; }
done
# The package's build stays between runs (a rebuild is incremental), outside the checkout.
work="${TMPDIR:-/tmp}/keychain-outside-$(echo -n "$root" | sha256sum | cut -c1-12)"
mkdir -p "$work/app/Tests/AppTests" "$work/bin"
ln -sf "$keychaind" "$work/bin/keychaind"
cat > "$work/app/Package.swift" <<EOF
// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "App",
    dependencies: [.package(name: "Keychain", path: "$root")],
    targets: [
        .testTarget(name: "AppTests", dependencies: [
            .product(name: "Keychain", package: "Keychain"),
            .product(name: "KeychainTestSupport", package: "Keychain"),
        ]),
    ]
)
EOF
cat > "$work/app/Tests/AppTests/AppTests.swift" <<'EOF'
import Foundation
import Keychain
import KeychainTestSupport
import Testing

@Test func aDeviceThroughKeychaindFoundOnPathStoresAndReads() async throws {
    // No keychaind beside the bundle or above it: only PATH can lead to it.
    var folder = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    while folder.pathComponents.count > 1 {
        folder.deleteLastPathComponent()
        #expect(!FileManager.default.fileExists(atPath: folder.appendingPathComponent("keychaind").path))
    }
    let d = try await SimulatedDevice(throughDaemon: true)
    #expect(d.daemon != nil)
    let k = try createKeychain(.init(service: "app.outside"), configuration: d.configuration)
    try await k.setItem("token", "t-1")
    #expect(try await k.getItem("token") == "t-1")
}
EOF
swift=$(command -v swift)
"$swift" build --package-path "$work/app" --build-tests
# keychaind's folder first, then the system's (swtpm, /bin/sh) without this checkout's build.
PATH="$work/bin:/usr/local/bin:/usr/bin:/bin" "$swift" test --package-path "$work/app" --skip-build
