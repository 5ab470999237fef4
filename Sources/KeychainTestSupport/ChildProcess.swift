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
    _ = ignoreBrokenPipesInTests
    var env = ProcessInfo.processInfo.environment
    env.merge(environment) { $1 }
    let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
    guard let pid = Processes.spawn(path, [path] + args, environment: env,
                                    stdin: stdin.fileHandleForReading.fileDescriptor,
                                    stdout: stdout.fileHandleForWriting.fileDescriptor,
                                    stderr: stderr.fileHandleForWriting.fileDescriptor) else {
        throw SoftwareTPMError("cannot start \(path): errno \(errno)")
    }
    try stdin.fileHandleForReading.close()
    try stdout.fileHandleForWriting.close()
    try stderr.fileHandleForWriting.close()
    let finished = Mutex(false)
    DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(deadline)) {
        finished.withLock { done in if !done { kill(pid, SIGKILL) } }
    }
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
    let status = Processes.wait(pid)
    let killed = finished.withLock { done in defer { done = true }; return status == -1 }
    written.wait()
    errorRead.wait()
    let said = String(decoding: err.withLock { $0 }, as: UTF8.self)
    return (status, Array(out), said + (killed ? "\n[killed: a signal ended it, or it ran past \(deadline) s]" : ""))
}

/// SIGPIPE ignored in the test process, once (children still start with the default).
package let ignoreBrokenPipesInTests: Void = { signal(SIGPIPE, SIG_IGN) }()
