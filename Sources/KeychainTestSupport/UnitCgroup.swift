import Foundation
import Glibc

/// A system unit's cgroup, as systemd makes one (`system.slice/PREFIX-N.service`: cgroup v1's
/// `name=systemd` hierarchy where there is one, else the unified one), removed at the end. Root only.
package final class UnitCgroup {
    package let name: String
    package let path: String

    package init(_ prefix: String) throws {
        name = "\(prefix)-\(UInt32.random(in: 0...UInt32.max)).service"
        let v1 = "/sys/fs/cgroup/systemd"
        let root = FileManager.default.fileExists(atPath: v1 + "/cgroup.procs") ? v1 : "/sys/fs/cgroup"
        path = "\(root)/system.slice/\(name)"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    deinit { rmdir(path) }
}
