"""Storages on keychaind: the seed's `createKeychain` and its item calls, blocking and asyncio."""
from __future__ import annotations

import asyncio
import inspect
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union, cast

from . import _options as o
from . import _socket as s
from . import _wire as w
from ._appid import MISSING, application_identifier
from ._errors import ErrorCode, KeychainError
from ._options import Accessible, AccessControl
from ._prompt import Answer, Prompter, PromptRequest, TerminalPrompter

Value = Union[str, bytes, bytearray, memoryview]
T = TypeVar("T")

#: The prompter a storage gets unless it names one (`prompter=`): the controlling terminal.
DEFAULT_PROMPTER = TerminalPrompter()
_DEFAULT: Any = object()
#: keychaind asks at most this many questions per read, whatever the client offers.
MAX_ATTEMPTS = 10
# Foundation's JSONEncoder writes a Date as seconds since 2001-01-01 UTC.
_REFERENCE_DATE = datetime(2001, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class AccessControlCheck:
    """Whether the device can protect an item with an access control now, and why not (the seed's reasons:
    'notAvailable', 'notEnrolled', 'passcodeNotSet', 'unsupportedOS'; Linux's 'unsupported', 'noPrompt')."""

    available: bool
    reason: Optional[str] = None


@dataclass(frozen=True)
class ItemInfo:
    """What is known of an item without reading its value."""

    key: str
    service: str
    accessible: Accessible
    access_control: AccessControl
    label: Optional[str]
    created: datetime
    modified: datetime
    #: 'hardwareTPM', 'softwareTPM' or 'pkcs11Token'.
    security_level: str
    token: Optional[str] = None


class _Storage:
    """A storage's checked options, encoded once, and its prompter: what both forms share."""

    def __init__(self, service: Any, accessible: Any, access_control: Any, auth_validity: Any, synchronizable: Any,
                 access_group: Any, prompt: Any, android: Any, prompter: Any, attempts_per_read: Any, socket: Optional[str],
                 unknown: Dict[str, Any]) -> None:
        # Seed: options checked at once, a misspelt one included (it would store a secret without protection).
        o.unknown_options(unknown)
        if service is not None:
            o.check_service(service)
        if access_group is not None:
            o.check_access_group(access_group)
        self.accessible = o.choice(Accessible, accessible, "accessible")
        self.access_control = o.choice(AccessControl, access_control, "accessControl")
        self.auth_validity = o.check_auth_validity(auth_validity)
        self.synchronizable = o.check_bool(synchronizable, "synchronizable")
        self.prompt = o.check_prompt(prompt)
        self.key_storage = o.check_android(android)
        o.check_protection(self.accessible, self.access_control, self.auth_validity, self.synchronizable)
        service_is_default = service is None
        if service is None:
            service = application_identifier()
            if service is None:
                raise KeychainError.invalid_argument(MISSING)
            o.check_service(service)
        if isinstance(attempts_per_read, bool) or not isinstance(attempts_per_read, int) or attempts_per_read < 1:
            raise KeychainError.invalid_argument(
                f"Invalid attempts_per_read: expected a whole number, 1 or more, got {o.describe(attempts_per_read)}")
        if prompter is not None and prompter is not _DEFAULT and not callable(prompter):
            raise KeychainError.invalid_argument(f"Invalid prompter: expected a callable or None, got {o.describe(prompter)}")
        self.service, self.access_group = service, access_group
        self.prompter: Optional[Prompter] = DEFAULT_PROMPTER if prompter is _DEFAULT else prompter
        self.attempts = min(attempts_per_read, MAX_ATTEMPTS)
        self.explicit_socket = socket
        self.options = bytes(w.storage_options(service, self.accessible.value, self.access_control.value,
                                               self.auth_validity, self.synchronizable, access_group, self.prompt,
                                               self.key_storage.value, service_is_default))

    @property
    def socket(self) -> str:
        return s.resolve_socket(self.explicit_socket)

    def request(self, op: int, key: Any = None, *more: Tuple[int, Any]) -> bytearray:
        fields: List[Tuple[int, Any]] = [(w.T_OPTIONS, self.options)]
        if key is not None:
            fields.append((w.T_KEY, o.check_key(key)))
        fields.extend(more)
        return w.encode(op, fields, framed=True)

    def set_request(self, key: Any, value: Any, accessible: Any, access_control: Any, auth_validity: Any, label: Any,
                    synchronizable: Any) -> bytearray:
        data = value.encode("utf-8") if isinstance(value, str) else value
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise KeychainError.invalid_argument(f"Invalid value: expected a string or bytes, got {o.describe(value)}")
        size = memoryview(data).nbytes
        if size > o.MAX_VALUE_LENGTH:
            raise KeychainError.invalid_argument(f"Invalid value: at most {o.MAX_VALUE_LENGTH} bytes, got {size}")
        key_bytes = o.check_key(key)
        accessible = None if accessible is None else o.choice(Accessible, accessible, "accessible")
        access_control = None if access_control is None else o.choice(AccessControl, access_control, "accessControl")
        auth_validity = None if auth_validity is None else o.check_auth_validity(auth_validity)
        synchronizable = None if synchronizable is None else o.check_bool(synchronizable, "synchronizable")
        label = o.check_label(label)
        o.check_protection(accessible or self.accessible, access_control or self.access_control,
                           self.auth_validity if auth_validity is None else auth_validity,
                           self.synchronizable if synchronizable is None else synchronizable)
        return w.encode(w.SET_ITEM, [
            (w.T_OPTIONS, self.options), (w.T_KEY, key_bytes), (w.T_VALUE, memoryview(data).cast("B")),
            (w.T_ACCESSIBLE, w.text(accessible and accessible.value)),
            (w.T_ACCESS_CONTROL, w.text(access_control and access_control.value)),
            (w.T_AUTH_VALIDITY, None if auth_validity is None else w.uint(auth_validity)),
            (w.T_LABEL, w.text(label)), (w.T_SYNCHRONIZABLE, w.boolean(synchronizable))], framed=True)

    def get_request(self, key: Any, prompt: Any) -> bytearray:
        prompt = o.check_prompt(prompt)
        return self.request(w.GET_ITEM, key, (w.T_PROMPT, w.prompt_fields(prompt)),
                            (w.T_ATTEMPTS, None if self.prompter is None else w.uint(self.attempts)))

    def can_use_request(self, value: Any) -> Tuple[bytearray, AccessControl]:
        value = o.choice(AccessControl, value, "accessControl")
        return self.request(w.STORAGE_CAN_USE, None, (w.T_ACCESS_CONTROL, w.text(value.value))), value

    def reach(self, value: AccessControl, check: AccessControlCheck) -> AccessControlCheck:
        """`noPrompt` when the device can give `value` but the prompter reaches no one (the Swift library's rule)."""
        return _reach(self.prompter, value, check)


def _reach(prompter: Optional[Prompter], value: AccessControl, check: AccessControlCheck) -> AccessControlCheck:
    reachable = getattr(prompter, "reachable", None)
    if check.available and value != AccessControl.NONE and callable(reachable) and reachable() is not None:
        return AccessControlCheck(False, "noPrompt")
    return check


# Readers of an ok reply (run before its buffer is wiped: they copy what they keep).

def _value(reply: w.Message) -> Optional[bytearray]:
    data = reply.bytes(w.T_RESULT_BYTES)
    return None if data is None else bytearray(data)


def _bool(reply: w.Message) -> bool:
    value = reply.bool(w.T_RESULT_BOOL)
    if value is None:
        raise KeychainError(ErrorCode.INTERNAL, "The keychain service's reply has no boolean result")
    return value


def _nothing(reply: w.Message) -> None:
    return None


def _keys(reply: w.Message) -> List[str]:
    keys = reply.json(w.T_RESULT_JSON)
    if not isinstance(keys, list):
        raise KeychainError(ErrorCode.INTERNAL, "The keychain service's reply has no list of keys")
    return keys


def _check(reply: w.Message) -> AccessControlCheck:
    found = reply.json(w.T_RESULT_JSON)
    if not isinstance(found, dict) or not isinstance(found.get("available"), bool):
        raise KeychainError(ErrorCode.INTERNAL, "The keychain service's reply has no result")
    return AccessControlCheck(found["available"], found.get("reason"))


def _date(value: Any) -> datetime:
    return _REFERENCE_DATE + timedelta(seconds=float(value))


def _info(reply: w.Message) -> Optional[ItemInfo]:
    found = reply.json(w.T_RESULT_JSON)
    if found is None:
        return None
    try:
        return ItemInfo(found["key"], found["service"], Accessible(found["accessible"]), AccessControl(found["accessControl"]),
                        found.get("label"), _date(found["created"]), _date(found["modified"]), found["securityLevel"],
                        found.get("token"))
    except (KeyError, ValueError, TypeError) as error:
        raise KeychainError(ErrorCode.INTERNAL, f"The keychain service's reply does not decode: {error}") from None


def _text(key: str, data: Optional[bytearray]) -> Optional[str]:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise KeychainError.invalid_argument(f"Item '{key}' holds bytes that are not UTF-8 text: read it with get_data") from None
    finally:
        w.wipe(data)


# ------------------------------------------------------------------------------------------------
# The blocking form.

def _run(path: str, request: bytearray, wants: Callable[[w.Message], Any], prompter: Optional[Prompter]) -> Any:
    """One call: the request on a kept connection (sent again once on a new one when keychaind had
    closed the kept one unread), the prompts answered, the result or keychaind's error."""
    conversation = w.converse(wants)
    connection: Optional[s.Connection] = None
    complete, raised = False, None
    try:
        connection = s.POOL.take(path)
        step = conversation.send(None)
        frame, first = request, True
        while True:
            if step[0] == "send":
                frame = step[1] if not first else request
                try:
                    reply = connection.exchange(frame)
                except s.Unread:
                    connection.close()
                    connection = s.Connection.open(path)
                    reply = connection.exchange(frame)
                finally:
                    w.wipe(frame)
                first = False
                step = conversation.send(reply)
            else:
                try:
                    answer = _ask(prompter, step[1])
                except BaseException as error:  # the callback's own failure, raised once keychaind has ended the read
                    raised, answer = error, Answer.INTERRUPTED
                step = conversation.send(answer)
    except StopIteration as done:
        complete = True
        outcome = done.value
    except w.WireError as error:
        raise s.exchange_failure(error, path) from None
    finally:
        w.wipe(request)
        if connection is not None:
            s.POOL.release(path, connection, complete)
    return _result(outcome, raised)


def _result(outcome: Any, raised: Optional[BaseException]) -> Any:
    """A call's end: the prompter's own exception first, then keychaind's error, else the result."""
    if raised is not None:
        raise raised
    if isinstance(outcome, KeychainError):
        raise outcome
    return outcome


def _ask(prompter: Optional[Prompter], question: PromptRequest) -> Optional[Answer]:
    if prompter is None:
        return Answer.INTERRUPTED
    answer = prompter(question)
    if inspect.isawaitable(answer):
        raise TypeError("a coroutine prompter needs the asyncio form (create_async_keychain)")
    return cast(Optional[Answer], answer)


class _Options:
    """A storage's options as both forms take them (checked at once: `_Storage`)."""

    def __init__(self, *, service: Optional[str] = None, accessible: o.AccessibleLike = Accessible.AFTER_FIRST_UNLOCK,
                 access_control: o.AccessControlLike = AccessControl.NONE, auth_validity: int = 0,
                 synchronizable: bool = False, access_group: Optional[str] = None, prompt: Optional[o.PromptLike] = None,
                 android: Any = None, prompter: Optional[Prompter] = _DEFAULT, attempts_per_read: int = 3,
                 socket: Optional[str] = None, **unknown: Any) -> None:
        self._storage = _Storage(service, accessible, access_control, auth_validity, synchronizable, access_group, prompt,
                                 android, prompter, attempts_per_read, socket, unknown)

    @property
    def service(self) -> str:
        return str(self._storage.service)


class Keychain(_Options):
    """A storage: one service and its defaults for every call (seed: `createKeychain`), on keychaind.

    Cheap to make; touches nothing until the first call. Each call blocks the calling thread until
    keychaind's reply; calls from several threads run side by side (a connection each).
    """

    def _call(self, request: bytearray, wants: Callable[[w.Message], T]) -> T:
        storage = self._storage
        try:
            path = storage.socket
        except KeychainError:
            w.wipe(request)
            raise
        return cast(T, _run(path, request, wants, storage.prompter))

    def set_item(self, key: str, value: Value, *, accessible: Optional[o.AccessibleLike] = None,
                 access_control: Optional[o.AccessControlLike] = None, auth_validity: Optional[int] = None,
                 label: Optional[str] = None, synchronizable: Optional[bool] = None) -> None:
        """Stores `value` (text as UTF-8, or bytes) under `key`, replacing any value atomically; never prompts.
        The keyword arguments override the storage's defaults for this item."""
        self._call(self._storage.set_request(key, value, accessible, access_control, auth_validity, label, synchronizable),
                   _nothing)

    def get_item(self, key: str, *, prompt: Optional[o.PromptLike] = None) -> Optional[str]:
        """The value as text (seed: getItem), or None. A read behind an access control asks the prompter."""
        return _text(key, self.get_data(key, prompt=prompt))

    def get_data(self, key: str, *, prompt: Optional[o.PromptLike] = None) -> Optional[bytearray]:
        """The value's bytes in a bytearray you can wipe (``buf[:] = bytes(len(buf))``), or None."""
        return self._call(self._storage.get_request(key, prompt), _value)

    def has_item(self, key: str) -> bool:
        """Whether the item exists; never prompts."""
        return self._call(self._storage.request(w.HAS_ITEM, key), _bool)

    def remove_item(self, key: str) -> None:
        """Removes the item; removing an absent one is not an error."""
        self._call(self._storage.request(w.REMOVE_ITEM, key), _nothing)

    def clear(self) -> None:
        """Removes every item of this storage's service."""
        self._call(self._storage.request(w.CLEAR), _nothing)

    def get_all_keys(self) -> List[str]:
        """The keys of this storage's items, sorted."""
        return self._call(self._storage.request(w.ALL_KEYS), _keys)

    def get_item_info(self, key: str) -> Optional[ItemInfo]:
        """What is known of the item without reading it (protection, label, dates), or None."""
        return self._call(self._storage.request(w.ITEM_INFO, key), _info)

    def can_use_access_control(self, value: o.AccessControlLike) -> AccessControlCheck:
        """Whether this storage's device can protect an item with `value` now; never prompts, never writes."""
        request, value = self._storage.can_use_request(value)
        return self._storage.reach(value, self._call(request, _check))


def create_keychain(*, service: Optional[str] = None, accessible: o.AccessibleLike = Accessible.AFTER_FIRST_UNLOCK,
                    access_control: o.AccessControlLike = AccessControl.NONE, auth_validity: int = 0,
                    synchronizable: bool = False, access_group: Optional[str] = None,
                    prompt: Optional[o.PromptLike] = None, android: Any = None, prompter: Optional[Prompter] = _DEFAULT,
                    attempts_per_read: int = 3, socket: Optional[str] = None, **unknown: Any) -> Keychain:
    """A storage of its own service with defaults for every call (seed: createKeychain); the options are
    checked at once (INVALID_ARGUMENT with the seed's message), keychaind is not touched."""
    return Keychain(service=service, accessible=accessible, access_control=access_control, auth_validity=auth_validity,
                    synchronizable=synchronizable, access_group=access_group, prompt=prompt, android=android,
                    prompter=prompter, attempts_per_read=attempts_per_read, socket=socket, **unknown)


def can_use_access_control(value: o.AccessControlLike, *, socket: Optional[str] = None,
                           prompter: Optional[Prompter] = _DEFAULT) -> AccessControlCheck:
    """Whether the device can protect an item with `value` now, and why not (seed: canUseAccessControl)."""
    value = o.choice(AccessControl, value, "accessControl")
    request = w.encode(w.DEVICE_CAN_USE, [(w.T_ACCESS_CONTROL, w.text(value.value))], framed=True)
    check = _run(s.resolve_socket(socket), request, _check, None)
    return _reach(DEFAULT_PROMPTER if prompter is _DEFAULT else prompter, value, check)


# ------------------------------------------------------------------------------------------------
# The asyncio form: the same conversation, driven by the loop.

_POOLS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, s.AsyncPool]" = weakref.WeakKeyDictionary()


