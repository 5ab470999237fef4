"""The package against a real keychaind on a private swtpm (conftest.py's `daemon`, a device passcode set)."""
import asyncio
import os
import select
import subprocess
import sys
import time
import uuid

import pytest

import keychain
from keychain import AccessControl, Accessible, Answer, ErrorCode, KeychainError, Prompt
from keychaind import PASSCODE
from terminal import on_terminal

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))


def service():
    return "py." + uuid.uuid4().hex[:12]


def storage(daemon, **options):
    return keychain.create_keychain(service=options.pop("service", None) or service(), socket=daemon.socket, **options)


def answering(*answers):
    """A prompter giving `answers` in order and recording what it was asked."""
    asked, queue = [], list(answers)

    def prompter(request):
        asked.append(request)
        return queue.pop(0) if queue else Answer.INTERRUPTED
    prompter.asked = asked
    return prompter


# The item calls.

def test_the_item_calls_store_read_list_describe_and_remove(daemon):
    vault = storage(daemon)
    assert vault.get_item("token") is None and not vault.has_item("token")
    vault.set_item("token", "s3cret ✓")
    vault.set_item("blob", b"\x00\xff\x01", label="the blob")
    assert vault.get_item("token") == "s3cret ✓"
    data = vault.get_data("blob")
    assert isinstance(data, bytearray) and data == bytearray(b"\x00\xff\x01")
    assert vault.has_item("token") and vault.get_all_keys() == ["blob", "token"]
    info = vault.get_item_info("blob")
    assert (info.key, info.service, info.accessible, info.access_control, info.label) == (
        "blob", vault.service, Accessible.AFTER_FIRST_UNLOCK, AccessControl.NONE, "the blob")
    assert info.security_level == "softwareTPM" and abs(time.time() - info.created.timestamp()) < 3600
    assert vault.get_item_info("absent") is None
    vault.set_item("token", "rotated")
    assert vault.get_item("token") == "rotated"
    vault.remove_item("token")
    vault.remove_item("token")  # absent: not an error
    assert vault.get_all_keys() == ["blob"]
    vault.clear()
    assert vault.get_all_keys() == [] and vault.get_data("blob") is None


def test_a_value_that_is_not_text_is_read_with_get_data(daemon):
    vault = storage(daemon)
    vault.set_item("raw", b"\xff\xfe")
    with pytest.raises(KeychainError) as raised:
        vault.get_item("raw")
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT
    assert raised.value.message == "Item 'raw' holds bytes that are not UTF-8 text: read it with get_data"


def test_two_storages_of_one_service_see_the_same_items_and_clear_leaves_other_services(daemon):
    name = service()
    a, b, other = storage(daemon, service=name), storage(daemon, service=name), storage(daemon)
    a.set_item("k", "v")
    other.set_item("k", "other")
    assert b.get_item("k") == "v"
    b.clear()
    assert a.get_item("k") is None and other.get_item("k") == "other"


def test_a_write_override_and_the_storage_default_are_stored_as_the_item_protection(daemon):
    vault = storage(daemon, accessible=Accessible.WHEN_UNLOCKED_THIS_DEVICE_ONLY)
    vault.set_item("plain", "v")
    vault.set_item("guarded", "v", access_control=AccessControl.PASSCODE, accessible="whenUnlocked")
    plain, guarded = vault.get_item_info("plain"), vault.get_item_info("guarded")
    assert (plain.accessible, plain.access_control) == (Accessible.WHEN_UNLOCKED_THIS_DEVICE_ONLY, AccessControl.NONE)
    assert (guarded.accessible, guarded.access_control) == (Accessible.WHEN_UNLOCKED, AccessControl.PASSCODE)


# Prompts.

def test_a_passcode_prompt_is_answered_by_the_callback(daemon):
    prompter = answering(Answer.passcode(PASSCODE))
    vault = storage(daemon, access_control=AccessControl.PASSCODE, prompt={"title": "Unlock", "cancel": "Use password"},
                    prompter=prompter)
    vault.set_item("refreshToken", "r1")  # a write never prompts
    assert prompter.asked == []
    assert vault.get_item("refreshToken", prompt=Prompt(title="Confirm the payment")) == "r1"
    [request] = prompter.asked
    assert (request.prompt.title, request.prompt.cancel, request.methods, request.service, request.key, request.attempt,
            request.previous_failure) == ("Confirm the payment", "Use password", ["passcode"], vault.service,
                                          "refreshToken", 1, None)
    assert vault.has_item("refreshToken") and len(prompter.asked) == 1  # has_item never prompts


