import Foundation

/// How much of the machine other work took during the run, since every figure is skewed by it:
/// all the CPU time spent on every core (/proc/stat, steal included), minus this process, its
/// reaped children (tpm2-tools, keychainctl) and its swtpm.
struct OtherWork {
    private struct Snapshot { var busy = 0, total = 0, ours = 0 }

    private let swtpmDirectory: String
    private let start: Snapshot

    /// - Parameter swtpmDirectory: the state directory on the swtpm's command line, to find its process.
    init(swtpmDirectory: String) {
        self.swtpmDirectory = swtpmDirectory
        start = Self.snapshot(swtpmDirectory)
    }

    /// The percentage of all cores' time that other processes used since `init`.
    func percentage() -> Double {
        let end = Self.snapshot(swtpmDirectory)
        let total = end.total - start.total
        guard total > 0 else { return 0 }
        return max(0, Double((end.busy - start.busy) - (end.ours - start.ours)) / Double(total) * 100)
    }

    private static func snapshot(_ swtpmDirectory: String) -> Snapshot {
        var snapshot = Snapshot()
        // "cpu  user nice system idle iowait irq softirq steal …", in clock ticks summed over the cores.
        if let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
           let line = stat.split(separator: "\n").first {
            let ticks = line.split(separator: " ").dropFirst().prefix(8).compactMap { Int($0) }
            if ticks.count == 8 {
                snapshot.total = ticks.reduce(0, +)
                snapshot.busy = snapshot.total - ticks[3] - ticks[4]
            }
        }
        snapshot.ours = cpuTicks(of: "self", withChildren: true)
            + swtpmProcesses(swtpmDirectory).map { cpuTicks(of: $0, withChildren: false) }.reduce(0, +)
        return snapshot
    }

    /// utime + stime, and cutime + cstime of reaped children, from /proc/PID/stat.
    private static func cpuTicks(of pid: String, withChildren: Bool) -> Int {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let commEnd = stat.lastIndex(of: ")") else { return 0 }
        // After "pid (comm) ": state is field 3, then utime is field 14 … cstime field 17.
        let fields = stat[stat.index(after: commEnd)...].split(separator: " ")
        let times = fields.dropFirst(11).prefix(withChildren ? 4 : 2).compactMap { Int($0) }
        return times.reduce(0, +)
    }

    private static func swtpmProcesses(_ directory: String) -> [String] {
        let pids = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return pids.filter { pid in
            guard pid.allSatisfy(\.isNumber),
                  let cmdline = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
            return String(decoding: cmdline, as: UTF8.self).contains(directory)
        }
    }
}
