import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import SecureMemory
import Testing

/// The system's prompts (issue 21 item 1), answered by the real agents: systemd's ask-password
/// protocol by `systemd-tty-ask-password-agent` on a pty, the terminal by a person typing into
/// `script(1)`'s pty; and what a process that can reach no one gets.
@Suite("The system's prompts, answered by the real agents", .offThePool)
struct SystemPromptTests {
    static let pin = "2468"

    /// A directory for the agents' files, readable by the agents (root) and no one else's to write; the
    /// test removes it.
    static func agentsDirectory() throws -> String {
        let path = NSTemporaryDirectory() + "ask-password-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o755])
        return path
    }

    /// The first `ask.*` file that appears in `directory` (within 20 s).
    static func askFile(in directory: String) async throws -> String {
        for _ in 0..<1200 {  // up to two minutes: the full suite's load delays the asking thread
            if let name = try FileManager.default.contentsOfDirectory(atPath: directory).first(where: { $0.hasPrefix("ask.") }) {
                return directory + "/" + name
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw SoftwareTPMError("no ask file appeared in \(directory)")
    }

    /// `systemd-tty-ask-password-agent --query` on a pty of its own (script), in a mount namespace
    /// where `directory` is /run/systemd/ask-password (the agent reads only that one), typing `typed`.
    static func agentQuery(_ directory: String, typed: String) async throws -> (status: Int32, stdout: [UInt8], stderr: String) {
        try run("/usr/bin/unshare", ["-m", "--propagation", "private", "/bin/sh", "-c",
                                     "mount --bind \"$1\" /run/systemd/ask-password && exec /usr/bin/script -qec "
                                     + "'/usr/bin/systemd-tty-ask-password-agent --query' /dev/null", "sh", directory],
            input: Array(typed.utf8))
    }

    /// Runs a program on script(1)'s pty and types `typed` only once it has shown `prompt`, as a person
    /// would: what the pty shows after the prompt is then what the program let the terminal echo.
    static func typing(_ typed: String, after prompt: String, _ command: String,
                       environment: [String: String] = [:]) throws -> (status: Int32, shown: String) {
        try runChild("/usr/bin/script", ["-qfec", command, "/dev/null"], typing: Array(typed.utf8), after: prompt,
                     environment: environment, deadline: childDeadlineSeconds)
    }

    func device() async throws -> SimulatedDevice {
        try await SimulatedDevice(passcode: bytes(Self.pin), fingers: ["thumb"])
    }

    @Test func aPasswordAgentAnswersAReadBehindThePasscode() async throws {
        let d = try await device()
        let agents = try Self.agentsDirectory()
        defer { try? FileManager.default.removeItem(atPath: agents) }
        var configuration = d.configuration
        configuration.authenticator = AskPasswordAuthenticator(directory: agents, timeout: .seconds(300))
        let store = try createKeychain(.init(service: "agents", accessControl: .passcode,
                                             prompt: .init(title: "Unlock the test vault", cancel: "Use password")),
                                       configuration: configuration)
        try await store.setItem("k", "v")
        async let read = store.getItem("k")
        let ask = try await Self.askFile(in: agents)
        let file = try String(contentsOfFile: ask, encoding: .utf8)
        #expect(file.contains("Message=Unlock the test vault") && file.contains("Passcode (empty: Use password)"), "\(file)")
        #expect(file.contains("Echo=0") && file.contains("PID=\(getpid())") && file.contains("NotAfter="), "\(file)")
        // The agent shows the question on its pty; how it echoes is the agent's (Echo=0 asks it to hide).
        let agent = try await Self.agentQuery(agents, typed: Self.pin + "\n")
        #expect(agent.status == 0, "\(agent.stderr)")
        #expect(String(decoding: agent.stdout, as: UTF8.self).contains("Unlock the test vault"))
        #expect(try await read == "v")
        #expect(try FileManager.default.contentsOfDirectory(atPath: agents).isEmpty, "the ask file or socket was left behind")
        #expect(d.answers.requests.isEmpty)
    }

    @Test func aPasswordAgentAnswersAFingerThenThePasscodeOfABiometricOrPasscodeItem() async throws {
        let d = try await device()
        let agents = try Self.agentsDirectory()
        defer { try? FileManager.default.removeItem(atPath: agents) }
        var configuration = d.configuration
        configuration.authenticator = AskPasswordAuthenticator(directory: agents, timeout: .seconds(300))
        let store = try createKeychain(.init(service: "agents.bio", accessControl: .biometryAnyOrPasscode), configuration: configuration)
        try await store.setItem("k", "v")
        async let read = store.getItem("k")
        // The finger first, shown as typed (Echo=1): the simulated reader's touch.
        let finger = try String(contentsOfFile: try await Self.askFile(in: agents), encoding: .utf8)
        #expect(finger.contains("Echo=1") && finger.contains("Finger to touch the reader (empty: use the passcode)"), "\(finger)")
        #expect(try await Self.agentQuery(agents, typed: "thumb\n").status == 0)
        #expect(try await read == "v")

        // Empty for the finger: then the passcode, hidden.
        async let second = store.getItem("k")
        _ = try await Self.askFile(in: agents)
        #expect(try await Self.agentQuery(agents, typed: "\n").status == 0)
        let passcode = try String(contentsOfFile: try await Self.askFile(in: agents), encoding: .utf8)
        #expect(passcode.contains("Echo=0") && passcode.contains("Passcode"), "\(passcode)")
        #expect(try await Self.agentQuery(agents, typed: Self.pin + "\n").status == 0)
        #expect(try await second == "v")
    }

    /// An answer is taken only from root or this process's user (SCM_CREDENTIALS): another user who
    /// can reach the socket cannot answer for the owner. nobody sends the right passcode, then root
    /// cancels on the same socket: datagrams arrive in order, so the read ends USER_CANCELED only if
    /// nobody's answer was read and ignored (taken, it would have opened the item first). No clock
    /// in the test: the question waits as long as the suite's load needs.
    @Test func anAnswerFromAnotherUserIsIgnored() async throws {
        let d = try await device()
        let agents = try Self.agentsDirectory()
        defer { try? FileManager.default.removeItem(atPath: agents) }
        var configuration = d.configuration
        configuration.authenticator = AskPasswordAuthenticator(directory: agents, timeout: .seconds(600))
        let store = try createKeychain(.init(service: "agents.other", accessControl: .passcode), configuration: configuration)
        try await store.setItem("k", "v")
        async let read = code { try await store.getItem("k") }
        let file = try String(contentsOfFile: try await Self.askFile(in: agents), encoding: .utf8)
        let socket = String(try #require(file.split(separator: "\n").first { $0.hasPrefix("Socket=") }).dropFirst("Socket=".count))
        #expect(chmod(socket, 0o777) == 0)
        let send = "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); s.sendto(sys.stdin.buffer.read(), sys.argv[1])"
        let sent = try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", send, socket],
                           input: Array(("+" + Self.pin).utf8))
        #expect(sent.status == 0, "\(sent.stderr)")
        let canceled = try run("/usr/bin/python3", ["-c", send, socket], input: Array("-".utf8))
        #expect(canceled.status == 0, "\(canceled.stderr)")
        let ended = await read
        #expect(ended == .userCanceled, "nobody's answer opened the item: \(String(describing: ended))")
    }

    /// Nobody answers: the question ends at its timeout (`SYSTEM_CANCELED`), or at once when the
    /// reading task is canceled, and leaves nothing in the agents' directory.
    @Test func anUnansweredQuestionEndsAtItsTimeoutOrCancellationAndLeavesNothing() async throws {
        let d = try await device()
        let agents = try Self.agentsDirectory()
        defer { try? FileManager.default.removeItem(atPath: agents) }
        var configuration = d.configuration
        configuration.authenticator = AskPasswordAuthenticator(directory: agents, timeout: .seconds(2))
        let store = try createKeychain(.init(service: "agents.quiet", accessControl: .passcode), configuration: configuration)
        try await store.setItem("k", "v")
        // Ended by its own timeout (the suite's watchdog catches a question that never ends); how long
        // that took is not asserted: on a loaded machine the read's thread may resume much later.
        #expect(await code { try await store.getItem("k") } == .systemCanceled)
        #expect(try FileManager.default.contentsOfDirectory(atPath: agents).isEmpty)

        configuration.authenticator = AskPasswordAuthenticator(directory: agents, timeout: .seconds(600))
        let patient = try createKeychain(.init(service: "agents.quiet", accessControl: .passcode), configuration: configuration)
        let reading = Task { await code { try await patient.getItem("k") } }
        _ = try await Self.askFile(in: agents)
        reading.cancel()
        #expect(await reading.value == .systemCanceled)
        #expect(try FileManager.default.contentsOfDirectory(atPath: agents).isEmpty)
    }

    /// No terminal, no agent, no desktop: the read ends at once with INTERACTION_NOT_ALLOWED naming
    /// why, asks nothing, and `canUseAccessControl` says so before the app offers the switch.
    @Test func whenNoPromptReachesAnyoneAReadIsInteractionNotAllowedAndCanUseSaysNoPrompt() async throws {
        let d = try await device()
        var configuration = d.configuration
        configuration.authenticator = SystemAuthenticator(prompters: [TerminalAuthenticator(path: "/nonexistent/tty"),
                                                                      AskPasswordAuthenticator(directory: "/nonexistent/agents")])
        let store = try createKeychain(.init(service: "nobody", accessControl: .biometryAnyOrPasscode), configuration: configuration)
        try await store.setItem("k", "v")
        do {
            _ = try await store.getItem("k")
            Issue.record("the read gave a value without asking anyone")
        } catch {
            #expect(error.code == .interactionNotAllowed)
            #expect(error.message.contains("/nonexistent/tty") && error.message.contains("/nonexistent/agents"), "\(error.message)")
        }
        #expect(try await store.canUseAccessControl(.biometryAnyOrPasscode) == AccessControlCheck(available: false, reason: .noPrompt))
        #expect(try await KeychainDevice(configuration: configuration).canUseAccessControl(.passcode).reason == .noPrompt)
        #expect(try await store.canUseAccessControl(.none).available, "an item without access control needs no prompt")
        #expect(try await store.hasItem("k"))
    }

    @Test func theDefaultConfigurationsShowTheSystemsPrompt() {
        #expect(KeychainConfiguration.direct.authenticator is SystemAuthenticator)
        #expect(KeychainConfiguration.daemon(socket: "/run/keychain/keychaind.sock").authenticator is SystemAuthenticator)
        // Root's agents are expected only where systemd runs them; the user's where the directory exists.
        let runtime = try? SystemPromptTests.agentsDirectory()
        if let runtime {
            defer { try? FileManager.default.removeItem(atPath: runtime) }
            try? FileManager.default.createDirectory(atPath: runtime + "/systemd/ask-password", withIntermediateDirectories: true)
            #expect(AskPasswordAuthenticator.systemDirectory(environment: ["XDG_RUNTIME_DIR": runtime], isRoot: false)
                    == runtime + "/systemd/ask-password")
        }
        #expect(AskPasswordAuthenticator.systemDirectory(environment: [:], isRoot: false) == nil)
    }

    /// The terminal: keychainctl-full on script(1)'s pty asks there, reads the passcode without echo.
    @Test func theTerminalAsksForThePasscodeWithoutEcho() async throws {
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), fingers: ["thumb"], throughDaemon: true)
        let store = try createKeychain(.init(service: "tty", accessControl: .passcode, prompt: .init(title: "Unlock on the terminal")),
                                       configuration: d.configuration)
        try await store.setItem("k", "v")
        let full = buildDirectory.appendingPathComponent("keychainctl-full").path
        let asked = try Self.typing(Self.pin + "\n", after: "Passcode (enter alone: Cancel): ", "'\(full)' get tty k",
                                    environment: d.environment)
        let shown = asked.shown
        #expect(asked.status == 0 && shown.contains("Authenticate to read 'k'") && shown.hasSuffix("v"), "\(shown)")
        #expect(!shown.contains(Self.pin), "the terminal echoed the passcode: \(shown)")
    }
}