def test_a_wrong_passcode_is_asked_again_then_fails_with_authentication_failed(daemon):
    prompter = answering(Answer.passcode("000000"), Answer.passcode(b"111111"), Answer.passcode(bytearray(b"222222")))
    vault = storage(daemon, access_control="passcode", prompter=prompter)
    vault.set_item("k", "v")
    with pytest.raises(KeychainError) as raised:
        vault.get_item("k")
    assert (raised.value.code, raised.value.message) == ("AUTHENTICATION_FAILED", "Not recognised (wrong passcode)")
    assert [(r.attempt, r.previous_failure) for r in prompter.asked] == [(1, None), (2, "wrong passcode"), (3, "wrong passcode")]
    # The right one still opens it (the wrong ones did not lock the passcode out).
    right = storage(daemon, service=vault.service, prompter=answering(Answer.passcode(PASSCODE)))
    assert right.get_item("k") == "v"


@pytest.mark.parametrize("answer, code", [(Answer.CANCEL, "USER_CANCELED"), (None, "USER_CANCELED"),
                                          (Answer.FALLBACK, "USER_FALLBACK"), (Answer.INTERRUPTED, "SYSTEM_CANCELED"),
                                          (Answer.unavailable("no one here"), "INTERACTION_NOT_ALLOWED")])
def test_a_prompt_ended_without_an_answer_gives_the_seeds_code_and_keeps_the_item(daemon, answer, code):
    vault = storage(daemon, access_control="passcode", prompter=lambda request: answer)
    vault.set_item("k", "v")
    with pytest.raises(KeychainError) as raised:
        vault.get_item("k")
    assert raised.value.code == code
    assert vault.has_item("k")


def test_without_a_prompter_a_guarded_read_is_interaction_not_allowed_and_a_plain_one_works(daemon):
    vault = storage(daemon, prompter=None)
    vault.set_item("guarded", "v", access_control="passcode")
    vault.set_item("plain", "p")
    with pytest.raises(KeychainError) as raised:
        vault.get_item("guarded")
    assert raised.value.code == "INTERACTION_NOT_ALLOWED"
    assert vault.get_item("plain") == "p"


def test_a_prompter_that_raises_ends_the_read_and_its_exception_reaches_the_caller(daemon):
    def prompter(request):
        raise LookupError("the program's own failure")
    vault = storage(daemon, access_control="passcode", prompter=prompter)
    vault.set_item("k", "v")
    with pytest.raises(LookupError):
        vault.get_item("k")
    assert vault.get_all_keys() == ["k"]  # the connection is usable again


def _run_child(daemon, script, terminal=False, answer=None):
    """`script` in a new session: without a controlling terminal, or with a pty as it, typing `answer` at the prompt."""
    env = {"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "PYTHONPATH": SRC}
    if not terminal:
        return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=60,
                              start_new_session=True, stdin=subprocess.DEVNULL)
    return on_terminal([sys.executable, "-c", script], env, answer)


def test_the_default_prompter_asks_on_the_terminal_with_echo_off(daemon):
    name = service()
    storage(daemon, service=name, prompter=None).set_item("k", "from the terminal", access_control="passcode")
    script = f"import keychain; print(keychain.create_keychain(service={name!r}).get_item('k'))"
    done = _run_child(daemon, script, terminal=True, answer=(PASSCODE + "\n").encode())
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"from the terminal\n"
    assert PASSCODE.encode() not in done.stderr  # not echoed


