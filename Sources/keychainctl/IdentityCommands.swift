import Foundation
import Keychain

/// `identity [--out FILE]`: the device's identity document, for a fleet server to enroll.
extension Commands {
    func identity() async throws -> Exit {
        _ = try arguments(0, "no arguments (--out FILE)")
        let document = try await device.identity().json() + Data("\n".utf8)
        if let out = inv.flags["--out"] {
            // Public values only, but the file is made new (never over another), 0644.
            let fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            guard fd >= 0 else { throw KeychainError(.storageError, "Cannot create \(out) (it may exist already)", underlying: .errno(errno)) }
            defer { close(fd) }
            document.withUnsafeBytes { raw in _ = write(fd, raw.baseAddress!, raw.count) }
            if inv.json { printJSON(["written": out]) } else { print("identity written to \(escaped(out))") }
        } else {
            document.withUnsafeBytes { writeStdout($0) }
        }
        return .ok
    }
}
