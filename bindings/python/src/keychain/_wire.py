"""keychaind's protocol, version 2 (docs/daemon.md, "The protocol"; Sources/KeychainWire is the definition).

A frame is a 4-byte big-endian length, then the message: ``[version 2][kind]`` and fields
``[tag][4-byte big-endian length][bytes]`` in strictly increasing tag order. Integers are 8-byte
big-endian, booleans one byte, text UTF-8; a storage's options and prompt texts are nested messages
of kind 0. No I/O here: the blocking and asyncio clients drive `converse`.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, Generator, Optional, Sequence, Tuple, Union

from ._errors import KeychainError

VERSION = 2
MAX_MESSAGE = 16 * 1024 * 1024 + 64 * 1024

# Request kinds (WireOp).
SET_ITEM, GET_ITEM, HAS_ITEM, REMOVE_ITEM, CLEAR, ALL_KEYS, ITEM_INFO, STORAGE_CAN_USE = range(1, 9)
DEVICE_CAN_USE = 25

# Other kinds (WireKind).
FIELDS, OK, ERROR, PROMPT, ANSWER = 0, 0x80, 0x81, 0x82, 0x83

# Field tags (WireTag).
T_OPTIONS, T_KEY, T_VALUE = 1, 2, 3
T_ACCESSIBLE, T_ACCESS_CONTROL, T_AUTH_VALIDITY, T_LABEL, T_SYNCHRONIZABLE = 4, 5, 6, 7, 8
T_PROMPT, T_ATTEMPTS = 9, 10
T_RESULT_BYTES, T_RESULT_BOOL, T_RESULT_JSON = 20, 21, 22
T_ERROR_CODE, T_ERROR_MESSAGE, T_CAUSE_KIND, T_CAUSE_NUMBER, T_CAUSE_TEXT = 30, 31, 32, 33, 34
T_PROMPT_TEXTS, T_METHODS, T_SERVICE, T_PROMPT_KEY, T_ATTEMPT, T_PREVIOUS_FAILURE = 40, 41, 42, 43, 44, 45
T_ANSWER_KIND, T_ANSWER_FINGER, T_ANSWER_PASSCODE, T_ANSWER_REASON = 50, 51, 52, 53

# Answer kinds (WirePromptAnswer.Kind).
A_FINGER, A_PASSCODE, A_CANCEL, A_FALLBACK, A_INTERRUPTED, A_UNAVAILABLE = range(6)

Bytes = Union[bytes, bytearray, memoryview]
Field = Tuple[int, Bytes]


class WireError(Exception):
    """A frame or message that does not decode (the clients word it as `KeychainError`)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def uint(value: int) -> bytes:
    return (value & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big")


def encode(kind: int, fields: Sequence[Tuple[int, Optional[Bytes]]], framed: bool = False) -> bytearray:
    """A message (a frame when `framed`): fields whose bytes are None are left out."""
    present = [(tag, data) for tag, data in fields if data is not None]
    length = 2 + sum(5 + len(data) for _, data in present)
    out = bytearray()
    if framed:
        out += length.to_bytes(4, "big")
    out += bytes((VERSION, kind))
    last = -1
    for tag, data in present:
        assert tag > last, "fields in increasing tag order"
        last = tag
        out.append(tag)
        out += len(data).to_bytes(4, "big")
        out += data
    return out


def text(value: Optional[str]) -> Optional[bytes]:
    return None if value is None else value.encode("utf-8")


def boolean(value: Optional[bool]) -> Optional[bytes]:
    return None if value is None else (b"\x01" if value else b"\x00")


class Message:
    """A decoded message: its kind and its fields, views into the caller's buffer (wipe that, not these)."""

    __slots__ = ("kind", "fields")

    def __init__(self, kind: int, fields: Dict[int, memoryview]) -> None:
        self.kind, self.fields = kind, fields

    @classmethod
    def decode(cls, data: Union[bytearray, memoryview, bytes]) -> "Message":
        view = memoryview(data)
        if len(view) < 2:
            raise WireError("malformed", "message shorter than its header")
        if view[0] != VERSION:
            raise WireError("version", f"protocol version {view[0]}, this side speaks {VERSION}")
        fields, at, last = {}, 2, -1
        while at < len(view):
            if len(view) - at < 5:
                raise WireError("malformed", f"field header cut at byte {at}")
            tag, length = view[at], int.from_bytes(view[at + 1:at + 5], "big")
            at += 5
            if length > len(view) - at:
                raise WireError("malformed", f"field {tag} runs past the message")
            if tag <= last:
                raise WireError("malformed", f"field {tag} out of order or repeated")
            fields[tag], last = view[at:at + length], tag
            at += length
        return cls(view[1], fields)

    def bytes(self, tag: int) -> Optional[memoryview]:
        return self.fields.get(tag)

    def string(self, tag: int) -> Optional[str]:
        data = self.fields.get(tag)
        if data is None:
            return None
        try:
            return str(data, "utf-8")
        except UnicodeDecodeError:
            raise WireError("malformed", f"field {tag} is not UTF-8") from None

    def uint(self, tag: int) -> Optional[int]:
        data = self.fields.get(tag)
        if data is None:
            return None
        if len(data) != 8:
            raise WireError("malformed", f"field {tag} is not an 8-byte integer")
        return int.from_bytes(data, "big")

    def bool(self, tag: int) -> Optional[bool]:
        data = self.fields.get(tag)
        if data is None:
            return None
        if len(data) != 1 or data[0] > 1:
            raise WireError("malformed", f"field {tag} is not a boolean")
        return bool(data[0] == 1)

    def json(self, tag: int) -> Any:
        data = self.fields.get(tag)
        if data is None:
            return None
        try:
            return json.loads(str(data, "utf-8"))
        except ValueError as error:
            raise WireError("malformed", f"a result field does not decode: {error}") from None


def prompt_fields(prompt: Any) -> Optional[bytearray]:
    """A `Prompt` as the nested message a field carries (WirePrompt), None for no prompt."""
    if prompt is None:
        return None
    return encode(FIELDS, [(1, text(prompt.title)), (2, text(prompt.subtitle)), (3, text(prompt.description)),
                           (4, text(prompt.cancel))])


def storage_options(service: str, accessible: str, access_control: str, auth_validity: int, synchronizable: bool,
                    access_group: Optional[str], prompt: Any, key_storage: str, service_is_default: bool = False) -> bytearray:
    """The storage's options as requests carry them (WireStorageOptions): every field, as the library sends.
    `service_is_default`: the caller named no service (keychaind gives a confined caller its application id)."""
    return encode(FIELDS, [(1, text(service)), (2, text(accessible)), (3, text(access_control)),
                           (4, uint(auth_validity)), (5, boolean(synchronizable)), (6, text(access_group)),
                           (7, prompt_fields(prompt)), (8, text(key_storage)),
                           (9, boolean(True) if service_is_default else None)])


CAUSE_KINDS = {0: "tpm", 1: "sqlite", 2: "errno", 3: "pkcs11", 4: "other"}


def error_from(reply: Message) -> KeychainError:
    """An error reply (code, message, cause) as the library words it (WireErrorReply, WireCause.description)."""
    code = reply.string(T_ERROR_CODE)
    if code is None:
        raise WireError("malformed", "error without a code")
    number = reply.uint(T_CAUSE_NUMBER) or 0
    detail = reply.string(T_CAUSE_TEXT) or ""
    kind = reply.uint(T_CAUSE_KIND)
    cause: Optional[str]
    if kind is None:
        cause = None
    elif kind == 0:
        cause = f"TPM {detail} (0x{number & 0xFFFFFFFF:08X})"
    elif kind == 1:
        cause = f"SQLite {_signed(number, 32)}: {detail}"
    elif kind == 2:
        cause = f"errno {_signed(number, 32)}"
    elif kind == 3:
        cause = f"PKCS#11 {detail} (0x{number:08X})"
    else:
        cause = detail
    return KeychainError(code, reply.string(T_ERROR_MESSAGE) or "", cause)


def _signed(number: int, bits: int) -> int:
    number &= (1 << bits) - 1
    return number - (1 << bits) if number >> (bits - 1) else number


# The exchange, without I/O: `converse` yields ("send", frame) (None: the call's request) and is sent
# keychaind's next message (a bytearray it wipes), or yields ("ask", question) and is sent the answer.
Step = Tuple[str, Any]


def converse(wants_reply: Callable[[Message], Any]) -> Generator[Step, Any, Any]:
    """keychaind's messages until its reply: returns ``wants_reply(ok message)``, or the `KeychainError`
    of an error reply (the stream still in step); raises for anything else."""
    from ._prompt import PromptRequest, answer_frame

    buffer = yield ("send", None)
    while True:
        try:
            message = Message.decode(buffer)
            if message.kind == OK:
                return wants_reply(message)
            if message.kind == ERROR:
                return error_from(message)
            if message.kind != PROMPT:
                raise KeychainError("INTERNAL", f"The keychain service sent a reply of unknown kind {message.kind}")
            question = PromptRequest.decode(message)
        finally:
            wipe(buffer)
        answer = yield ("ask", question)
        buffer = yield ("send", answer_frame(answer))


def wipe(buffer: object) -> None:
    """Zeroes a bytearray in place (a best effort for buffers that held a secret)."""
    if isinstance(buffer, bytearray):
        buffer[:] = bytes(len(buffer))
