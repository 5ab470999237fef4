"""The package's bytes are the protocol's: each request and prompt answer equals the frame that
Tests/KeychainTests/WireGoldenTests.swift pins for the Swift library's client, taken from a socket."""
import os
import socket
import tempfile
import threading

import pytest

import keychain
from keychain import Answer, KeychainError

# Copied from WireGoldenTests.swift (requestOptions, answerOptions, golden, goldenAnswers, goldenPrompt).
REQUEST_OPTIONS = ("010000005d020001000000046d61696c020000001061667465724669727374556e6c6f636b03000000046e6f6e650400000008"
                   "000000000000000005000000010006000000047465616d070000000b020001000000044d61696c0800000003746565")
ANSWER_OPTIONS = ("0100000044020001000000046d61696c020000001061667465724669727374556e6c6f636b03000000046e6f6e6504000000080000"
                  "0000000000000500000001000800000003746565")
O = REQUEST_OPTIONS
GOLDEN = {
    "setItem": "0201" + O + "0200000005746f6b656e0300000001760400000006616c77617973050000000870617373636f646506000000080000"
                            "00000000000507000000014c080000000100",
    "setItemPlain": "0201" + O + "0200000005746f6b656e030000000176",
    "getItem": "0202" + O + "0200000005746f6b656e09000000130200020000000c666f7220746865206d61696c",
    "hasItem": "0203" + O + "0200000005746f6b656e",
    "removeItem": "0204" + O + "0200000005746f6b656e",
    "clear": "0205" + O,
    "allKeys": "0206" + O,
    "itemInfo": "0207" + O + "0200000005746f6b656e",
    "storageCanUse": "0208" + O + "050000000b62696f6d65747279416e79",
    "deviceCanUse": "0219050000000870617373636f6465",
}
ASKED = "0202" + ANSWER_OPTIONS + "0200000005746f6b656e0a000000080000000000000002"
GOLDEN_ANSWERS = {
    "cancel": "028332000000080000000000000002",
    "fallback": "028332000000080000000000000003",
    "finger": "02833200000008000000000000000033000000057468756d62",
    "interrupted": "028332000000080000000000000004",
    "passcode": "028332000000080000000000000001340000000431323334",
    "unavailable": "028332000000080000000000000005350000000b6e6f207465726d696e616c",
}
GOLDEN_PROMPT = ("0282280000000e0200010000000154040000000143290000001a5b2266696e6765727072696e74222c2270617373636f6465225d"
                 "2a000000046d61696c2b00000005746f6b656e2c0000000800000000000000022d000000086e6f206d61746368")
# KeychainError(.internal, "recorded") as keychaind sends it.
REFUSAL = bytes.fromhex("02811e00000008494e5445524e414c1f000000087265636f72646564")


