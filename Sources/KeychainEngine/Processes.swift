import KeychainCore
import Glibc
import KeychainBasics
internal import CSpawn
import FoundationEssentials

/// Child processes: the software TPMs (embedded and test support) and the programs tests run.
package enum Processes {
    /// Starts `path` with `argv`; its stdin, stdout and stderr are the given descriptors, or /dev/null.
    ///
    /// The child gets nothing else of ours. Every other descriptor is closed in it: not all of ours
    /// are close-on-exec (tpm2-tss opens its sockets without it), and a long-lived child holding
    /// another thread's TPM connection or a pipe's write end hangs that thread's peer forever. Signals
    /// start with an empty mask and default dispositions: threads of the cooperative pool block
    /// SIGTERM, and a child would inherit that and survive a plain `kill`.
    /// posix_spawn, not Foundation's `Process`, which needs a run loop that an actor's thread lacks.
    package static func spawn(_ path: String, _ argv: [String], environment: [String: String]? = nil,
                              stdin: Int32? = nil, stdout: Int32? = nil, stderr: Int32? = nil,
                              passing fd3: Int32? = nil) -> Int32? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for (target, source) in [stdin, stdout, stderr].enumerated() {
            if let source {
                posix_spawn_file_actions_adddup2(&actions, source, Int32(target))
            } else {
                posix_spawn_file_actions_addopen(&actions, Int32(target), "/dev/null", target == 0 ? O_RDONLY : O_WRONLY, 0)
            }
        }
        // `passing`: one more descriptor, as fd 3 (systemd's socket activation passes a socket so).
        if let fd3 { posix_spawn_file_actions_adddup2(&actions, fd3, 3) }
        posix_spawn_file_actions_addclosefrom_np(&actions, fd3 == nil ? 3 : 4)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t(), all = sigset_t()
        sigemptyset(&empty)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var cArgs = argv.map { strdup($0) } + [nil]
        defer { cArgs.forEach { free($0) } }
        var cEnv = (environment ?? ProcessInfo.processInfo.environment).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { cEnv.forEach { free($0) } }
        var pid: Int32 = 0
        let rc = posix_spawn(&pid, path, &actions, &attributes, &cArgs, &cEnv)
        guard rc == 0 else { errno = rc; return nil }
        return pid
    }

    /// Waits for a child; its exit status, or 128 + the signal that ended it.
    package static func wait(_ pid: Int32) -> Int32 {
        var status: Int32 = 0
        _ = valueOrErrno { waitpid(pid, &status, 0) }
        return (status & 0x7F) == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
    }

    /// The first executable `name` in the folders of `searchPath` (the environment's PATH by
    /// default), then /usr/bin and /usr/local/bin. Empty entries (the working directory) are skipped.
    package static func findExecutable(_ name: String,
                                       searchPath: String? = ProcessInfo.processInfo.environment["PATH"]) -> String? {
        // Strings, not `split`'s default: joined with "+" to the fallbacks it became [[Character]],
        // and "\(dir)/…" made "["/", "u", …]/name" of each folder.
        let folders: [String] = (searchPath ?? "/usr/bin:/bin").split(separator: ":").map(String.init)
        for dir in folders + ["/usr/bin", "/usr/local/bin"] {
            let candidate = "\(dir)/\(name)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }
}
