import Foundation

/// Nanoseconds on the monotonic clock (never steps with the wall clock).
@inline(__always)
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// The latencies of one measured operation, and the TPM commands it sent in all.
struct Samples: Codable {
    private(set) var nanoseconds: [UInt64] = []
    var tpmCommands = 0

    init(capacity: Int = 0) { nanoseconds.reserveCapacity(capacity) }

    mutating func record(_ elapsed: UInt64) { nanoseconds.append(elapsed) }

    var count: Int { nanoseconds.count }

    /// Nearest-rank percentile (`p` in 0...100).
    func percentile(_ p: Double) -> UInt64 {
        guard !nanoseconds.isEmpty else { return 0 }
        let sorted = nanoseconds.sorted()
        let rank = Int((p / 100 * Double(sorted.count)).rounded(.up))
        return sorted[min(max(rank, 1), sorted.count) - 1]
    }

    var p50: UInt64 { percentile(50) }
    var p99: UInt64 { percentile(99) }

    /// Operations per second of one caller doing nothing else: count over the summed latencies.
    var opsPerSecond: Double {
        let total = nanoseconds.reduce(0, +)
        return total == 0 ? 0 : Double(count) / (Double(total) / 1e9)
    }

    var commandsPerOp: Double { count == 0 ? 0 : Double(tpmCommands) / Double(count) }
}

enum Format {
    /// "812 ns", "23.4 µs", "2.31 ms", "1.20 s".
    static func duration(_ ns: UInt64) -> String {
        let value = Double(ns)
        switch value {
        case ..<1_000: return "\(ns) ns"
        case ..<100_000: return String(format: "%.1f µs", value / 1e3)
        case ..<1_000_000: return String(format: "%.0f µs", value / 1e3)
        case ..<1_000_000_000: return String(format: "%.2f ms", value / 1e6)
        default: return String(format: "%.2f s", value / 1e9)
        }
    }

    /// "312", "4,210", "81,300": three significant figures are all a run can promise.
    static func rate(_ perSecond: Double) -> String {
        guard perSecond >= 1 else { return String(format: "%.2f", perSecond) }
        let digits = Int(log10(perSecond)) + 1
        let unit = pow(10, Double(max(digits - 3, 0)))
        let rounded = Int((perSecond / unit).rounded() * unit)
        let formatter = NumberFormatter()
        formatter.numberStyle = .decimal
        formatter.usesGroupingSeparator = true
        formatter.groupingSeparator = ","
        return formatter.string(from: NSNumber(value: rounded)) ?? "\(rounded)"
    }

    /// "0", "5", "3.50".
    static func commands(_ perOp: Double) -> String {
        perOp == perOp.rounded() ? String(Int(perOp)) : String(format: "%.2f", perOp)
    }

    /// The columns most tables give a sample set: p50, p99, ops/s and TPM commands per operation.
    static func figures(_ samples: Samples) -> [String] {
        [duration(samples.p50), duration(samples.p99), rate(samples.opsPerSecond), commands(samples.commandsPerOp)]
    }

    static func ratio(_ value: Double) -> String { String(format: "%.1f×", value) }
}

/// A Markdown table, so the output pastes into docs/performance.md as it is: the leading `text`
/// columns left-aligned, the figures after them right-aligned.
struct Table {
    var header: [String]
    var rows: [[String]] = []
    let textColumns: Int

    init(_ header: String..., text textColumns: Int = 1) {
        self.header = header
        self.textColumns = textColumns
    }

    mutating func add(_ row: String...) { add(row) }
    mutating func add(_ row: [String]) { rows.append(row) }

    func render() -> String {
        let widths = header.indices.map { column in
            ([header] + rows).map { $0[column].count }.max() ?? 0
        }
        func line(_ cells: [String], numeric: Bool) -> String {
            let padded = cells.enumerated().map { column, cell in
                let pad = String(repeating: " ", count: widths[column] - cell.count)
                return numeric && column >= textColumns ? pad + cell : cell + pad
            }
            return "| " + padded.joined(separator: " | ") + " |"
        }
        let rule = "|" + widths.enumerated().map { column, width in
            column < textColumns ? String(repeating: "-", count: width + 2) : String(repeating: "-", count: width + 1) + ":"
        }.joined(separator: "|") + "|"
        return ([line(header, numeric: false), rule] + rows.map { line($0, numeric: true) }).joined(separator: "\n")
    }
}
