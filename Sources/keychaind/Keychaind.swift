import Glibc
import FoundationEssentials
import KeychainEngine
import KeychainDaemon
import KeychainCLIText

/// keychaind: serves the keychain API on a Unix socket (docs/daemon.md).
let usage = """
    usage: keychaind --socket PATH --store DIR [--tcti CONF] [--groups DIR] [--reader DIR|none]
                     [--max-connections N] [--idle-timeout SECONDS] [--stall-timeout SECONDS]
                     [--pcrs 7,…] [--quota-items 4096] [--quota-bytes 32M] [--owner-auth-file FILE]
                     [--credentials-socket PATH] [--journal-relay PATH] [--tpm-session auto|kept|per-operation]
      Under systemd socket activation (LISTEN_FDS, LISTEN_PID=this process) the sockets come from systemd
      and --socket is not needed; a passed socket bound to the --credentials-socket PATH serves systemd
      credentials (LoadCredential=ID:PATH, docs/credentials.md), the other the keychain API. A refused
      credential's reason also goes to --journal-relay's socket (keychain-journal-relay), for the unit's journal.
      Access groups are DIR/NAME.conf (lines: uid N, gid N, user NAME, group NAME); the group 'admin'
      may change the device besides root. Each uid's items (and each access group's)
      may hold at most --quota-items items and --quota-bytes bytes (K, M, G: KiB, MiB, GiB).
      --owner-auth-file (default: the systemd credential owner.auth, $CREDENTIALS_DIRECTORY/owner.auth,
      when there is one) is the owner authorization init wrote: enrolling the first finger needs it.
      --tpm-session kept keeps a salted session to the TPM between operations and saves the wrapping keys'
      contexts after the start, so that a first read skips a salted StartAuthSession and a Load (a chip's
      60 ms); per-operation starts one per read; auto (the default) keeps it when a salted StartAuthSession
      takes the TPM 20 ms or more, as on a chip and not on swtpm (docs/daemon.md, "The TPM connection").
    """

func fail(_ message: String, status: Int32 = 2) -> Never {
    writeAll(2, "keychaind: \(message)\n")
    exit(status)
}

/// The command line's flags by name; `--help` prints the usage and exits.
private func parseFlags() -> [String: String] {
    var flags: [String: String] = [:]
    var arguments = CommandLine.arguments.dropFirst()
    while let arg = arguments.popFirst() {
        if arg == "--help" || arg == "-h" { print(usage); exit(0) }
        guard ["--socket", "--store", "--tcti", "--groups", "--reader", "--max-connections", "--idle-timeout",
               "--stall-timeout", "--pcrs", "--quota-items", "--quota-bytes", "--owner-auth-file", "--credentials-socket", "--journal-relay",
               "--tpm-session"].contains(arg) else {
            fail("unknown argument \(arg)\n\(usage)")
        }
        guard let value = arguments.popFirst() else { fail("\(arg) needs a value") }
        flags[arg] = value
    }
    return flags
}

/// The keychain the flags and the environment name: the TPM, the reader, the PCRs, a token, the owner authorization.
private func keychainConfiguration(_ flags: [String: String], store: String,
                                   environment: [String: String]) -> KeychainConfiguration {
    let tpm: KeychainConfiguration.TPMSource = if let tcti = flags["--tcti"] ?? environment["KEYCHAIN_TCTI"] ?? environment["TPM2TCTI"] {
        .tcti(tcti)
    } else if FileManager.default.fileExists(atPath: "/dev/tpmrm0") {
        .tcti("device:/dev/tpmrm0")
    } else {
        .embedded
    }
    var configuration = KeychainConfiguration(storeDirectory: store, tpm: tpm)
    configuration.readerDirectory = switch flags["--reader"] {
    case "none": nil
    case let path?: path
    case nil: store + ".reader"
    }
    if let pcrs = flags["--pcrs"] {
        let indices = pcrs.split(separator: ",").compactMap { Int($0) }
        configuration.pcrSelection = indices
        do { try configuration.checkPCRSelection() } catch { fail("\(error)") }
    }
    configuration.pkcs11URI = environment["KEYCHAIN_PKCS11_URI"].flatMap { $0.isEmpty ? nil : $0 }
    // The owner authorization (for the reader's persistent key): a file only this user reads, or systemd's credential.
    let credential: String? = environment["CREDENTIALS_DIRECTORY"].map { $0 + "/owner.auth" }.flatMap { access($0, F_OK) == 0 ? $0 : nil }
    if let file: String = flags["--owner-auth-file"] ?? credential {
        do throws(KeychainError) { configuration.ownerAuthorization = try AuthorizationText.readFile(file) } catch { fail("\(error)") }
    }

    switch flags["--tpm-session"].map({ KeychainConfiguration.TPMSessionMode(rawValue: $0) }) {
    case .none: configuration.tpmSession = .auto
    case .some(.some(let mode)): configuration.tpmSession = mode
    case .some(.none): fail("--tpm-session is auto, kept or per-operation")
    }
    return configuration
}

