import Foundation
import Keychain
import KeychainClient
import KeychainTestSupport
import KeychainWire

/// `--warm-reads N`: N warm in-process `getItem` calls of one item (`afterFirstUnlock`, its key
/// opened by one read first) on a private swtpm, one caller, and nothing else. Made for
/// `valgrind --tool=callgrind`: two runs with different N, and the difference of their instruction
/// counts over the difference of N is the instructions of one warm read, whatever else the machine does.
/// `--daemon-warm-reads N`: the same through keychaind (found beside the bench, as `--daemon` finds
/// it), one client: the bench's instructions are the client's, keychaind's its own (a `keychaind`
/// beside a copy of the bench that runs the real one under valgrind counts them; it ends by SIGTERM).
/// `--cold-reads N`: N in-process reads each made cold first (`dropCaches`: the key unsealed again).
func warmReadBench(reads: Int, throughDaemon: Bool = false, cold: Bool = false) async throws -> String {
    let tpm = try SoftwareTPM()
    defer { tpm.stop() }
    let daemon = throughDaemon ? try KeychainDaemon(tpm: tpm) : nil
    defer {
        if let daemon {
            kill(daemon.processIdentifier, SIGTERM)
            _ = daemon.waitForExit()
        }
    }
    let configuration = daemon?.configuration() ?? tpm.configuration()
    let keychain = try createKeychain(.init(service: "warm"), configuration: configuration)
    let secret = "a secret of 32 bytes, more or less"
    try await keychain.setItem("k0", secret)
    guard try await keychain.getItem("k0") == secret else { throw BenchFailure("getItem returned another value") }
    let device = KeychainDevice(configuration: configuration)
    _ = await device.takeTPMCommandCount()
    let started = ContinuousClock.now
    for _ in 0..<reads {
        if cold { await device.dropCaches() }
        guard try await keychain.getItem("k0") == secret else { throw BenchFailure("getItem returned another value") }
    }
    let took = ContinuousClock.now - started
    let seconds = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
    let commands = await device.takeTPMCommandCount()
    return "\(cold ? "cold" : "warm") getItem\(throughDaemon ? " through keychaind" : ""), one caller: \(reads) reads in \(String(format: "%.3f", seconds)) s, "
        + "\(Int(Double(reads) / seconds)) reads/s, \(commands) TPM commands"
}

/// `--client-warm-reads N`: N warm `getItem` calls of the same item through keychaind from Swift's small
/// client (`KeychainClient`: the wire alone, blocking, a connection per call), beside the bindings'
/// (scripts/bench-bindings.py). The item is written by the library first; one caller.
func clientWarmReadBench(reads: Int) async throws -> String {
    try await withBenchDaemon { daemon in try await clientWarmReads(through: daemon, reads: reads) }
}

private func clientWarmReads(through daemon: KeychainDaemon, reads: Int) async throws -> String {
    let secret = "a secret of 32 bytes, more or less"
    try await createKeychain(.init(service: "warm"), configuration: daemon.configuration()).setItem("k0", secret)
    let client = try KeychainClient(options: WireStorageOptions(service: "warm"), socket: daemon.socket)
    let expected = Array(secret.utf8)
    let started = ContinuousClock.now
    for _ in 0..<reads {
        guard var value = try client.getItem("k0"), value == expected else { throw BenchFailure("getItem returned another value") }
        value.wipe()
    }
    let took = ContinuousClock.now - started
    let seconds = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
    return "warm getItem through keychaind from KeychainClient, one caller: \(reads) reads in \(String(format: "%.3f", seconds)) s, "
        + "\(Int(Double(reads) / seconds)) reads/s"
}