async def _run_async(path: str, request: bytearray, wants: Callable[[w.Message], Any],
                     prompter: Optional[Prompter]) -> Any:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = s.AsyncPool()
    conversation = w.converse(wants)
    connection: Optional[s.AsyncConnection] = None
    complete, raised = False, None
    try:
        connection = await pool.take(path)
        step = conversation.send(None)
        first = True
        while True:
            if step[0] == "send":
                frame = request if first else step[1]
                try:
                    reply = await connection.exchange(frame)
                except s.Unread:
                    connection.close()
                    connection = await s.AsyncConnection.open(path)
                    reply = await connection.exchange(frame)
                finally:
                    w.wipe(frame)
                first = False
                step = conversation.send(reply)
            else:
                try:
                    answer = await _ask_async(prompter, step[1])
                except asyncio.CancelledError:
                    raise
                except BaseException as error:
                    raised, answer = error, Answer.INTERRUPTED
                step = conversation.send(answer)
    except StopIteration as done:
        complete = True
        outcome = done.value
    except w.WireError as error:
        raise s.exchange_failure(error, path) from None
    finally:
        w.wipe(request)
        if connection is not None:
            pool.release(path, connection, complete)
    return _result(outcome, raised)


async def _ask_async(prompter: Optional[Prompter], question: PromptRequest) -> Optional[Answer]:
    if prompter is None:
        return Answer.INTERRUPTED
    if inspect.iscoroutinefunction(prompter) or inspect.iscoroutinefunction(getattr(prompter, "__call__", None)):
        return cast(Optional[Answer], await prompter(question))  # type: ignore[misc]
    # A blocking prompter (the terminal) waits on a thread of the loop's executor, not on the loop.
    answer = await asyncio.get_running_loop().run_in_executor(None, prompter, question)
    return cast(Optional[Answer], await answer if inspect.isawaitable(answer) else answer)