/// gcr's system prompter on a desktop of the test's own: Xvfb, a private session bus whose only
/// activatable service is `/usr/libexec/gcr-prompter`, and a person typing into its dialog (xdotool).
@Suite("gcr's system prompter under Xvfb, answered by typing into its dialog", .offThePool)
struct SystemPrompterTests {
    static let pin = "2468"

    /// A display of the test's own (`TestDisplay`: Xvfb on a display it picks, xdotool at its
    /// keyboard) and a private dbus-daemon that activates gcr-prompter on it.
    final class Desktop: @unchecked Sendable {
        let screen: TestDisplay
        let directory: String
        let address: String
        private let bus: pid_t

        init() async throws {
            screen = try TestDisplay()
            directory = NSTemporaryDirectory() + "desktop-" + UUID().uuidString
            try FileManager.default.createDirectory(atPath: directory + "/services", withIntermediateDirectories: true)
            address = "unix:path=\(directory)/bus"
            try privateSessionBusConfiguration(listen: address, serviceDirectory: directory + "/services")
                .write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
            try TestDisplay.writePrompterService(into: directory + "/services")
            let environment = ProcessInfo.processInfo.environment.merging(screen.prompterEnvironment) { $1 }
            guard let bus = Processes.spawn("/usr/bin/dbus-daemon", ["/usr/bin/dbus-daemon", "--config-file=\(directory)/bus.conf", "--nofork", "--nopidfile"],
                                            environment: environment) else { throw SoftwareTPMError("cannot start dbus-daemon") }
            self.bus = bus
            for _ in 0..<500 where !FileManager.default.fileExists(atPath: directory + "/bus") { try await Task.sleep(for: .milliseconds(10)) }
        }