def test_the_default_prompter_without_a_terminal_is_interaction_not_allowed(daemon):
    name = service()
    storage(daemon, service=name, prompter=None).set_item("k", "v", access_control="passcode")
    script = (f"import keychain\ntry: keychain.create_keychain(service={name!r}).get_item('k')\n"
              "except keychain.KeychainError as e: print(e.code); print(e.message)")
    done = _run_child(daemon, script)
    code, message = done.stdout.decode().splitlines()
    assert code == "INTERACTION_NOT_ALLOWED" and "no controlling terminal" in message
    check = f"import keychain; print(keychain.create_keychain(service={name!r}).can_use_access_control('passcode'))"
    assert "available=False, reason='noPrompt'" in _run_child(daemon, check).stdout.decode()


def test_can_use_access_control_answers_for_the_device_and_the_storage(daemon):
    vault = storage(daemon, prompter=answering())
    assert vault.can_use_access_control(AccessControl.PASSCODE) == keychain.AccessControlCheck(True, None)
    assert vault.can_use_access_control("none").available
    # keychaind runs with no fingerprint reader (--reader none).
    assert vault.can_use_access_control("biometryAny") == keychain.AccessControlCheck(False, "notAvailable")
    assert keychain.can_use_access_control("biometryCurrentSet", socket=daemon.socket, prompter=None).reason == "notAvailable"
    with pytest.raises(KeychainError) as raised:
        vault.set_item("k", "v", access_control=AccessControl.BIOMETRY_ANY)
    assert raised.value.code == "BIOMETRY_NOT_AVAILABLE"


# Errors.

BAD_OPTIONS = [
    (dict(acessControl="biometryAny"), "Invalid keychain options: unknown option 'acessControl'"),
    (dict(access_control="biometryCurrentSet", auth_validity=30),
     "accessControl 'biometryCurrentSet' can't be used with authValidity > 0 (got 30): set authValidity to 0, or use "
     "'biometryAny' to allow a window"),
    (dict(synchronizable=True, accessible=Accessible.AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY),
     "synchronizable can't be used with accessible 'afterFirstUnlockThisDeviceOnly': a ThisDeviceOnly item never leaves "
     "this device; set synchronizable to false, or use accessible 'afterFirstUnlock'"),
    (dict(synchronizable=True, access_control="passcode"),
     "synchronizable can't be used with accessControl 'passcode': an item behind authentication never leaves this device; "
     "set synchronizable to false, or use accessControl 'none'"),
    (dict(service=""), "Invalid service: expected a non-empty string of up to 256 characters, got an empty string"),
    (dict(service="x" * 257), "Invalid service: expected a non-empty string of up to 256 characters, got 257 characters"),
    (dict(accessible="whenever"),
     "Invalid accessible: expected one of 'whenUnlocked', 'afterFirstUnlock', 'always', 'whenPasscodeSetThisDeviceOnly', "
     "'whenUnlockedThisDeviceOnly', 'afterFirstUnlockThisDeviceOnly', 'alwaysThisDeviceOnly', got 'whenever'"),
    (dict(auth_validity=-1), "Invalid authValidity: expected a whole number of seconds, 0 or more, got -1"),
    (dict(access_group=""),
     "Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group"),
    (dict(prompt={"titel": "x"}), "Invalid keychain options: unknown option 'prompt.titel'"),
    (dict(android={"keyStorage": "sim"}), "Invalid android.keyStorage: expected one of 'tee', 'strongbox', got 'sim'"),
]


@pytest.mark.parametrize("options, message", BAD_OPTIONS)
def test_options_that_break_a_seed_rule_fail_at_once_with_its_message(options, message, tmp_path):
    options.setdefault("service", "svc")
    with pytest.raises(KeychainError) as raised:
        keychain.create_keychain(socket=str(tmp_path / "never-reached.sock"), **options)
    assert (raised.value.code, raised.value.message) == ("INVALID_ARGUMENT", message)


def test_without_a_service_or_an_application_identifier_a_storage_is_invalid(monkeypatch):
    monkeypatch.delenv("KEYCHAIN_APP_ID", raising=False)
    monkeypatch.delenv("GIO_LAUNCHED_DESKTOP_FILE", raising=False)
    monkeypatch.setattr("keychain._appid.unit_application", lambda cgroup: None)
    with pytest.raises(KeychainError) as raised:
        keychain.create_keychain()
    assert raised.value.code == "INVALID_ARGUMENT" and raised.value.message.startswith("No application identifier")
    monkeypatch.setenv("KEYCHAIN_APP_ID", "com.example.app")
    assert keychain.create_keychain().service == "com.example.app"