class AsyncKeychain(_Options):
    """`Keychain`'s calls as coroutines, on the running event loop (a prompter may be a coroutine function)."""

    async def _call(self, request: bytearray, wants: Callable[[w.Message], T]) -> T:
        try:
            path = self._storage.socket
        except KeychainError:
            w.wipe(request)
            raise
        return cast(T, await _run_async(path, request, wants, self._storage.prompter))

    async def set_item(self, key: str, value: Value, *, accessible: Optional[o.AccessibleLike] = None,
                       access_control: Optional[o.AccessControlLike] = None, auth_validity: Optional[int] = None,
                       label: Optional[str] = None, synchronizable: Optional[bool] = None) -> None:
        await self._call(self._storage.set_request(key, value, accessible, access_control, auth_validity, label,
                                                   synchronizable), _nothing)

    async def get_item(self, key: str, *, prompt: Optional[o.PromptLike] = None) -> Optional[str]:
        return _text(key, await self.get_data(key, prompt=prompt))

    async def get_data(self, key: str, *, prompt: Optional[o.PromptLike] = None) -> Optional[bytearray]:
        return await self._call(self._storage.get_request(key, prompt), _value)

    async def has_item(self, key: str) -> bool:
        return await self._call(self._storage.request(w.HAS_ITEM, key), _bool)

    async def remove_item(self, key: str) -> None:
        await self._call(self._storage.request(w.REMOVE_ITEM, key), _nothing)

    async def clear(self) -> None:
        await self._call(self._storage.request(w.CLEAR), _nothing)

    async def get_all_keys(self) -> List[str]:
        return await self._call(self._storage.request(w.ALL_KEYS), _keys)

    async def get_item_info(self, key: str) -> Optional[ItemInfo]:
        return await self._call(self._storage.request(w.ITEM_INFO, key), _info)

    async def can_use_access_control(self, value: o.AccessControlLike) -> AccessControlCheck:
        request, value = self._storage.can_use_request(value)
        return self._storage.reach(value, await self._call(request, _check))


def create_async_keychain(**options: Any) -> AsyncKeychain:
    """`create_keychain`'s storage with coroutine calls (the same options, checked at once)."""
    return AsyncKeychain(**options)
