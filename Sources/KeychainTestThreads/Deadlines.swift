import Foundation

/// A test's wait that ran past its own deadline, naming what it waited for: a hang becomes a failure
/// that says which wait was stuck, before the run's watchdog (scripts/test-watchdog.sh) ends everything.
public struct WaitTimedOut: Error, CustomStringConvertible {
    public let description: String
    public init(_ what: String, seconds: Double, sofar: String = "") {
        description = "waited \(seconds) s for \(what)" + (sofar.isEmpty ? "" : "; it had said: \(sofar.suffix(400))")
    }
}

/// How long a test waits for one thing before it fails naming it: long enough for a machine loaded 20
/// deep (a child of a test is killed after 120 s, `childDeadlineSeconds`), never a measure of speed.
public let testWaitSeconds: Double = 120

/// Reads `handle` (a pipe's read end) until `enough` says what came is enough, or every writer closed
/// it; returns what came. After `seconds` it throws `WaitTimedOut` naming `what`.
public func read(_ handle: FileHandle, until what: String, seconds: Double = testWaitSeconds,
                 enough: (Data) -> Bool = { _ in false }) throws -> Data {
    let end = ContinuousClock.now + .seconds(seconds)
    var data = Data()
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while !enough(data) {
        let left = end - ContinuousClock.now
        guard left > .zero else { throw WaitTimedOut(what, seconds: seconds, sofar: String(decoding: data, as: UTF8.self)) }
        var ready = pollfd(fd: handle.fileDescriptor, events: Int16(POLLIN), revents: 0)
        let milliseconds = Int32(min(left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000, 60_000))
        let polled = poll(&ready, 1, max(milliseconds, 1))
        if polled == 0 || (polled < 0 && errno == EINTR) { continue }
        if polled < 0 { break }
        let count = buffer.withUnsafeMutableBytes { Glibc.read(handle.fileDescriptor, $0.baseAddress, $0.count) }
        if count < 0 && errno == EINTR { continue }
        if count <= 0 { break }
        data += buffer[..<count]
    }
    return data
}

/// Waits for `process` to end; after `seconds` it is killed (SIGKILL) and `WaitTimedOut` names `what`.
public func waitForExit(_ process: Process, _ what: String, seconds: Double = testWaitSeconds) throws {
    let end = ContinuousClock.now + .seconds(seconds)
    while process.isRunning {
        guard ContinuousClock.now < end else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw WaitTimedOut(what, seconds: seconds)
        }
        usleep(10_000)
    }
    process.waitUntilExit()
}

/// Waits until `condition` holds, checking every 20 ms; after `seconds` it throws `WaitTimedOut` naming `what`.
public func waitUntil(_ what: String, seconds: Double = testWaitSeconds, _ condition: () throws -> Bool) throws {
    let end = ContinuousClock.now + .seconds(seconds)
    while try !condition() {
        guard ContinuousClock.now < end else { throw WaitTimedOut(what, seconds: seconds) }
        usleep(20_000)
    }
}
