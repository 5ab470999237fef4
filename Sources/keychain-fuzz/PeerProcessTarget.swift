// The peer-process target: what keychaind and the Secret Service read of another process in /proc
// (its cgroup, its `.flatpak-info`, its mount table, a pidfd's fdinfo) and the app id the Secret
// portal is handed. A process writes its own cgroup's name (a unit's `Delegate=`), its own
// `.flatpak-info` inside a sandbox and its own mounts: each is an attacker's text here.
#if FUZZING
import KeychainCLIText
@testable import KeychainEngine
@testable import SecretService

extension FuzzTarget {
    /// Each parser over the input, with what a result must satisfy: a unit name systemd allows, an
    /// app id Flatpak allows, the mount table's answer the same whichever way its bytes arrive.
    static func peerProcess(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        if let unit = CallerIdentity.systemUnit(cgroup: text) {
            guard CallerIdentity.isSystemUnitName(unit), !unit.contains("/") else {
                fatalError("a cgroup named a unit systemd does not allow: \(lowerHex(unit.utf8))")
            }
        }
        for id in [CallerIdentity.flatpakScope(cgroup: text), CallerIdentity.flatpakApplication(info: text)].compactMap({ $0 }) {
            guard CallerIdentity.isFlatpakAppID(id) else { fatalError("an app id Flatpak does not allow: \(lowerHex(id.utf8))") }
        }
        _ = CallerIdentity.pid(fdinfo: text)
        mountTableAgrees(bytes)
        if case .success(let id) = PortalAppID.parse(text) {
            guard id.value == text, !text.isEmpty, text.utf8.count <= PortalAppID.maxBytes,
                  text.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7f && $0 != UInt8(ascii: "/") }) else {
                fatalError("the portal's app id rule let through \(lowerHex(text.utf8))")
            }
        }
    }

    /// The table read whole and read in pieces (cut where the input's first byte says, as reads of
    /// a pipe or a file cut it) give one answer, or one refusal.
    private static func mountTableAgrees(_ bytes: [UInt8]) {
        let whole = Result { () throws(MountTable.Refusal) -> Bool in try MountTable.mountsFlatpakInfo(String(decoding: bytes, as: UTF8.self)) }
        // The whole-text reader sees the bytes as UTF-8 repaired; compare on those same bytes.
        let repaired = Array(String(decoding: bytes, as: UTF8.self).utf8)
        let step = max(1, Int(bytes.first ?? 1))
        var table = MountTable()
        let pieces = Result { () throws(MountTable.Refusal) -> Bool in
            var start = 0
            while start < repaired.count {
                let end = min(repaired.count, start + step)
                if try table.scan(repaired[start..<end]) { return true }
                start = end
            }
            return try table.finish()
        }
        switch (whole, pieces) {
        case (.success(let a), .success(let b)) where a == b: return
        case (.failure, .failure): return
        default: fatalError("the mount table read whole (\(whole)) and in pieces of \(step) (\(pieces)) disagree")
        }
    }
}
#endif
