import Glibc
import Keychain
import KeychainCLIText
import Synchronization
import TPM2

/// Lines on the terminal (stderr) while a command keeps the TPM busy past a second (issue 39 item 3: a
/// chip takes 1–3 s for `init` or `attest respond`): once a second, the command, the TPM commands sent so
/// far, the time, and the TPM command in flight. Whole lines, so the command's own output starts on a
/// line of its own. Shown only while the TPM works (a command in flight, or one sent since the last look),
/// so never over a prompt waiting for the user. Through keychaind the TPM is the daemon's: nothing to show.
final class TerminalProgress: Sendable {
    private let stopped = Mutex(false)

    /// Progress lines for `command` when stderr is a terminal; nil otherwise.
    static func start(_ command: [String]) -> TerminalProgress? {
        guard isatty(2) == 1, let first = command.first, first != "demo" else { return nil }
        let grouped = ["attest", "passcode", "reader", "boot-state", "token", "tpm", "secret-service"].contains(first)
        return TerminalProgress(name: "keychainctl " + escaped((grouped ? command.prefix(2) : command.prefix(1)).joined(separator: " ")))
    }

    private init(name: String) {
        let started = ContinuousClock.now, first = TPMActivity.now.sent
        // Without a thread (pthread_create refused) the command runs as before, without the lines.
        _ = DetachedThread.start(name: "progress") { [self] in
            var (last, shownAt) = (first, 0)
            while true {
                usleep(250_000)
                let activity = TPMActivity.now
                let busy = activity.current != nil || activity.sent != last
                last = activity.sent
                let elapsed = (ContinuousClock.now - started).components
                let tenths = Int(elapsed.seconds) * 10 + Int(elapsed.attoseconds / 100_000_000_000_000_000)
                let stop = stopped.withLock { stopped in
                    guard !stopped else { return true }
                    guard busy, tenths >= 10, tenths - shownAt >= 10 else { return false }
                    let doing = activity.current.map { ", now \($0)" } ?? ""
                    writeAll(2, "\(name): \(activity.sent - first) TPM commands in \(tenths / 10).\(tenths % 10) s\(doing)\n")
                    shownAt = tenths
                    return false
                }
                if stop { return }
            }
        }
    }

    /// No line after this.
    func finish() { stopped.withLock { $0 = true } }
}
