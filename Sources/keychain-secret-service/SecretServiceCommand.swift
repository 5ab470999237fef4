import Glibc
import Dispatch
import FoundationEssentials
import Keychain
import SecretService
import Synchronization
import KeychainCLIText

/// keychain-secret-service: the freedesktop Secret Service (org.freedesktop.secrets) on the caller's
/// session bus, its collections stored in the keychain (docs/secret-service.md).
let usage = """
    usage: keychain-secret-service [--store DIR [--tcti CONF] | --socket PATH] [--prompter scripted:FILE] [--max-applications N] [--replace | --import]
      --store DIR    the keychain store in this process (the embedded software TPM unless --tcti)
      --tcti CONF    the TPM for --store (device:/dev/tpmrm0, swtpm:host=…,port=…)
      --socket PATH  the user's items through keychaind at PATH
      --prompter scripted:FILE   answer Unlock's prompts from FILE, one answer a line, in order:
                     passcode:PIN, finger:NAME, cancel, fallback (tests and appliances);
                     a line delay:SECONDS makes the next answer come that much later.
                     Without it, the system's prompters: the desktop's (gcr), then the password agents
      --max-applications N   Flatpak apps and system units served at once, each by a provider of its
                     own (1 to 4096, default 64); a provider is let go when its app's last connection
                     leaves and it holds no session-collection item
      --replace      take org.freedesktop.secrets from the provider that owns it
      --import       copy every item of the provider that owns org.freedesktop.secrets (gnome-keyring)
                     into this keychain, its locked collections unlocked through its own prompt; then exit
    Without --store or --socket: the environment's keychain (KEYCHAIN_SOCKET, KEYCHAIN_STORE, KEYCHAIN_TCTI).

    """

func fail(_ message: String, code: Int32 = 1) -> Never {
    writeAll(2, "keychain-secret-service: \(message)\n")
    exit(code)
}

/// What the command line asks for.
private struct Options {
    var store: String?
    var tcti: String?
    var socket: String?
    var replace = false
    var importing = false
    var prompter: String?
    var maxApplications = ApplicationProviders.defaultMaxApplications
}

private func parseOptions() -> Options {
    var arguments = CommandLine.arguments.dropFirst()
    var options = Options()
    while let argument = arguments.popFirst() {
        func value() -> String {
            guard let next = arguments.popFirst(), !next.hasPrefix("--") else { fail("\(argument) needs a value\n\(usage)", code: 2) }
            return next
        }
        switch argument {
        case "--store": options.store = value()
        case "--tcti": options.tcti = value()
        case "--socket": options.socket = value()
        case "--replace": options.replace = true
        case "--import": options.importing = true
        case "--prompter": options.prompter = value()
        case "--max-applications":
            let given = value()
            guard let count = Int(given), (1...4096).contains(count) else {
                fail("--max-applications takes a number from 1 to 4096, not '\(given.prefix(64))'\n\(usage)", code: 2)
            }
            options.maxApplications = count
        case "--help", "-h":
            print(usage, terminator: "")
            exit(0)
        default: fail("unknown argument '\(argument)'\n\(usage)", code: 2)
        }
    }
    if options.socket != nil, options.store != nil || options.tcti != nil { fail("--socket and --store/--tcti are two different keychains: give one\n\(usage)", code: 2) }
    if options.tcti != nil, options.store == nil { fail("--tcti goes with --store\n\(usage)", code: 2) }
    if options.importing, options.replace { fail("--import copies from the provider that owns the name and exits: run it before --replace\n\(usage)", code: 2) }
    return options
}

/// Scripted answers, each after its delay (a person taking their time, for tests).
final class PacedAuthenticator: Authenticator {
    let answers: ScriptedAuthenticator
    let delays: Mutex<[Duration]>

    init(answers: ScriptedAuthenticator, delays: [Duration]) {
        self.answers = answers
        self.delays = Mutex(delays)
    }