/// The connection and quota limits the flags give.
private func daemonLimits(_ flags: [String: String]) -> DaemonServer.Limits {
    var limits = DaemonServer.Limits()
    if let value = flags["--max-connections"] {
        guard let number = Int(value), number > 0 else { fail("--max-connections needs a positive number") }
        limits.maxConnections = number
    }
    if let value = flags["--stall-timeout"] {
        guard let number = Int(value), number > 0 else { fail("--stall-timeout needs a positive number of seconds") }
        limits.stallTimeout = number
    }
    if let value = flags["--idle-timeout"] {
        guard let number = Int(value), number > 0 else { fail("--idle-timeout needs a positive number of seconds") }
        limits.idleTimeout = number
    }

    if let value = flags["--quota-items"] {
        guard let number = Int(value), number > 0 else { fail("--quota-items needs a positive number of items") }
        limits.user.quotaItems = number
    }
    if let value = flags["--quota-bytes"] {
        let units: [Character: Int] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30]
        let unit = value.last.flatMap { units[$0] }
        guard let number = Int(unit == nil ? value : String(value.dropLast())), number > 0,
              case let (bytes, overflow) = number.multipliedReportingOverflow(by: unit ?? 1), !overflow else {
            fail("--quota-bytes needs a positive number of bytes, optionally with K, M or G (KiB, MiB, GiB)")
        }
        limits.user.quotaBytes = bytes
    }
    return limits
}

// A thousand idle connections need a thousand descriptors: take the hard limit, then fit the
// connections to what it gives (one uid's quarter must never take every descriptor).
private func fitToDescriptors(_ limits: inout DaemonServer.Limits, explicit: Bool) {
    var files = rlimit()
    if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files) == 0 && files.rlim_cur < files.rlim_max {
        files.rlim_cur = files.rlim_max
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &files)
    }
    if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &files) == 0 && files.rlim_cur != rlim_t.max {  // RLIM_INFINITY
        do throws(KeychainError) {
            let descriptors = Int(clamping: files.rlim_cur)
            if let lowered = try limits.fit(descriptors: descriptors, explicit: explicit) {
                DaemonLog.say(lowered)
            }
        } catch {
            fail(error.message)
        }
    }
}

/// The API's listening socket and the credentials' (systemd's, else made at the flags' paths).
private func listeners(_ flags: [String: String], environment: [String: String]) -> (api: Int32, credentials: Int32?) {
    var listener: Int32?
    var credentialsListener: Int32?
    let credentialsPath = flags["--credentials-socket"]
    if let fds = environment["LISTEN_FDS"], let pid = environment["LISTEN_PID"], Int32(pid) == getpid() {
        // systemd socket activation (sd_listen_fds without libsystemd): the passed fds start at 3.
        guard let count = Int32(fds), (1...2).contains(count) else {
            fail("expected one or two sockets from systemd (LISTEN_FDS=\(fds))")
        }
        for fd in 3..<(3 + count) {
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            if let credentialsPath, boundPath(of: fd) == credentialsPath {
                credentialsListener = fd
            } else if listener == nil {
                listener = fd
            } else {
                fail("systemd passed two sockets and neither is bound to --credentials-socket \(credentialsPath ?? "(not given)")")
            }
        }
        unsetenv("LISTEN_FDS"); unsetenv("LISTEN_PID"); unsetenv("LISTEN_FDNAMES")
    } else if let path = flags["--socket"] {
        do { listener = try listenUnix(path: path) } catch { fail("\(error)", status: 3) }
    }
    guard let listener else { fail("--socket PATH is required without socket activation\n\(usage)") }
    if let credentialsPath, credentialsListener == nil {
        do { credentialsListener = try listenUnix(path: credentialsPath) } catch { fail("\(error)", status: 3) }
    }
    return (listener, credentialsListener)
}

/// keychaind's entry point: the arguments, the sockets (its own or systemd's), then serving until killed.
@MainActor public func keychaindMain() -> Never {
    let flags = parseFlags()
    guard let store = flags["--store"] else { fail("--store DIR is required\n\(usage)") }
    let environment = ProcessInfo.processInfo.environment
    let configuration = keychainConfiguration(flags, store: store, environment: environment)
    var limits = daemonLimits(flags)
    fitToDescriptors(&limits, explicit: flags["--max-connections"] != nil)
    signal(SIGPIPE, SIG_IGN)
    let (listener, credentialsListener) = listeners(flags, environment: environment)
    let server = DaemonServer(configuration: configuration, groups: AccessGroups(directory: flags["--groups"]), limits: limits)

    // SIGTERM and SIGINT keep their default action and end the daemon at once: every change is committed
    // (in keychain.db or its write-ahead log) before its reply, so nothing is lost, as with SIGKILL.
    // One line on stdout once the socket listens: a supervisor or a test waits for it, not for time.
    if let credentialsListener {
        let relay = flags["--journal-relay"].flatMap(JournalRelayClient.init(path:))
        let door = credentialsDoor(service: server.handler.service, stallTimeout: limits.stallTimeout, relay: relay)
        if let code = DetachedThread.start({ server.connections.serve(listener: credentialsListener, door: door) }) {
            fail("cannot start the credentials socket's thread (pthread_create: errno \(code))", status: 3)
        }
    }
    // Before "ready", so that a unit's credential asked for at boot finds it done (docs/credentials.md).
    if let said = waitFor({ () async -> String? in await server.prepareForFirstRequest() }) {
        DaemonLog.say(said)
    }
    writeAll(1, "keychaind: ready (store \(store))\n")
    // After "ready", on a chip: the wrapping keys' contexts, yielding to requests between two keys.
    Task.detached {
        if let said = await server.saveWrappingKeyContexts() { DaemonLog.say(said) }
    }
    server.serve(listener: listener)
}