        deinit {
            // gcr-prompter, activated by the bus, leaves with it; the display stops after.
            kill(bus, SIGTERM)
            _ = Processes.wait(bus)
            try? FileManager.default.removeItem(atPath: directory)
        }

        /// The prompter's environment as an app on this desktop has it.
        var environment: [String: String] { ["DISPLAY": screen.display, "DBUS_SESSION_BUS_ADDRESS": address] }

        /// Types `text` and Return into the dialog titled `title` once it shows, as a person would.
        func type(_ text: String, into title: String) async throws -> ChildResult {
            try screen.type(text, into: title)
        }

        func press(_ key: String, into title: String) async throws -> ChildResult {
            try screen.press(key, into: title)
        }
    }

    @Test func theDesktopPrompterReadsThePasscodeThroughItsSecretExchange() async throws {
        let desktop = try await Desktop()
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), fingers: ["thumb"])
        var configuration = d.configuration
        let prompter = SystemPrompterAuthenticator(timeout: .seconds(300), environment: desktop.environment)
        #expect(await prompter.reachability() == .reachable)
        configuration.authenticator = prompter
        let store = try createKeychain(.init(service: "desktop", accessControl: .passcode,
                                             prompt: .init(title: "Unlock the desktop vault", cancel: "Use password")),
                                       configuration: configuration)
        try await store.setItem("k", "v")
        async let read = store.getItem("k")
        let typed = try await desktop.type(Self.pin, into: "Unlock the desktop vault")
        #expect(typed.status == 0, "\(typed.stderr)")
        #expect(try await read == "v")

        // The dialog's cancel (Escape): the seed's USER_CANCELED, the item untouched.
        async let canceled = code { try await store.getItem("k") }
        #expect(try await desktop.press("Escape", into: "Unlock the desktop vault").status == 0)
        #expect(await canceled == .userCanceled)
        #expect(try await store.hasItem("k"))
    }

    @Test func withoutADisplayOrABusTheDesktopPrompterReachesNoOne() async {
        #expect(await SystemPrompterAuthenticator(environment: [:]).reachability() != .reachable)
        #expect(await SystemPrompterAuthenticator(environment: ["DISPLAY": ":99", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent/bus"])
            .reachability() != .reachable)
    }
}

