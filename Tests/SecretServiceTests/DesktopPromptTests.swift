import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing

/// The provider's Prompt asks through the system's prompters (the library's `SystemAuthenticator`,
/// the provider's default): gcr's dialog on a desktop of the test's own (Xvfb, gcr-prompter activated
/// by the same private bus), a person typing into it (xdotool), a real client (secretstorage) waiting
/// for `Completed`. Everything on the bus is captured (dbus-monitor): neither the passcode nor the
/// secret crosses it in the clear.
@Suite(.serialized, .offThePool) struct DesktopPromptTests {
    /// The device passcode, and the secrets: long enough that finding them in the capture is no chance.
    static let passcode = "wombat-8642-sundial"
    static let secret = "vault-secret-5d1c9a77e3"
    static let probe = "plain-probe-0b8e44f2c6"
    static let title = "Unlock the keyring 'Vault'"

    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
        try PrivateBus.require("/usr/bin/dbus-monitor", "dbus-bin")
    }

    static let script = RawCallTests.prelude + PromptWindowTests.vaultCollection + """
        import secretstorage, subprocess, time
        from jeepney import MatchRule, message_bus
        from jeepney.io.blocking import Proxy
        PROMPT = 'org.freedesktop.Secret.Prompt'
        TITLE = sys.argv[1]
        def shown():
            return subprocess.run(['xdotool', 'search', '--onlyvisible', '--name', TITLE], capture_output=True).returncode == 0
        client = secretstorage.dbus_init()
        vault = secretstorage.Collection(client, path)
        assert vault.unlock() is False  # nothing stored yet: opened without a question
        vault.create_item('v', {'vault': '1'}, sys.stdin.buffer.read())
        [item] = vault.search_items({'vault': '1'})
        lock()
        # 1. The dialog asks, the person types the passcode: Completed(dismissed=false), the secret
        # read through a DH session (secretstorage's), and again inside the window with no dialog.
        assert vault.unlock() is False
        assert locked() is False
        secret = item.get_secret()
        assert item.get_secret() == secret and not shown()
        lock()
        # 2. The person presses Escape: Completed(dismissed=true), still locked, the item unreadable.
        refusedUnlock(vault, item)
        # 3. The client dismisses the prompt while its dialog shows: Completed(dismissed=true) with
        # no object, the dialog goes without anyone touching it, nothing is unlocked.
        unlocked, prompt = call(BASE, SVC, 'Unlock', 'ao', ([path],))
        assert unlocked == [] and prompt.startswith(BASE + '/prompt/'), prompt
        rule = MatchRule(type='signal', interface=PROMPT, member='Completed', path=prompt)
        Proxy(message_bus, conn).AddMatch(rule)
        with conn.filter(rule) as completed:
            assert call(prompt, PROMPT, 'Prompt', 's', ('',)) == ()
            for _ in range(3000):
                if shown(): break
                time.sleep(0.1)
            assert shown(), 'the dialog never showed'
            error('org.freedesktop.DBus.Error.Failed', call(prompt, PROMPT, 'Prompt', 's', ('',)))  # already showing
            assert call(prompt, PROMPT, 'Dismiss') == ()
            signal = conn.recv_until_filtered(completed, timeout=300)
            assert signal.body == (True, ('ao', [])), signal.body
        for _ in range(3000):
            if not shown(): break
            time.sleep(0.1)
        assert not shown(), 'the dismissed dialog stayed'
        error('org.freedesktop.Secret.Error.NoSuchObject', call(prompt, PROMPT, 'Prompt', 's', ('',)))
        unreadable(item, 'a dismissed prompt unlocked the item')
        # The capture's positive control: a plain session's secret is on the bus as it is.
        login = secretstorage.get_default_collection(client)
        probe = login.create_item('p', {'probe': '1'}, sys.argv[2].encode())
        _, session = call(BASE, SVC, 'OpenSession', 'sv', ('plain', ('s', '')))
        got = call(probe.item_path, ITEM, 'GetSecret', 'o', (session,))[0]
        assert bytes(got[2]) == sys.argv[2].encode()
        sys.stdout.write(secret.decode())
        """

    /// Synchronous, the client on a thread of its own: the person's blocking steps must not hold a thread
    /// of Swift's shared pool that the client's or another test's work waits for (2 of them on 2 cores).
    @Test func anUnlockPromptAsksThroughTheDesktopsDialogAndADismissalOpensNothing() throws {
        let screen = try TestDisplay()
        let bus = try PrivateBus(display: screen)
        try bus.setPasscode(Self.passcode)
        let bytes = try bus.captured {
            let client = ClientThread { [bus] in
                try bus.python(Self.script, input: Array(Self.secret.utf8), [Self.title, Self.probe], environment: ["DISPLAY": screen.display])
            }
            // 1. The person types the passcode; the TPM checks it. (Each returns once its dialog is gone.)
            let typed = try screen.type(Self.passcode, into: Self.title)
            #expect(typed.status == 0, "\(typed.stderr)")
            // 2. The next Unlock's dialog: the person cancels it.
            let pressed = try screen.press("Escape", into: Self.title)
            #expect(pressed.status == 0, "\(pressed.stderr)")
            // 3. The client dismisses the third (the script checks the dialog went).
            let read = try client.value()
            #expect(read == Self.secret, "the bus's log: \(bus.log.suffix(3000))")
        }
        #expect(bytes.range(of: Data(Self.probe.utf8)) != nil, "the capture missed the plain session's secret: it proves nothing")
        #expect(bytes.range(of: Data("org.gnome.keyring.internal.Prompter".utf8)) != nil, "the capture missed the prompter's calls")
        #expect(bytes.range(of: Data(Self.passcode.utf8)) == nil, "the passcode crossed the bus in the clear")
        #expect(bytes.range(of: Data(Self.secret.utf8)) == nil, "the secret crossed the bus in the clear")
    }
}

/// A blocking client on a Foundation thread of its own; `value()` waits for it.
final class ClientThread<T: Sendable>: @unchecked Sendable {
    private var result: Result<T, any Error>?
    private let done = DispatchSemaphore(value: 0)

    init(_ body: @escaping @Sendable () throws -> T) {
        Thread { [self] in
            result = Result { try body() }
            done.signal()
        }.start()
    }

    func value() throws -> T {
        done.wait()
        return try result!.get()
    }
}
