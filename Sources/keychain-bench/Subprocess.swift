import Foundation

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

    /// Runs `argv` to completion; the time is from spawn to reaped exit.
    func run(_ argv: [String]) throws -> Result {
        let outPath = directory + "/stdout", errPath = directory + "/stderr"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var cArgs = argv.map { strdup($0) } + [nil]
        var cEnv = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { cArgs.forEach { free($0) }; cEnv.forEach { free($0) } }

        var child: pid_t = 0
        let start = monotonicNanoseconds()
        let rc = posix_spawnp(&child, argv[0], &actions, nil, &cArgs, &cEnv)
        guard rc == 0 else { throw Failure(description: "cannot start \(argv[0]): \(String(cString: strerror(rc)))") }
        var status: Int32 = 0
        while waitpid(child, &status, 0) < 0 && errno == EINTR {}
        let elapsed = monotonicNanoseconds() - start

        let output = (FileManager.default.contents(atPath: outPath)).map { [UInt8]($0) } ?? []
        let errors = (FileManager.default.contents(atPath: errPath)).map { String(decoding: $0, as: UTF8.self) } ?? ""
        // WEXITSTATUS/WIFEXITED are macros Swift does not import.
        let exitStatus = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        return Result(status: exitStatus, nanoseconds: elapsed, output: output, errorOutput: errors)
    }

    /// Runs `argv` and throws with its stderr unless it exits 0.
    @discardableResult
    func check(_ argv: [String]) throws -> Result {
        let result = try run(argv)
        guard result.status == 0 else {
            throw Failure(description: "\(argv.joined(separator: " ")) exited \(result.status): "
                          + result.errorOutput.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        return result
    }
}