class Recorder:
    """A socket that records each frame: a getItem carrying `attempts` is asked GOLDEN_PROMPT first (its
    answer recorded too); every request is then refused with an error reply."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="keychain-py-golden-")
        self.socket = os.path.join(self.dir, "golden.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.socket)
        self.listener.listen(8)
        self.frames, self.lock = [], threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _frame(conn):
        head = b""
        while len(head) < 4:
            chunk = conn.recv(4 - len(head))
            if not chunk:
                return None
            head += chunk
        body, length = b"", int.from_bytes(head, "big")
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                return None
            body += chunk
        return body

    def _serve(self, conn):
        with conn:
            while True:
                request = self._frame(conn)
                if request is None:
                    return
                with self.lock:
                    self.frames.append(request.hex())
                if request[1] == 2 and bytes.fromhex("0a00000008") in request:
                    prompt = bytes.fromhex(GOLDEN_PROMPT)
                    conn.sendall(len(prompt).to_bytes(4, "big") + prompt)
                    answer = self._frame(conn)
                    with self.lock:
                        self.frames.append(answer.hex())
                conn.sendall(len(REFUSAL).to_bytes(4, "big") + REFUSAL)

    def take(self):
        with self.lock:
            frames, self.frames = self.frames, []
        return frames

    def close(self):
        self.listener.close()
        os.unlink(self.socket)
        os.rmdir(self.dir)


@pytest.fixture
def recorder():
    started = Recorder()
    yield started
    started.close()


def test_each_storage_requests_bytes_are_the_ones_the_protocol_pinned(recorder):
    storage = keychain.create_keychain(service="mail", access_group="team", prompt={"title": "Mail"}, prompter=None,
                                       socket=recorder.socket)
    calls = {
        "setItem": lambda: storage.set_item("token", "v", accessible="always", access_control="passcode", auth_validity=5,
                                            label="L", synchronizable=False),
        "setItemPlain": lambda: storage.set_item("token", b"v"),
        "getItem": lambda: storage.get_item("token", prompt=keychain.Prompt(subtitle="for the mail")),
        "hasItem": lambda: storage.has_item("token"),
        "removeItem": lambda: storage.remove_item("token"),
        "clear": lambda: storage.clear(),
        "allKeys": lambda: storage.get_all_keys(),
        "itemInfo": lambda: storage.get_item_info("token"),
        "storageCanUse": lambda: storage.can_use_access_control(keychain.AccessControl.BIOMETRY_ANY),
        "deviceCanUse": lambda: keychain.can_use_access_control("passcode", socket=recorder.socket),
    }
    seen = {}
    for name, call in calls.items():
        with pytest.raises(KeychainError) as raised:
            call()
        assert (raised.value.code, raised.value.message) == ("INTERNAL", "recorded")
        seen[name] = recorder.take()
    assert seen == {name: [frame] for name, frame in GOLDEN.items()}


def test_each_prompt_answer_is_the_bytes_the_protocol_pinned(recorder):
    answers = {"finger": Answer.finger("thumb"), "passcode": Answer.passcode(bytearray(b"1234")), "cancel": Answer.CANCEL,
               "fallback": Answer.FALLBACK, "interrupted": Answer.INTERRUPTED,
               "unavailable": Answer.unavailable("no terminal")}
    seen, asked = {}, []
    for name, answer in answers.items():
        def prompter(request, answer=answer):
            asked.append(request)
            return answer
        storage = keychain.create_keychain(service="mail", prompter=prompter, attempts_per_read=2, socket=recorder.socket)
        with pytest.raises(KeychainError):
            storage.get_item("token")
        seen[name] = recorder.take()
    assert seen == {name: [ASKED, frame] for name, frame in GOLDEN_ANSWERS.items()}
    # keychaind's pinned prompt, as the callback is asked it.
    for request in asked:
        assert (request.prompt.title, request.prompt.cancel, request.methods, request.service, request.key, request.attempt,
                request.previous_failure) == ("T", "C", ["fingerprint", "passcode"], "mail", "token", 2, "no match")


def test_a_passcode_answer_is_wiped_once_sent(recorder):
    passcode = Answer.passcode(b"1234")
    storage = keychain.create_keychain(service="mail", prompter=lambda request: passcode, attempts_per_read=2,
                                       socket=recorder.socket)
    with pytest.raises(KeychainError):
        storage.get_item("token")
    assert recorder.take()[1] == GOLDEN_ANSWERS["passcode"]
    assert passcode.secret == bytearray(4)


def test_a_storage_naming_no_service_says_so_so_keychaind_gives_a_confined_caller_its_app_id(recorder, monkeypatch):
    from keychain._wire import Message
    monkeypatch.setenv("KEYCHAIN_APP_ID", "org.example.App")
    for storage in (keychain.create_keychain(prompter=None, socket=recorder.socket),
                    keychain.create_keychain(service="mail", prompter=None, socket=recorder.socket)):
        with pytest.raises(KeychainError):
            storage.has_item("token")
    options = [Message.decode(Message.decode(bytes.fromhex(frame)).bytes(1)) for frame in recorder.take()]
    assert [o.string(1) for o in options] == ["org.example.App", "mail"]
    assert [o.bool(9) for o in options] == [True, None], "serviceIsDefault only where no service was named"