    func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer {
        let delay = delays.withLock { $0.isEmpty ? .zero : $0.removeFirst() }
        if delay > .zero { try? await Task.sleep(for: delay) }
        return await answers.authenticate(request)
    }
    var attemptsPerRead: Int { answers.attemptsPerRead }
}

/// The answers of `--prompter scripted:FILE`; the file is read once, at start.
func scriptedAnswers(_ spec: String) -> PacedAuthenticator {
    guard spec.hasPrefix("scripted:") else { fail("--prompter takes scripted:FILE, got '\(spec)'", code: 2) }
    let path = String(spec.dropFirst("scripted:".count))
    guard let data = FileManager.default.contents(atPath: path) else { fail("--prompter: cannot read \(path)", code: 2) }
    var answers: [AuthenticationAnswer] = []
    var delays: [Duration] = []
    var delay = Duration.zero
    for line in data.split(separator: UInt8(ascii: "\n")) where !line.isEmpty {
        let text = line.starts(with: Array("passcode:".utf8)) ? "passcode:" : String(decoding: line, as: UTF8.self)
        switch text {
        case "passcode:": answers.append(.passcode(SecureBytes(copying: line.dropFirst("passcode:".utf8.count))))
        case let pause where pause.hasPrefix("delay:"):
            guard let seconds = Double(pause.dropFirst("delay:".count)), seconds >= 0, seconds <= 3600 else {
                fail("--prompter: \(path) has a delay that is not 0 to 3600 seconds", code: 2)
            }
            delay = .milliseconds(Int(seconds * 1000))
            continue
        case "cancel": answers.append(.cancel)
        case "fallback": answers.append(.fallback)
        case let finger where finger.hasPrefix("finger:"): answers.append(.finger(String(finger.dropFirst("finger:".count))))
        default: fail("--prompter: \(path) has a line that is not passcode:PIN, finger:NAME, cancel, fallback or delay:SECONDS", code: 2)
        }
        delays.append(delay)
        delay = .zero
    }
    return PacedAuthenticator(answers: ScriptedAuthenticator(answers), delays: delays)
}

/// The keychain the options name, and how to say where it is.
private func keychainConfiguration(_ options: Options) -> (KeychainConfiguration, String) {
    let authenticator = options.prompter.map(scriptedAnswers)
    var configuration: KeychainConfiguration
    let where_: String
    if let socket = options.socket {
        configuration = .daemon(socket: socket)
        where_ = "keychaind at \(socket)"
    } else if let store = options.store {
        configuration = KeychainConfiguration(storeDirectory: store, tpm: options.tcti.map { .tcti($0) } ?? .embedded,
                                              authenticator: SystemAuthenticator())
        where_ = "store \(configuration.storeDirectory)"
    } else {
        configuration = .default
        where_ = configuration.daemonSocket.map { "keychaind at \($0)" } ?? "store \(configuration.storeDirectory)"
    }
    if let authenticator { configuration.authenticator = authenticator }
    return (configuration, where_)
}

/// `--import`: every item of the provider that owns the name, copied into this keychain; then exit.
@MainActor private func importAndExit(_ provider: SecretServiceProvider, from bus: Bus, where where_: String) -> Never {
    var refusal: String?
    do throws(DBusError) {
        let report = try provider.importItems(from: bus)
        print("keychain-secret-service: imported \(report.imported) items of \(report.collections) collections (\(where_)); "
              + "\(report.alreadyHere) were here already")
        if !report.leftLocked.isEmpty {
            refusal = "left locked, nothing of them imported (their prompt was dismissed): \(report.leftLocked.joined(separator: ", "))"
        }
    } catch {
        refusal = "import: \(error.message)"
    }
    // What was written stays whole: the stores are closed (their WAL checkpointed) before the exit, either way.
    waitFor { await KeychainDevice.closeStores() }
    if let refusal { fail(refusal, code: 3) }
    exit(0)
}

