import Foundation
import Keychain

/// Runs other programs (tpm2-tools, keychainctl) the way a shell would: found on PATH, stdin from
/// /dev/null, stdout and stderr to files read back after the run, so timing covers the process only.
struct Subprocess {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    struct Result {
        let status: Int32
        let nanoseconds: UInt64
        let output: [UInt8]
        let errorOutput: String
    }

    /// Where stdout and stderr go; one pair per runner, overwritten by every run.
    let directory: String
    let environment: [String: String]

    init(directory: String, extraEnvironment: [String: String] = [:]) {
        self.directory = directory
        self.environment = ProcessInfo.processInfo.environment.merging(extraEnvironment) { $1 }
    }

    static func isInstalled(_ program: String) -> Bool {
        if program.contains("/") { return FileManager.default.isExecutableFile(atPath: program) }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        return path.split(separator: ":").contains { FileManager.default.isExecutableFile(atPath: "\($0)/\(program)") }
    }

    /// Runs `argv` to completion; the time is from spawn to reaped exit. `input`, when given, is its
    /// stdin (a file written before the clock starts).
    func run(_ argv: [String], input: [UInt8]? = nil) throws -> Result {
        let outPath = directory + "/stdout", errPath = directory + "/stderr", inPath = directory + "/stdin"
        if let input {
            guard FileManager.default.createFile(atPath: inPath, contents: Data(input), attributes: [.posixPermissions: 0o600]) else {
                throw Failure(description: "cannot write \(inPath)")
            }
        }
        let out = open(outPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let err = open(errPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let stdin = input == nil ? -1 : open(inPath, O_RDONLY | O_CLOEXEC)
        defer { close(out); close(err); if stdin >= 0 { close(stdin) } }
        guard out >= 0, err >= 0, input == nil || stdin >= 0 else { throw Failure(description: "cannot open \(outPath): errno \(errno)") }
        guard let path = argv[0].contains("/") ? argv[0] : Processes.findExecutable(argv[0]) else {
            throw Failure(description: "cannot find \(argv[0])")
        }
        let start = monotonicNanoseconds()
        guard let child = Processes.spawn(path, argv, environment: environment, stdin: stdin >= 0 ? stdin : nil, stdout: out, stderr: err) else {
            throw Failure(description: "cannot start \(argv[0]): \(String(cString: strerror(errno)))")
        }
        let exitStatus = Processes.wait(child)
        let elapsed = monotonicNanoseconds() - start

        let output = (FileManager.default.contents(atPath: outPath)).map { [UInt8]($0) } ?? []
        let errors = (FileManager.default.contents(atPath: errPath)).map { String(decoding: $0, as: UTF8.self) } ?? ""
        return Result(status: exitStatus, nanoseconds: elapsed, output: output, errorOutput: errors)
    }

    /// Runs `argv` and throws with its stderr unless it exits 0.
    @discardableResult
    func check(_ argv: [String], input: [UInt8]? = nil) throws -> Result {
        let result = try run(argv, input: input)
        guard result.status == 0 else {
            throw Failure(description: "\(argv.joined(separator: " ")) exited \(result.status): "
                          + result.errorOutput.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return result
    }
}