/// gcr's prompter protocol attacked on a private session bus (no display needed): the prompter is a
/// program of the test's own that owns `org.gnome.keyring.SystemPrompter` and speaks gcr's
/// `org.gnome.keyring.internal.Prompter` with the real secret exchange (python3's `cryptography`),
/// answering honestly (the control), with the passcode in clear, or not at all while a second client
/// of the bus answers for it with everything the prompter knows.
@Suite("gcr's system prompter protocol, attacked", .offThePool)
struct SystemPrompterAttackTests {
    static let pin = "2468"

    /// A private dbus-daemon, and the prompter of the test's own on it in `mode`.
    final class Bus: @unchecked Sendable {
        let directory: String
        let address: String
        var state: String { directory + "/prompter.json" }
        var script: String { directory + "/prompter.py" }
        private var pids: [pid_t] = []

        init(prompter mode: String) async throws {
            try #require(FileManager.default.isExecutableFile(atPath: "/usr/bin/dbus-daemon"), "scripts/setup-debian.sh installs dbus")
            directory = NSTemporaryDirectory() + "prompter-bus-" + UUID().uuidString
            try FileManager.default.createDirectory(atPath: directory + "/services", withIntermediateDirectories: true)
            address = "unix:path=\(directory)/bus"
            try privateSessionBusConfiguration(listen: address, serviceDirectory: directory + "/services")
                .write(toFile: directory + "/bus.conf", atomically: true, encoding: .utf8)
            guard let bus = Processes.spawn("/usr/bin/dbus-daemon", ["/usr/bin/dbus-daemon", "--config-file=\(directory)/bus.conf",
                                                                      "--nofork", "--nopidfile"]) else {
                throw SoftwareTPMError("cannot start dbus-daemon")
            }
            pids.append(bus)
            for _ in 0..<500 where !FileManager.default.fileExists(atPath: directory + "/bus") { try await Task.sleep(for: .milliseconds(10)) }
            try Self.prompterScript.write(toFile: script, atomically: true, encoding: .utf8)
            guard let prompter = Processes.spawn("/usr/bin/python3", ["/usr/bin/python3", script, mode, address, state, pin]) else {
                throw SoftwareTPMError("cannot start the test's prompter")
            }
            pids.append(prompter)
            for _ in 0..<2000 where !FileManager.default.fileExists(atPath: state + ".ready") { try await Task.sleep(for: .milliseconds(10)) }
            try #require(FileManager.default.fileExists(atPath: state + ".ready"), "the test's prompter did not take the name")
        }

