import Foundation
import KeychainTestThreads
import Testing

/// A collection behind the passcode with an authValidity window: `Lock` ends the window (the next
/// Unlock asks again), and a prompt waiting for its answer leaves the provider serving other callers.
/// The provider's scripted prompter answers for the person (`delay:SECONDS` for one who takes their time).
@Suite(.serialized, .offThePool) struct PromptWindowTests {
    init() throws {
        try PrivateBus.requirePython(module: "jeepney", package: "python3-jeepney")
        try PrivateBus.requirePython(module: "secretstorage", package: "python3-secretstorage")
    }

    /// A bus whose provider answers prompts from `answers`, the device passcode 2468.
    func bus(answers: String) throws -> PrivateBus {
        let bus = try PrivateBus(answers: answers)
        try bus.setPasscode("2468")
        return bus
    }

    /// After `RawCallTests.prelude`: makes the collection `Vault` (passcode, a 300 s window) at
    /// `path`, with `locked()` (its Locked property), `lock()` (Lock, asserted locked),
    /// `unreadable(item, why)` (still locked, a read of `item` refused, else it exits with `why`) and
    /// `refusedUnlock(collection, item)` (an Unlock the person refused: dismissed, `item` unreadable).
    static let vaultCollection = """
        from secretstorage.exceptions import LockedException
        props = {'org.freedesktop.Secret.Collection.Label': ('s', 'Vault'),
                 'org.freedesktop.Secret.Collection.KeychainAccessControl': ('s', 'passcode'),
                 'org.freedesktop.Secret.Collection.KeychainAuthValidity': ('u', 300)}
        path, _ = call(BASE, SVC, 'CreateCollection', 'a{sv}s', (props, ''))
        def locked():
            return call(path, 'org.freedesktop.DBus.Properties', 'Get', 'ss', (COL, 'Locked'))[0][1]
        def lock():
            assert call(BASE, SVC, 'Lock', 'ao', ([path],)) == ([path], '/')
            assert locked() is True
        def unreadable(item, why):
            assert locked() is True
            try:
                item.get_secret()
            except LockedException:
                return
            raise SystemExit(why)
        def refusedUnlock(collection, item):
            assert collection.unlock() is True
            unreadable(item, 'read a locked item')

        """

    /// Makes the collection `Vault` (passcode, a 300 s window) holding one item, and locks it.
    static let vault = RawCallTests.prelude + vaultCollection + """
        import secretstorage
        vault = secretstorage.Collection(secretstorage.dbus_init(), path)
        assert vault.unlock() is False  # nothing stored yet: opened without a question
        vault.create_item('v', {'vault': '1'}, b'vault-secret')
        [item] = vault.search_items({'vault': '1'})
        lock()

        """

    @Test func lockEndsTheWindowSoTheNextReadNeedsThePromptAgain() throws {
        // Three answers: the first Unlock's, the one after the first Lock, a cancel after the second.
        let bus = try bus(answers: "passcode:2468\npasscode:2468\ncancel\n")
        let out = try bus.python(Self.vault + """
            assert vault.unlock() is False  # asks: the first answer
            assert locked() is False
            for _ in range(3):
                assert item.get_secret() == b'vault-secret'  # inside the window: no question
            lock()
            # The window ended with the Lock: this Unlock asks (the second answer)...
            assert vault.unlock() is False
            assert item.get_secret() == b'vault-secret'
            lock()
            # ...and this one asks too, and the person cancels: still locked, the item unreadable.
            refusedUnlock(vault, item)
            print('ok')
            """)
        #expect(out == "ok\n")
    }

    @Test func aPromptWaitingForItsAnswerLeavesTheProviderServingOthers() throws {
        // The person takes 10 s to type the passcode.
        let bus = try bus(answers: "delay:10\npasscode:2468\n")
        let out = try bus.python(Self.vault + """
            import threading, time
            other = secretstorage.dbus_init()
            login = secretstorage.get_default_collection(other)
            login.create_item('l', {'login': '1'}, b'login-secret')
            [mine] = login.search_items({'login': '1'})
            assert mine.get_secret() == b'login-secret'  # its key unsealed before the prompt
            result = {}
            def unlock():
                result['dismissed'] = secretstorage.Collection(secretstorage.dbus_init(), path).unlock()
                result['done'] = time.monotonic()
            start = time.monotonic()
            waiting = threading.Thread(target=unlock)
            waiting.start()
            time.sleep(1)  # the prompt is asking now
            served = time.monotonic()
            for _ in range(5):
                assert mine.get_secret() == b'login-secret'
            assert [i.item_path for i in secretstorage.search_items(other, {'vault': '1'})] == [item.item_path]
            assert locked() is True
            served = time.monotonic() - served
            assert 'done' not in result, 'the prompt did not wait for its answer'
            waiting.join(60)
            assert result['dismissed'] is False
            assert result['done'] - start >= 9, result['done'] - start
            assert served < 4, ('other callers waited for the prompt', served)
            assert locked() is False and item.get_secret() == b'vault-secret'
            print('ok')
            """)
        #expect(out == "ok\n")
    }
}
