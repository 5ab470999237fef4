import Foundation
import KeychainTestThreads
@testable import KeychainStore

/// A fresh directory path (not yet created) under the system temp directory,
/// removed when the test's work is done.
func withTemporaryStorePath<R>(_ body: (String) throws -> R) throws -> R {
    let parent = FileManager.default.temporaryDirectory
        .appendingPathComponent("kcstore-\(UUID().uuidString)").path
    defer { try? FileManager.default.removeItem(atPath: parent) }
    return try body(parent + "/store")
}

func mode(of path: String) -> Int? {
    guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
          let permissions = attributes[.posixPermissions] as? NSNumber
    else { return nil }
    return permissions.intValue & 0o777
}

func sampleItem(
    service: String = "mail", key: String = "alice", protection: String = "user",
    label: String? = "Alice's mail", stamp: Int64 = 1_700_000_000_000
) -> ItemRecord {
    ItemRecord(
        service: service, key: key, protection: protection, label: label,
        created: stamp, modified: stamp + 5,
        writerPublic: [UInt8](repeating: 0xaa, count: 32), salt: [1, 2, 3, 4],
        nonce: [UInt8](repeating: 7, count: 24), ciphertext: Array("ciphertext of \(key)".utf8))
}

func sampleWrappingKey(service: String = "mail", protection: String = "user") -> WrappingKeyRecord {
    WrappingKeyRecord(
        service: service, protection: protection, publicKey: [UInt8](repeating: 0x11, count: 32),
        sealedPublic: [9, 9, 9], sealedPrivate: [8, 8, 8, 8], policy: [0x50, 1, 2],
        created: 1_700_000_000_123)
}

struct Boom: Error, Equatable {
    let tag: Int
}

/// Collects failures from background threads.
final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []

    func add(_ text: String) {
        lock.lock()
        list.append(text)
        lock.unlock()
    }

    var all: [String] {
        lock.lock()
        defer { lock.unlock() }
        return list
    }
}

/// Runs `body` on `count` real threads at once (not the cooperative pool:
/// these block on locks) and waits for all of them.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let done = DispatchSemaphore(value: 0)
    for index in 0..<count {
        let thread = Thread {
            body(index)
            done.signal()
        }
        thread.start()
    }
    for _ in 0..<count { done.wait() }
}

/// python3 with its sqlite3 module, used as an independent second process.
let python3: String? = {
    let candidates = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        .split(separator: ":").map { "\($0)/python3" }
    for path in candidates where FileManager.default.isExecutableFile(atPath: path) {
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: path)
        probe.arguments = ["-c", "import sqlite3"]
        probe.standardOutput = FileHandle.nullDevice
        probe.standardError = FileHandle.nullDevice
        guard (try? probe.run()) != nil else { continue }
        probe.waitUntilExit()
        if probe.terminationStatus == 0 { return path }
    }
    return nil
}()

/// A python3 child running `script` with `arguments`; `waitForLine` blocks until it prints a line (its
/// signal that it is ready). Each wait has a deadline that names it (`WaitTimedOut`); a child still
/// running when it is released is killed.
final class PythonChild {
    let process = Process()
    private let output = Pipe()

    init(_ script: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: python3!)
        process.arguments = ["-c", script] + arguments
        process.standardOutput = output
        try process.run()
    }

    private var unread = Data()

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    func waitForLine() throws -> String {
        if !unread.contains(0x0a) {
            unread += try read(output.fileHandleForReading, until: "a line from python3 \(process.arguments?.dropFirst(2) ?? [])") {
                $0.contains(0x0a)
            }
        }
        let line = unread.prefix { $0 != 0x0a }
        unread = Data(unread.dropFirst(line.count + 1))
        return String(decoding: line, as: UTF8.self)
    }

    func wait() throws -> Int32 {
        try waitForExit(process, "python3 \(process.arguments?.dropFirst(2) ?? []) to end")
        return process.terminationStatus
    }
}
