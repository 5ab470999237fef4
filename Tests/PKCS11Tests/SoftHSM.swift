import Foundation
import KeychainTestThreads
import PKCS11
import SecureMemory

/// A private SoftHSM2 token for one test: its own token directory and configuration, removed on release.
///
/// SoftHSM2 reads `SOFTHSM2_CONF` and scans its tokens only in `C_Initialize`, and p11-kit keeps that one
/// initialization while any `PKCS11Module` of the process lives. So tests that use a token are
/// `.serialized`, and each releases its modules before the next one sets up its own token.
final class SoftHSM {
    static let modulePath = "/usr/lib/softhsm/libsofthsm2.so"
    static let soPIN = "12345678"
    static let userPIN = "1234"

    let directory: String
    let configuration: String
    let label: String

    /// `mechanisms`: SoftHSM2's `slots.mechanisms`, the mechanisms the token offers ("CKM_A,CKM_B"), or
    /// withholds ("-,CKM_A,CKM_B": SoftHSM 2.6.1 skips the first name after the '-').
    init(label: String = "test", mechanisms: String? = nil) throws {
        self.label = label
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("keychain-softhsm-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory + "/tokens", withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        configuration = directory + "/softhsm2.conf"
        try """
            directories.tokendir = \(directory)/tokens
            objectstore.backend = file
            log.level = ERROR
            slots.removable = false
            \(mechanisms.map { "slots.mechanisms = \($0)" } ?? "")

            """.write(toFile: configuration, atomically: true, encoding: .utf8)
        setenv("SOFTHSM2_CONF", configuration, 1)
        let result = try run("/usr/bin/softhsm2-util", ["--init-token", "--free", "--label", label,
                                                        "--so-pin", Self.soPIN, "--pin", Self.userPIN])
        guard result.status == 0 else { throw FixtureError("softhsm2-util --init-token failed: \(result.output)") }
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// `pkcs11:token=<label>?module-path=…`, plus any more path attributes.
    func uri(_ extra: String = "") throws -> PKCS11URI {
        try PKCS11URI("pkcs11:token=\(label)\(extra)?module-path=\(Self.modulePath)")
    }

    /// A token on a module of its own, not logged in.
    func token() throws -> PKCS11Token {
        try PKCS11Token(uri: uri())
    }

    /// A token on a module of its own, logged in with the user PIN.
    func loggedInToken() throws -> PKCS11Token {
        let token = try token()
        try token.login(pin: pin(Self.userPIN))
        return token
    }

    /// Runs a program with this token's configuration; stdout and stderr together.
    func run(_ program: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(["SOFTHSM2_CONF": configuration]) { $1 }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data: Data
        do {
            data = try read(output.fileHandleForReading, until: "\(program) \(arguments.first ?? "") to end")
        } catch {
            kill(process.processIdentifier, SIGKILL)
            throw error
        }
        try waitForExit(process, "\(program) \(arguments.first ?? "")")
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}

struct FixtureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

func pin(_ text: String) -> SecureBytes { SecureBytes(copying: Array(text.utf8)) }

func bytes(of secure: SecureBytes) -> [UInt8] { secure.withUnsafeBytes { Array($0) } }

/// The PKCS11Error `body` throws, or nil when it does not throw one.
func pkcs11Error<T>(_ body: () throws -> T) -> PKCS11Error? {
    do {
        _ = try body()
        return nil
    } catch let error as PKCS11Error {
        return error
    } catch {
        return nil
    }
}