/// Takes org.freedesktop.secrets (from its owner with `replace`), or exits saying who holds it.
@MainActor private func claimName(_ bus: Bus, replace: Bool, where where_: String) {
    do throws(DBusError) {
        switch try bus.request(name: SecretServiceProvider.busName, replace: replace) {
        case .owned: break
        case .ownedBy(let owner) where replace:
            // D-Bus replaces an owner only if it asked for the name with ALLOW_REPLACEMENT (we do; gnome-keyring does not).
            fail("\(SecretServiceProvider.busName) is owned by \(owner), which does not allow another provider to replace it: "
                 + "stop it first (gnome-keyring: `keychainctl secret-service enable`, then log out and in)", code: 3)
        case .ownedBy(let owner):
            fail("\(SecretServiceProvider.busName) is owned by \(owner); stop it or pass --replace", code: 3)
        }
    } catch {
        fail(error.message)
    }
    writeAll(1, "keychain-secret-service: owns \(SecretServiceProvider.busName) (\(where_))\n")
}

/// Serves the bus until SIGTERM or SIGINT (or another provider takes the name); then exit.
@MainActor private func serve(_ bus: Bus, _ providers: ApplicationProviders, _ portal: PortalSecretBackend) -> Never {
    // SIGTERM and SIGINT end the loop, so the store is closed (its WAL checkpointed) on the way out.
    var stops: [DispatchSourceSignal] = []
    for number in [SIGTERM, SIGINT] {
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        // Sendable, so not the main actor's: the handler runs on a global queue while the main thread serves the bus
        // (a main-actor closure there failed its isolation check and the provider died of SIGILL at SIGTERM).
        source.setEventHandler { @Sendable [bus] in bus.stop() }
        source.resume()
        stops.append(source)
    }

    var lostName = false
    do throws(DBusError) {
        try bus.serve(handler: { PortalSecretBackend.owns($0) ? portal.handle($0) : providers.handle($0) },
                      vanished: { providers.clientVanished($0) }, lost: { lostName = true })
    } catch {
        fail(error.message)
    }
    waitFor { await KeychainDevice.closeStores() }
    if lostName { writeAll(2, "keychain-secret-service: another provider took \(SecretServiceProvider.busName)\n") }
    exit(0)
}

/// The Flatpak Secret portal's backend, under its own name too when no other process owns that
/// (it always answers under org.freedesktop.secrets, which gnome-keyring's `.portal` file names).
@MainActor private func portalBackend(_ bus: Bus, _ configuration: KeychainConfiguration) -> PortalSecretBackend {
    let portal: PortalSecretBackend
    do throws(DBusError) {
        portal = try PortalSecretBackend(configuration: configuration, credentials: { sender in
            guard let peer = try? bus.credentials(of: sender) else { return nil }
            return PortalSecretBackend.Credentials(pid: peer.pid, uid: peer.uid, pidfd: peer.pidfd)
        })
        if case .ownedBy(let owner) = try bus.request(name: PortalSecretBackend.busName, replace: false) {
            writeAll(2, "keychain-secret-service: \(PortalSecretBackend.busName) is owned by \(owner); "
                     + "the Secret portal backend answers under \(SecretServiceProvider.busName) only\n")
        }
    } catch {
        fail(error.message)
    }
    portal.post = { bus.post($0) }
    return portal
}

/// keychain-secret-service's entry point: the arguments, the bus name, then serving until SIGTERM or SIGINT.
@MainActor public func secretServiceMain() -> Never {
    let options = parseOptions()
    let (configuration, where_) = keychainConfiguration(options)
    signal(SIGPIPE, SIG_IGN)
    let bus: Bus
    let providers: ApplicationProviders
    do throws(DBusError) {
        bus = try Bus()
        providers = try ApplicationProviders(configuration: configuration, bus: bus, maxApplications: options.maxApplications)
    } catch {
        fail(error.message)
    }
    providers.post = { bus.post($0) }
    if options.importing { importAndExit(providers.host, from: bus, where: where_) }
    claimName(bus, replace: options.replace, where: where_)
    serve(bus, providers, portalBackend(bus, configuration))
}
