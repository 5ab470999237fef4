import Foundation
import Keychain
import Synchronization

/// What a finished child process gave: its exit status (-1 when a signal ended it), stdout and stderr.
package typealias ChildResult = (status: Int32, stdout: [UInt8], stderr: String)

/// Runs a program with `input` on stdin (a secret goes there, never in argv) and returns its exit
/// status, stdout and stderr, for the project's tests.
///
/// Through `Processes.spawn`, so the child holds no descriptor of another test (a pipe's write end, a
/// TPM connection) that would keep that test waiting. stdin is written and stderr read on threads of
/// their own while stdout is read, so a child that writes much to stderr, or reads its input late,
/// never deadlocks against the test. A child may exit without reading all its input (a refused
/// `set`): that is EPIPE for the write, not a SIGPIPE that ends the test process. A child still
/// running after `deadline` seconds (a TPM client queued behind another forever) is killed, so it
/// fails its test instead of holding the whole run; its stderr then says so.
package func runChild(_ path: String, _ args: [String], input: [UInt8] = [], environment: [String: String] = [:],
                      deadline: Int = 120) throws -> ChildResult {
    let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
    let child = try Child(path, [path] + args, environment: environment, deadline: deadline,
                          stdin: stdin, stdout: stdout.fileHandleForWriting, stderr: stderr.fileHandleForWriting)
    let written = DispatchSemaphore(value: 0), errorRead = DispatchSemaphore(value: 0)
    let err = Mutex(Data())
    DispatchQueue.global().async {
        try? stdin.fileHandleForWriting.write(contentsOf: Data(input))
        try? stdin.fileHandleForWriting.close()
        written.signal()
    }
    DispatchQueue.global().async {
        let data = stderr.fileHandleForReading.readDataToEndOfFile()
        err.withLock { $0 = data }
        errorRead.signal()
    }
    let out = stdout.fileHandleForReading.readDataToEndOfFile()
    let (status, killed) = child.wait()
    written.wait()
    errorRead.wait()
    let said = String(decoding: err.withLock { $0 }, as: UTF8.self)
    return (status, Array(out), said + (killed ? "\n[killed: a signal ended it, or it ran past \(deadline) s]" : ""))
}

/// Runs a program with stdout and stderr on one pipe, as a terminal shows both, and types `typed`
/// on its stdin only once that output has shown `prompt`, as a person would; returns its exit status
/// and everything it showed (what follows the prompt is then what the program let the terminal
/// echo). With `thenEnd`, stdin is closed once typed (end of input, as Ctrl-D on a terminal).
/// Killed after `deadline` seconds like `runChild`'s children.
package func runChild(_ path: String, _ args: [String], typing typed: [UInt8], after prompt: String, thenEnd: Bool = false,
                      environment: [String: String] = [:], deadline: Int = 120) throws -> (status: Int32, shown: String) {
    let stdin = Pipe(), output = Pipe()
    let child = try Child(path, [path] + args, environment: environment, deadline: deadline,
                          stdin: stdin, stdout: output.fileHandleForWriting, stderr: output.fileHandleForWriting)
    var shown = Data()
    while !String(decoding: shown, as: UTF8.self).contains(prompt) {
        let more = output.fileHandleForReading.availableData
        if more.isEmpty { break }
        shown += more
    }
    try? stdin.fileHandleForWriting.write(contentsOf: Data(typed))
    if thenEnd { try? stdin.fileHandleForWriting.close() }
    shown += output.fileHandleForReading.readDataToEndOfFile()
    if !thenEnd { try? stdin.fileHandleForWriting.close() }
    let (status, killed) = child.wait()
    return (status, String(decoding: shown, as: UTF8.self) + (killed ? "\n[killed: a signal ended it, or it ran past \(deadline) s]" : ""))
}

/// A child of a test started through `Processes.spawn` (so it holds no descriptor of another test),
/// with this process's environment merged with `environment`, stdin from `stdin`'s read end and the
/// given write ends as stdout and stderr (the parent's copies closed), killed if it still runs after
/// `deadline` seconds.
private final class Child: Sendable {
    let pid: pid_t
    private let finished = Mutex(false)

    init(_ path: String, _ argv: [String], environment: [String: String], deadline: Int,
         stdin: Pipe, stdout: FileHandle, stderr: FileHandle) throws {
        _ = ignoreBrokenPipesInTests
        var env = ProcessInfo.processInfo.environment
        env.merge(environment) { $1 }
        guard let pid = Processes.spawn(path, argv, environment: env, stdin: stdin.fileHandleForReading.fileDescriptor,
                                        stdout: stdout.fileDescriptor, stderr: stderr.fileDescriptor) else {
            throw SoftwareTPMError("cannot start \(path): errno \(errno)")
        }
        self.pid = pid
        try stdin.fileHandleForReading.close()
        try stdout.close()
        if stderr !== stdout { try stderr.close() }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(deadline)) { [self] in
            finished.withLock { done in if !done { kill(pid, SIGKILL) } }
        }
    }

    /// Its exit status (-1 when a signal ended it) and whether the deadline or a signal ended it.
    func wait() -> (status: Int32, killed: Bool) {
        let status = Processes.wait(pid)
        return (status, finished.withLock { done in defer { done = true }; return status == -1 })
    }
}

/// SIGPIPE ignored in the test process, once (children still start with the default).
package let ignoreBrokenPipesInTests: Void = { signal(SIGPIPE, SIG_IGN) }()

/// The path of the package's executable `name`, in the build directory that holds the test bundle
/// (`.build/debug`), found by walking up from the bundle's path.
package func builtExecutable(_ name: String) -> String {
    var url = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    while url.pathComponents.count > 1 && !FileManager.default.fileExists(atPath: url.appendingPathComponent(name).path) {
        url.deleteLastPathComponent()
    }
    return url.appendingPathComponent(name).path
}
