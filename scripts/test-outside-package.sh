#!/usr/bin/env bash
# A user's own package, outside this checkout, that depends on it by path and tests through keychaind
# found on PATH only (nothing beside its test bundle, nothing in /usr/bin or /usr/local/bin): the
# project's own tests cannot see how KeychainTestSupport finds programs, since keychaind sits beside
# their bundle. And a program on the KeychainClient product alone (Sources/ClientApp): what it links
# (readelf -d, ldd) holds no tpm2-tss, libcrypto, p11-kit, SQLite, libsodium or Foundation, and it
# stores and reads an item through a real keychaind, which the library then reads too.
# Run by scripts/test.sh after the suite; needs `swift build` of this package first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
keychaind="$root/.build/debug/keychaind"
[ -x "$keychaind" ] || { echo "build this package first: $keychaind is missing" >&2; exit 1; }
for fallback in /usr/bin/keychaind /usr/local/bin/keychaind; do
    [ ! -e "$fallback" ] || { echo "$fallback is installed: the test would not show PATH is searched" >&2; exit 1; }
done
# The package's build stays between runs (a rebuild is incremental), outside the checkout.
work="${TMPDIR:-/tmp}/keychain-outside-$(echo -n "$root" | sha256sum | cut -c1-12)"
mkdir -p "$work/app/Tests/AppTests" "$work/app/Sources/ClientApp" "$work/bin"
ln -sf "$keychaind" "$work/bin/keychaind"
cat > "$work/app/Package.swift" <<EOF
// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "App",
    dependencies: [.package(name: "Keychain", path: "$root")],
    targets: [
        .executableTarget(name: "ClientApp", dependencies: [.product(name: "KeychainClient", package: "Keychain")]),
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
cat > "$work/app/Sources/ClientApp/main.swift" <<'EOF'
#if canImport(Glibc)
import Glibc
#endif
import KeychainClient

// A value on stdin, stored as app.client/token through keychaind (KEYCHAIN_SOCKET), read back, printed.
func fail(_ text: String, _ status: Int32) -> Never {
    let bytes = Array("client-app: \(text)\n".utf8)
    _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(status)
}
var value: [UInt8] = []
var buffer = [UInt8](repeating: 0, count: 4096)
while case let n = read(0, &buffer, buffer.count), n > 0 { value += buffer[0..<n] }
buffer.wipe()
do {
    let storage = try KeychainClient(options: WireStorageOptions(service: "app.client"))
    try storage.setItem("token", &value)
    guard var stored = try storage.getItem("token") else { fail("the item just stored is missing", 1) }
    _ = stored.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
    stored.wipe()
} catch {
    fail("\(error)", 3)
}
EOF
cat >> "$work/app/Tests/AppTests/AppTests.swift" <<'EOF'

/// Runs `path` with `arguments`; its status and stdout.
func run(_ path: String, _ arguments: [String], environment: [String: String] = [:], input: String = "") throws -> (Int32, String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    process.environment = environment
    let (stdin, stdout) = (Pipe(), Pipe())
    (process.standardInput, process.standardOutput) = (stdin, stdout)
    try process.run()
    stdin.fileHandleForWriting.write(Data(input.utf8))
    try stdin.fileHandleForWriting.close()
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: out, as: UTF8.self))
}

@Test func aProgramOnTheClientProductLinksNoEngineLibraryAndStoresThroughKeychaind() async throws {
    var folder = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    while folder.pathComponents.count > 1 && !FileManager.default.fileExists(atPath: folder.appendingPathComponent("ClientApp").path) {
        folder.deleteLastPathComponent()
    }
    let app = folder.appendingPathComponent("ClientApp").path
    #expect(FileManager.default.isExecutableFile(atPath: app), "ClientApp is built beside the test bundle")
    let (readelfStatus, dynamic) = try run("/usr/bin/readelf", ["-d", app])
    let (lddStatus, loaded) = try run("/usr/bin/ldd", [app])
    #expect(readelfStatus == 0 && dynamic.contains("(NEEDED)") && dynamic.contains("libc.so.6"), "\(dynamic)")
    #expect(lddStatus == 0 && loaded.contains("libswiftCore.so"), "\(loaded)")
    for library in ["libtss2", "libcrypto", "libssl", "libp11-kit", "libsqlite3", "libsodium", "libFoundation"] {
        #expect(!dynamic.contains(library) && !loaded.contains(library), "ClientApp links \(library):\n\(loaded)")
    }
    let d = try await SimulatedDevice(throughDaemon: true)
    let socket = try #require(d.daemon?.socket)
    let (status, printed) = try run(app, [], environment: ["KEYCHAIN_SOCKET": socket], input: "t-2")
    #expect(status == 0 && printed == "t-2")
    // The item the program stored is the caller's item in keychaind's store, as the library reads it.
    let k = try createKeychain(.init(service: "app.client"), configuration: d.configuration)
    #expect(try await k.getItem("token") == "t-2")
}
EOF
swift=$(command -v swift)
"$swift" build --package-path "$work/app" --build-tests
# keychaind's folder first, then the system's (swtpm, /bin/sh) without this checkout's build.
PATH="$work/bin:/usr/local/bin:/usr/bin:/bin" "$swift" test --package-path "$work/app" --skip-build