        deinit {
            for pid in pids.reversed() { kill(pid, SIGTERM); _ = Processes.wait(pid) }
            try? FileManager.default.removeItem(atPath: directory)
        }

        /// The prompter leaves the bus (its process ends); the bus stays.
        func stopPrompter() {
            guard pids.count > 1 else { return }
            let prompter = pids.removeLast()
            kill(prompter, SIGTERM)
            _ = Processes.wait(prompter)
        }

        /// How many connections process `pid` has on this bus (its unique names), as the bus counts them.
        func connections(of pid: pid_t) async throws -> Int {
            let count = "import dbus, sys; b = dbus.bus.BusConnection(sys.argv[1]); d = dbus.Interface(b.get_object('org.freedesktop.DBus', "
                + "'/org/freedesktop/DBus'), 'org.freedesktop.DBus'); print(sum(1 for n in d.ListNames() if n.startswith(':') "
                + "and int(d.GetConnectionUnixProcessID(n)) == int(sys.argv[2])))"
            let result = try run("/usr/bin/python3", ["-c", count, address, "\(pid)"])
            return try #require(Int(String(decoding: result.stdout, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)),
                                "\(result.stderr)")
        }

        /// A storage behind the passcode whose reads ask the prompter on this bus.
        func storage(on d: SimulatedDevice) throws -> Keychain {
            var configuration = d.configuration
            configuration.authenticator = SystemPrompterAuthenticator(timeout: .seconds(120),
                                                                      environment: ["DISPLAY": ":0", "DBUS_SESSION_BUS_ADDRESS": address])
            return try createKeychain(.init(service: "desktop", accessControl: .passcode), configuration: configuration)
        }