def test_bad_call_arguments_fail_before_anything_is_sent(tmp_path):
    """The socket does not exist: a call that reached it would be HARDWARE_UNAVAILABLE, not INVALID_ARGUMENT."""
    vault = keychain.create_keychain(service="svc", socket=str(tmp_path / "absent.sock"))
    calls = [
        (lambda: vault.get_item(""), "Invalid key: expected a non-empty string of up to 1024 bytes, got an empty string"),
        (lambda: vault.has_item("k" * 1025), "Invalid key: expected a non-empty string of up to 1024 bytes, got 1025 bytes"),
        (lambda: vault.remove_item(7), "Invalid key: expected a non-empty string of up to 1024 bytes, got 7"),
        (lambda: vault.set_item("k", b"x" * ((16 << 20) + 1)), "Invalid value: at most 16777216 bytes, got 16777217"),
        (lambda: vault.set_item("k", 5), "Invalid value: expected a string or bytes, got 5"),
        (lambda: vault.set_item("k", "v", label="l" * 4097), "Invalid label: expected a string of up to 4096 bytes, got 4097 bytes"),
        (lambda: vault.set_item("k", "v", access_control="biometryCurrentSet", auth_validity=5),
         "accessControl 'biometryCurrentSet' can't be used with authValidity > 0 (got 5): set authValidity to 0, or use "
         "'biometryAny' to allow a window"),
        (lambda: vault.can_use_access_control("faceId"),
         "Invalid accessControl: expected one of 'none', 'biometryAny', 'biometryCurrentSet', 'biometryAnyOrPasscode', "
         "'biometryCurrentSetOrPasscode', 'passcode', got 'faceId'"),
    ]
    for call, message in calls:
        with pytest.raises(KeychainError) as raised:
            call()
        assert (raised.value.code, raised.value.message) == ("INVALID_ARGUMENT", message)
    with pytest.raises(KeychainError) as raised:
        vault.get_item("k")
    assert raised.value.code == "HARDWARE_UNAVAILABLE"


