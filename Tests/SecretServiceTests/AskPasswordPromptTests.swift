import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// The provider's Prompt on a headless device (issue 19 item 4): no desktop, no terminal, so the
/// library's `SystemAuthenticator` (the provider's default) asks through systemd's ask-password
/// protocol in `$XDG_RUNTIME_DIR/systemd/ask-password`, and a real agent
/// (`systemd-tty-ask-password-agent --query` on a pty of `script`'s) answers for the person. The
/// client is secretstorage waiting for `Completed`; everything on the bus is captured (dbus-monitor).
@Suite(.serialized, .offThePool) struct AskPasswordPromptTests {
    /// The device passcode, and the secrets: long enough that finding them in the capture is no chance.
    static let passcode = "heron-5173-lantern"
    static let secret = "agent-secret-93b0e1d4f7"
    static let probe = "plain-probe-6a2f08c1d5"

    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        try PrivateBus.require("/usr/bin/dbus-monitor", "dbus-bin")
        try PrivateBus.require("/usr/bin/systemd-tty-ask-password-agent", "systemd")
        try PrivateBus.require("/usr/bin/script", "bsdutils")
    }

    /// The client: a passcode collection with one item, then three Unlocks: the agent's right answer
    /// opens it (the secret read through a DH session), a wrong answer and then an empty one (the
    /// prompt's Cancel) leave it locked, and a Dismiss while the agent's question is asked ends the
    /// question and leaves it locked. argv: the agents' directory, the plain session's probe.
    static let script = RawCallTests.prelude + PromptWindowTests.vaultCollection + """
        import secretstorage, time
        from jeepney import MatchRule, message_bus
        from jeepney.io.blocking import Proxy
        PROMPT = 'org.freedesktop.Secret.Prompt'
        AGENTS = sys.argv[1]
        def asks():
            return [name for name in os.listdir(AGENTS) if name.startswith('ask.')]
        client = secretstorage.dbus_init()
        vault = secretstorage.Collection(client, path)
        assert vault.unlock() is False  # nothing stored yet: opened without a question
        vault.create_item('v', {'vault': '1'}, sys.stdin.buffer.read())
        [item] = vault.search_items({'vault': '1'})
        lock()
        # 1. The agent answers the passcode: Completed(dismissed=false), the secret through a DH session.
        assert vault.unlock() is False
        assert locked() is False
        secret = item.get_secret()
        lock()
        # 2. The agent answers a wrong passcode (the TPM refuses it, the read asks again), then nothing
        # (the prompt's Cancel): Completed(dismissed=true), still locked, the item unreadable.
        refusedUnlock(vault, item)
        # 3. The client dismisses the prompt while the agents' question is out: the question goes
        # (its file removed), Completed(dismissed=true) with no object, nothing is unlocked.
        unlocked, prompt = call(BASE, SVC, 'Unlock', 'ao', ([path],))
        assert unlocked == [] and prompt.startswith(BASE + '/prompt/'), prompt
        rule = MatchRule(type='signal', interface=PROMPT, member='Completed', path=prompt)
        Proxy(message_bus, conn).AddMatch(rule)
        with conn.filter(rule) as completed:
            assert call(prompt, PROMPT, 'Prompt', 's', ('',)) == ()
            for _ in range(1200):
                if asks(): break
                time.sleep(0.1)
            assert asks(), 'the question never reached the agents'
            assert call(prompt, PROMPT, 'Dismiss') == ()
            signal = conn.recv_until_filtered(completed, timeout=60)
            assert signal.body == (True, ('ao', [])), signal.body
        for _ in range(3000):
            if not os.listdir(AGENTS): break
            time.sleep(0.1)
        assert not os.listdir(AGENTS), ('the dismissed question stayed', os.listdir(AGENTS))
        unreadable(item, 'a dismissed prompt unlocked the item')
        # The capture's positive control: a plain session's secret is on the bus as it is.
        login = secretstorage.get_default_collection(client)
        probe = login.create_item('p', {'probe': '1'}, sys.argv[2].encode())
        _, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
        got = call(probe.item_path, ITEM, 'GetSecret', 'o', (session,))[0]
        assert bytes(got[2]) == sys.argv[2].encode()
        sys.stdout.write(secret.decode())
        """

    /// A question in `directory` (an `ask.*` file) none of `seen` names, waited for as long as the
    /// machine's load needs, up to two minutes; its name joins `seen`, its text is returned. (A
    /// question answered a moment ago may still be there: each question has a name of its own.)
    static func question(in directory: String, seen: inout Set<String>) throws -> String {
        for _ in 0..<1200 {
            let names = try FileManager.default.contentsOfDirectory(atPath: directory)
            if let name = names.first(where: { $0.hasPrefix("ask.") && !seen.contains($0) }),
               let text = try? String(contentsOfFile: directory + "/" + name, encoding: .utf8) {
                seen.insert(name)
                return text
            }
            usleep(100_000)
        }
        throw SoftwareTPMError("no new question reached the agents' directory \(directory) in two minutes")
    }

    /// `systemd-tty-ask-password-agent --query` on a pty of its own (script), in a mount namespace
    /// where `directory` is /run/systemd/ask-password (the agent reads only that one), typing `typed`.
    static func agent(_ directory: String, typing typed: String) throws -> ChildResult {
        try runChild("/usr/bin/unshare", ["-m", "--propagation", "private", "/bin/sh", "-c",
                                          "mount --bind \"$1\" /run/systemd/ask-password && exec /usr/bin/script -qec "
                                          + "'/usr/bin/systemd-tty-ask-password-agent --query' /dev/null", "sh", directory],
                     input: Array(typed.utf8))
    }

    /// Synchronous, the client on a thread of its own: the agent's blocking steps must not hold a
    /// thread of Swift's shared pool that another test's work waits for (2 of them on 2 cores).
    @Test func aPasswordAgentAnswersTheUnlockPromptAndAWrongAnswerOrADismissalOpensNothing() throws {
        let runtime = NSTemporaryDirectory() + "keychain-ss-runtime-" + UUID().uuidString
        let agents = runtime + "/systemd/ask-password"
        try FileManager.default.createDirectory(atPath: agents, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: runtime) }
        // No --prompter and no display: the provider's SystemAuthenticator finds only the agents' directory.
        let bus = try PrivateBus(environment: ["XDG_RUNTIME_DIR": runtime, "DISPLAY": "", "WAYLAND_DISPLAY": ""])
        try bus.setPasscode(Self.passcode)
        let bytes = try bus.captured {
            let client = ClientThread { [bus] in
                try bus.python(Self.script, input: Array(Self.secret.utf8), [agents, Self.probe])
            }
            // 1. The question names the collection, hides the answer; the agent types the passcode.
            var seen: Set<String> = []
            let asked = try Self.question(in: agents, seen: &seen)
            #expect(asked.contains("Message=Unlock the keyring 'Vault'") && asked.contains("Echo=0"), "\(asked)")
            let right = try Self.agent(agents, typing: Self.passcode + "\n")
            #expect(right.status == 0, "\(right.stderr)")
            // 2. A wrong passcode, then (the read asks again) an empty answer: the prompt's Cancel.
            _ = try Self.question(in: agents, seen: &seen)
            let wrong = try Self.agent(agents, typing: "heron-0000-lantern\n")
            #expect(wrong.status == 0, "\(wrong.stderr)")
            let again = try Self.question(in: agents, seen: &seen)
            #expect(again.contains("Message=Unlock the keyring 'Vault'"), "\(again)")
            let empty = try Self.agent(agents, typing: "\n")
            #expect(empty.status == 0, "\(empty.stderr)")
            // 3. The client dismisses the third prompt itself (the script checks its question went).
            let read = try client.value()
            #expect(read == Self.secret, "the bus's log: \(bus.log.suffix(3000))")
        }
        #expect(bytes.range(of: Data(Self.probe.utf8)) != nil, "the capture missed the plain session's secret: it proves nothing")
        #expect(bytes.range(of: Data(Self.passcode.utf8)) == nil, "the passcode crossed the bus in the clear")
        #expect(bytes.range(of: Data("heron-0000-lantern".utf8)) == nil, "the wrong passcode crossed the bus in the clear")
        #expect(bytes.range(of: Data(Self.secret.utf8)) == nil, "the secret crossed the bus in the clear")
    }
}