        /// The prompter's script (python3 with dbus, gi and cryptography, as Debian ships them).
        static let prompterScript = #"""
import base64, json, os, sys, time
import dbus, dbus.service, dbus.mainloop.glib
from gi.repository import GLib
from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

P = int("FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA237327FFFFFFFFFFFFFFFF", 16)
CALLBACK = "org.gnome.keyring.internal.Prompter.Callback"

def fields(text):
    out, group = {}, False
    for line in text.split("\n"):
        if line.startswith("["): group = line == "[sx-aes-1]"; continue
        if group and "=" in line: k, v = line.split("=", 1); out[k] = v
    return out

def key_for(private, peer_public):
    shared = pow(int.from_bytes(peer_public, "big"), private, P).to_bytes(192, "big")
    return HKDF(algorithm=hashes.SHA256(), length=16, salt=None, info=b"").derive(shared)

def encrypted(key, secret):
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    data = padder.update(secret) + padder.finalize()
    enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return iv, enc.update(data) + enc.finalize()

def answer(bus, caller, callback, reply, exchange):
    bus.get_object(caller, callback, introspect=False).PromptReady(
        reply, dbus.Dictionary({}, signature="sv"), exchange, dbus_interface=CALLBACK,
        reply_handler=lambda *a: None, error_handler=lambda e: print("answer refused:", e, flush=True))

class Prompter(dbus.service.Object):
    """gcr's org.gnome.keyring.internal.Prompter, answering as `mode` says."""
    def __init__(self, bus, mode, state, passcode):
        super().__init__(bus, "/org/gnome/keyring/Prompter")
        self.bus, self.mode, self.state, self.passcode = bus, mode, state, passcode
        self.private = int.from_bytes(os.urandom(32), "big")
        self.public = pow(2, self.private, P).to_bytes(192, "big")

    @dbus.service.method("org.gnome.keyring.internal.Prompter", in_signature="o", sender_keyword="caller")
    def BeginPrompting(self, callback, caller):
        ex = "[sx-aes-1]\npublic=%s\n" % base64.b64encode(self.public).decode()
        GLib.idle_add(lambda: answer(self.bus, caller, callback, "", ex) and False)

    @dbus.service.method("org.gnome.keyring.internal.Prompter", in_signature="osa{sv}s", sender_keyword="caller")
    def PerformPrompt(self, callback, kind, properties, exchange, caller):
        key = key_for(self.private, base64.b64decode(fields(exchange)["public"]))
        with open(self.state + ".tmp", "w") as f:
            json.dump({"caller": caller, "callback": callback, "key": key.hex(), "title": str(properties.get("title", ""))}, f)
        os.rename(self.state + ".tmp", self.state)
        pub = base64.b64encode(self.public).decode()
        if self.mode == "honest":
            iv, secret = encrypted(key, self.passcode)
            ex = "[sx-aes-1]\npublic=%s\nsecret=%s\niv=%s\n" % (pub, base64.b64encode(secret).decode(), base64.b64encode(iv).decode())
            GLib.idle_add(lambda: answer(self.bus, caller, callback, "yes", ex) and False)
        elif self.mode == "plaintext":
            ex = "[sx-aes-1]\npublic=%s\nsecret=%s\niv=%s\n" % (pub, base64.b64encode(self.passcode).decode(),
                                                               base64.b64encode(os.urandom(16)).decode())
            GLib.idle_add(lambda: answer(self.bus, caller, callback, "yes", ex) and False)
        elif self.mode == "cancel-after-attack":
            def later():
                if not os.path.exists(self.state + ".attacked"): return True
                answer(self.bus, caller, callback, "no", "[sx-aes-1]\n")
                return False
            GLib.timeout_add(50, later)