def test_an_absent_daemon_is_hardware_unavailable_in_the_words_of_swifts_client(daemon, tmp_path):
    path = str(tmp_path / "absent.sock")
    with pytest.raises(KeychainError) as raised:
        keychain.create_keychain(service="svc", socket=path).get_item("k")
    error = raised.value
    assert (error.code, error.cause) == ("HARDWARE_UNAVAILABLE", "errno 2")
    assert error.message == (f"The keychain service is not running: nothing answers on {path} (start keychaind or its "
                             "socket unit; keychainctl --direct uses a store without the service)")
    # keychainctl's front (KeychainWire's WireFailure) says the same.
    front = subprocess.run([daemon.bin + "/keychainctl", "get", "svc", "k"], capture_output=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": path, "HOME": str(tmp_path)})
    assert str(error) in front.stderr.decode()


def test_keychain_store_without_keychain_socket_is_refused_not_another_store(monkeypatch):
    monkeypatch.delenv("KEYCHAIN_SOCKET", raising=False)
    monkeypatch.setenv("KEYCHAIN_STORE", "/var/lib/somewhere")
    with pytest.raises(KeychainError) as raised:
        keychain.create_keychain(service="svc").get_all_keys()
    assert raised.value.code == "HARDWARE_UNAVAILABLE" and "KEYCHAIN_SOCKET" in raised.value.message


@pytest.fixture
def shared_dir():
    """A folder every uid may write (pytest's tmp_path is root's alone)."""
    import shutil
    import tempfile
    path = tempfile.mkdtemp(prefix="keychain-py-shared-")
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_listener_of_another_uid_gets_nothing(shared_dir):
    """Attack: a socket planted where KEYCHAIN_SOCKET points, by uid 65534: the value is never sent to it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another uid")
    path, log = os.path.join(shared_dir, "planted.sock"), os.path.join(shared_dir, "received")
    listener = ("import socket,sys\ns=socket.socket(socket.AF_UNIX);s.bind(sys.argv[1]);s.listen(4);print('up',flush=True)\n"
                "c,_=s.accept();c.settimeout(3)\ndata=b''\ntry:\n  while True:\n    d=c.recv(65536)\n    if not d: break\n"
                "    data+=d\nexcept OSError: pass\nopen(sys.argv[2],'wb').write(data)\n")
    p = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", listener, path,
                          log], stdout=subprocess.PIPE, cwd=shared_dir)
    try:
        assert p.stdout.readline() == b"up\n"
        os.chmod(path, 0o666)
        with pytest.raises(KeychainError) as raised:
            keychain.create_keychain(service="svc", socket=path).set_item("k", "the secret value")
        assert p.wait(30) == 0
        assert open(log, "rb").read() == b""
        assert raised.value.code == "HARDWARE_UNAVAILABLE"
        assert raised.value.message.startswith(f"The keychain service at {path} is not trusted: its socket belongs to uid 65534")
    finally:
        p.kill()
        p.wait()


# Two uids.

def test_root_and_nobody_keep_separate_items_under_the_same_service_and_key(daemon):
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as nobody")
    name = service()
    mine = storage(daemon, service=name)
    mine.set_item("token", "root's")
    script = (f"import keychain\nk = keychain.create_keychain(service={name!r})\n"
              "before = k.get_item('token'); keys = k.get_all_keys()\n"
              "k.set_item('token', \"nobody's\"); k.set_item('own', 'x')\n"
              "print(before, keys, k.get_item('token'), k.get_all_keys())\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
                          env={"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "PYTHONPATH": SRC},
                          capture_output=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == "None [] nobody's ['own', 'token']\n"
    assert mine.get_item("token") == "root's" and mine.get_all_keys() == ["token"]


# asyncio.

def test_the_asyncio_form_makes_the_same_calls_and_answers_prompts_with_a_coroutine(daemon):
    asked = []

    async def prompter(request):
        asked.append(request.key)
        await asyncio.sleep(0)
        return Answer.passcode(PASSCODE)

    async def main():
        vault = keychain.create_async_keychain(service=service(), socket=daemon.socket, prompter=prompter)
        await vault.set_item("plain", "p")
        await vault.set_item("guarded", "g", access_control=AccessControl.PASSCODE)
        assert await vault.get_item("plain") == "p"
        assert await vault.get_item("guarded") == "g"
        assert await vault.has_item("plain") and await vault.get_all_keys() == ["guarded", "plain"]
        assert (await vault.get_item_info("guarded")).access_control == AccessControl.PASSCODE
        assert (await vault.can_use_access_control("passcode")).available
        # Many reads in flight at once, each on its own connection.
        values = await asyncio.gather(*(vault.get_item("plain") for _ in range(20)))
        assert values == ["p"] * 20
        await vault.remove_item("plain")
        assert await vault.get_item("plain") is None
        with pytest.raises(KeychainError) as raised:
            await vault.get_item("")
        assert raised.value.code == "INVALID_ARGUMENT"
        await vault.clear()
        assert await vault.get_all_keys() == []

    asyncio.run(main())
    assert asked == ["guarded"]


def test_the_asyncio_form_runs_a_blocking_prompter_off_the_loop(daemon):
    async def main():
        vault = keychain.create_async_keychain(service=service(), socket=daemon.socket,
                                               prompter=lambda request: Answer.passcode(PASSCODE))
        await vault.set_item("k", "v", access_control="passcode")
        ticks = []

        async def tick():
            for _ in range(3):
                ticks.append(1)
                await asyncio.sleep(0)
        value, _ = await asyncio.gather(vault.get_item("k"), tick())
        assert value == "v" and len(ticks) == 3

    asyncio.run(main())


def test_a_kept_connection_is_reused_and_threads_run_side_by_side(daemon):
    from concurrent.futures import ThreadPoolExecutor
    vault = storage(daemon)
    vault.set_item("k", "v")
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda _: vault.get_item("k"), range(64))) == ["v"] * 64


# Kept connections.

def test_a_kept_connection_keychaind_closed_while_idle_is_replaced_and_the_call_served():
    """keychaind ends an idle connection (--idle-timeout 1): the next call's request goes once more, on a new one."""
    from keychain import _client, _socket
    from keychaind import Daemon
    daemon = Daemon(passcode=False, options=["--idle-timeout", "1"])
    try:
        vault = storage(daemon)
        vault.set_item("k", "v")
        [kept] = _socket.POOL._idle[(daemon.socket, os.geteuid(), os.getegid())]
        # Until keychaind has closed it (readable at its end of stream), however long the machine takes.
        assert select.select([kept.sock], [], [], 60)[0] == [kept.sock]
        assert vault.get_item("k") == "v"
        [now] = _socket.POOL._idle[(daemon.socket, os.geteuid(), os.getegid())]
        assert now is not kept and kept.sock.fileno() == -1

        async def main():
            store = keychain.create_async_keychain(service=vault.service, socket=daemon.socket)
            assert await store.get_item("k") == "v"
            [first] = _client._POOLS[asyncio.get_running_loop()]._idle[(daemon.socket, os.geteuid(), os.getegid())]
            readable = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().add_reader(first.sock, readable.set_result, None)
            await asyncio.wait_for(readable, 60)
            asyncio.get_running_loop().remove_reader(first.sock)
            assert await store.get_item("k") == "v"
        asyncio.run(main())
    finally:
        daemon.stop()



def test_a_forked_child_does_not_use_its_parents_kept_connection(daemon):
    from keychain import _socket
    _socket.POOL.clear()  # the calls of the tests before keep connections too
    vault = storage(daemon)
    vault.set_item("k", "v")
    [kept] = _socket.POOL._idle[(daemon.socket, os.geteuid(), os.getegid())]
    child = os.fork()
    if child == 0:
        ok = not _socket.POOL._idle and kept.sock.fileno() == -1 and vault.get_item("k") == "v"
        os._exit(0 if ok else 1)
    assert vault.get_item("k") == "v"
    assert os.waitpid(child, 0)[1] == 0
    assert _socket.POOL._idle[(daemon.socket, os.geteuid(), os.getegid())] == [kept] and kept.sock.fileno() >= 0


def test_the_default_storage_is_the_application_identifiers(daemon, socket_env, monkeypatch):
    monkeypatch.setenv("KEYCHAIN_APP_ID", "py.default." + uuid.uuid4().hex[:8])
    from keychain import keychain as default
    default.set_item("k", "v")
    assert keychain.create_keychain(service=os.environ["KEYCHAIN_APP_ID"]).get_item("k") == "v"


# A fingerprint reader (the simulated one), fingers answered by the callback.

@pytest.fixture(scope="module")
def reader_daemon():
    from keychaind import Daemon
    started = Daemon(reader=True)
    try:
        started.keychainctl(["reader", "enroll", "thumb"], PASSCODE + "\n")
        yield started
    finally:
        started.stop()


def test_a_fingerprint_prompt_is_answered_with_a_finger_and_a_new_enrollment_invalidates_current_set(reader_daemon):
    prompter = answering(Answer.finger("thumb"), Answer.finger("pinky"), Answer.finger("pinky"))
    vault = storage(reader_daemon, access_control=AccessControl.BIOMETRY_CURRENT_SET, prompter=prompter,
                    attempts_per_read=2)
    assert vault.can_use_access_control("biometryCurrentSet").available
    vault.set_item("refreshToken", "r-1")
    assert vault.get_item("refreshToken") == "r-1"
    assert "fingerprint" in prompter.asked[0].methods
    with pytest.raises(KeychainError) as raised:
        vault.get_item("refreshToken")  # an enrolled finger it is not
    assert (raised.value.code, [r.previous_failure for r in prompter.asked[1:]]) == ("AUTHENTICATION_FAILED", [None, "no match"])
    reader_daemon.keychainctl(["reader", "enroll", "index"], PASSCODE + "\n")
    again = storage(reader_daemon, service=vault.service, prompter=answering(Answer.finger("thumb")))
    with pytest.raises(KeychainError) as raised:
        again.get_item("refreshToken")
    assert raised.value.code == "KEY_INVALIDATED"
    assert not again.has_item("refreshToken")  # seed: the item is removed
