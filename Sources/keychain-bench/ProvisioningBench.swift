import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory

/// `keychain-bench --provisioning`: seal-for throughput (no TPM), import's TPM commands and latency,
/// and backup / restore of many items (time and the process's peak memory), on two private swtpms.
func provisioningBench(items: Int, seals: Int, imports: Int) async throws -> String {
    let tpmA = try SoftwareTPM(), tpmB = try SoftwareTPM()
    let a = try KeychainAdministration(configuration: tpmA.configuration()), b = KeychainDevice(configuration: tpmB.configuration())
    let identity = try await b.identity()
    var report = "## Provisioning and backup (keychain-bench --provisioning)\n\n| operation | figure |\n|---|---|\n"

    // seal-for: pure computation, one thread.
    let value = SecureBytes(copying: Array("a Wi-Fi pre-shared key of some length".utf8))
    for parent in Provisioning.Parent.allCases {
        let start = ContinuousClock.now
        for n in 0..<seals {
            _ = try Provisioning.seal(value, service: "bench", key: "k\(n)", accessible: .whenUnlocked, for: identity, parent: parent, unattestedSRK: parent == .storageRootKey)
        }
        let seconds = (ContinuousClock.now - start).seconds
        report += "| seal-for to the \(parent == .endorsementKey ? "EK (RSA-OAEP)" : "SRK (P-256 ECDH)"), one core | \(Int(Double(seals) / seconds)) bundles/s |\n"
    }

    // import: TPM commands and latency per bundle (each a new item, so each does the whole import).
    for parent in Provisioning.Parent.allCases {
        var latencies: [Duration] = []
        var commands: [Int] = []
        for n in 0..<imports {
            let bundle = try Provisioning.seal(value, service: "import-\(parent.rawValue)", key: "k\(n)", accessible: .afterFirstUnlock,
                                               for: identity, parent: parent, unattestedSRK: parent == .storageRootKey)
            _ = await b.takeTPMCommandCount()
            let start = ContinuousClock.now
            _ = try await b.importBundle(bundle)
            latencies.append(ContinuousClock.now - start)
            commands.append(await b.takeTPMCommandCount())
        }
        latencies.sort()
        report += "| import (afterFirstUnlock) under the \(parent == .endorsementKey ? "EK" : "SRK"): TPM commands | \(commands.min()!)–\(commands.max()!) |\n"
        report += "| import under the \(parent == .endorsementKey ? "EK" : "SRK"): latency p50 | \(milliseconds(latencies[latencies.count / 2])) |\n"
    }

    // backup and restore of `items` items.
    let storage = try createKeychain(.init(service: "bench-backup"), configuration: tpmA.configuration())
    for n in 0..<items {
        try await storage.setItem("item-\(n)", SecureBytes(random: 256), options: .init(label: "item \(n)"))
    }
    let passphrase = SecureBytes(copying: Array("bench passphrase".utf8))
    let file = tpmA.directory + "/bench.kcb", sealedFile = tpmA.directory + "/bench-to-b.kcb"
    var start = ContinuousClock.now
    _ = try await a.backup(toFile: file, passphrase: passphrase, cost: .interactive)
    report += "| backup of \(items) items, passphrase (Argon2id interactive) | \(milliseconds(ContinuousClock.now - start)), peak RSS \(peakMemory()) |\n"
    start = ContinuousClock.now
    _ = try await a.backup(toFile: sealedFile, sealedTo: identity)
    report += "| backup of \(items) items, --to B | \(milliseconds(ContinuousClock.now - start)), peak RSS \(peakMemory()) |\n"
    start = ContinuousClock.now
    let restored = try await KeychainAdministration(configuration: tpmB.configuration()).restore(fromFile: file, passphrase: passphrase)
    report += "| restore of \(restored.restored.count) items on B | \(milliseconds(ContinuousClock.now - start)), peak RSS \(peakMemory()) |\n"
    let size = (try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? 0
    report += "| backup file | \(size) bytes |\n"
    return report
}

private func milliseconds(_ d: Duration) -> String { String(format: "%.1f ms", d.seconds * 1000) }

/// The process's peak resident set so far (getrusage).
private func peakMemory() -> String {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return String(format: "%.1f MB", Double(usage.ru_maxrss) / 1024)
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