    @dbus.service.method("org.gnome.keyring.internal.Prompter", in_signature="o")
    def StopPrompting(self, callback):
        pass

def attack(bus, state, passcode):
    """Another client of the same session bus answers the prompt, knowing everything the prompter knows."""
    s = json.load(open(state))
    iv, secret = encrypted(bytes.fromhex(s["key"]), passcode)
    ex = "[sx-aes-1]\nsecret=%s\niv=%s\n" % (base64.b64encode(secret).decode(), base64.b64encode(iv).decode())
    try:
        bus.get_object(s["caller"], s["callback"], introspect=False).PromptReady(
            "yes", dbus.Dictionary({}, signature="sv"), ex, dbus_interface=CALLBACK)
    except dbus.DBusException as e:
        print(e.get_dbus_name(), flush=True)
        sys.exit(3 if e.get_dbus_name() == "org.freedesktop.DBus.Error.AccessDenied" else 4)
    print("accepted", flush=True)

if __name__ == "__main__":
    role, address, state, passcode = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].encode()
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(address)
    if role == "attacker":
        attack(bus, state, passcode)
    else:
        name = dbus.service.BusName("org.gnome.keyring.SystemPrompter", bus)
        prompter = Prompter(bus, role, state, passcode)
        open(state + ".ready", "w").close()
        GLib.MainLoop().run()
"""#
    }

    /// The control: the test's prompter does the exchange as gcr does, and its answer opens the item,
    /// so the refusals below are of the attack, not of a prompter that cannot talk.
    /// The reachability check (before each protected read's prompt, and in `canUseAccessControl`)
    /// keeps its bus connection from one check to the next, where each check made one of its own;
    /// a prompter that went away is still noticed at the next check.
    @Test func theReachabilityCheckKeepsItsConnectionAndNoticesAPrompterThatWentAway() async throws {
        let bus = try await Bus(prompter: "honest")
        let prompter = SystemPrompterAuthenticator(environment: ["DISPLAY": ":0", "DBUS_SESSION_BUS_ADDRESS": bus.address])
        for _ in 0..<20 { #expect(await prompter.reachability() == .reachable) }
        #expect(try await bus.connections(of: getpid()) == 1, "the checks' connection is kept, and only one")
        bus.stopPrompter()
        #expect(await prompter.reachability() != .reachable, "the prompter that went away is noticed")
        #expect(try await bus.connections(of: getpid()) == 1)
    }

    @Test func theTestsPrompterAnsweringAsGcrDoesOpensTheItem() async throws {
        let bus = try await Bus(prompter: "honest")
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), fingers: [])
        let store = try bus.storage(on: d)
        try await store.setItem("k", "v")
        #expect(try await store.getItem("k") == "v")
    }

    /// A prompter whose reply is not encrypted to this read's key (the passcode in clear, as a
    /// prompter without the exchange, or a bus that was read, would send it) is refused: nothing is
    /// tried with it, the item stays.
    @Test func aReplyNotEncryptedToOurKeyIsRefused() async throws {
        let bus = try await Bus(prompter: "plaintext")
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), fingers: [])
        let store = try bus.storage(on: d)
        try await store.setItem("k", "v")
        do {
            let value = try await store.getItem("k")
            Issue.record("a reply in clear opened the item: \(value ?? "nil")")
        } catch {
            #expect(error.code == .interactionNotAllowed)
            #expect(error.message.contains("does not decrypt"), "\(error.message)")
        }
        #expect(try await store.hasItem("k"))
    }

    /// Another client of the session bus answers the prompt first, knowing the callback's path, our
    /// name and the exchange's key (everything the prompter knows): the callback refuses it
    /// (AccessDenied, the sender is not the name's owner), and the user's own answer, the dialog's
    /// cancel, is what the read gets.
    @Test func anAnswerFromAnotherClientOfTheBusIsRefused() async throws {
        let bus = try await Bus(prompter: "cancel-after-attack")
        let d = try await SimulatedDevice(passcode: bytes(Self.pin), fingers: [])
        let store = try bus.storage(on: d)
        try await store.setItem("k", "v")
        let read = Task { await code { try await store.getItem("k") } }
        for _ in 0..<2400 where !FileManager.default.fileExists(atPath: bus.state) { try await Task.sleep(for: .milliseconds(50)) }
        let attack = try run("/usr/bin/python3", [bus.script, "attacker", bus.address, bus.state, Self.pin])
        #expect(attack.status == 3, "the attacker's answer was not refused: \(String(decoding: attack.stdout, as: UTF8.self)) \(attack.stderr)")
        #expect(FileManager.default.createFile(atPath: bus.state + ".attacked", contents: nil))
        #expect(await read.value == .userCanceled, "the read took the attacker's answer")
        #expect(try await store.hasItem("k"))
    }
}
