"""Where keychaind is, who may serve it, and its frames on a connected socket (blocking and asyncio).

The rule is the Swift library's (`DaemonSocket.resolve`, docs/daemon.md "Callers"); the failures
are worded as `WireFailure` words them, so a Python caller sees what a Swift caller sees.
"""
from __future__ import annotations

import asyncio
import os
import pwd
import socket
import struct
import threading
from typing import Awaitable, Dict, Generator, List, Optional, Tuple, TypeVar, cast

T = TypeVar("T")

from . import _wire as w
from ._errors import ErrorCode, KeychainError

SYSTEM_SOCKET = "/run/keychain/keychaind.sock"
SERVICE_USER = "keychaind"
#: How long a reply may take (keychaind bounds its own TPM commands), and a started frame may stall.
REPLY_TIMEOUT, STALL_TIMEOUT = 120, 10
MAX_IDLE = 16


def resolve_socket(explicit: Optional[str] = None) -> str:
    """`explicit`, else KEYCHAIN_SOCKET when set and not empty, else the system's socket.

    - Important: KEYCHAIN_STORE (a store in the process, for the Swift library) cannot be served
      here: without KEYCHAIN_SOCKET it is HARDWARE_UNAVAILABLE rather than another store.
    """
    if explicit:
        return explicit
    variable = os.environ.get("KEYCHAIN_SOCKET")
    if variable:
        return variable
    if os.environ.get("KEYCHAIN_STORE"):
        raise KeychainError(ErrorCode.HARDWARE_UNAVAILABLE,
                            "KEYCHAIN_STORE names a store in the process, which this package cannot open: it speaks to "
                            "keychaind only; set KEYCHAIN_SOCKET to keychaind's socket")
    return SYSTEM_SOCKET


def _service_uid() -> Optional[int]:
    try:
        return pwd.getpwnam(SERVICE_USER).pw_uid
    except KeyError:
        return None


def _trusted(uid: int) -> bool:
    return uid == 0 or uid == os.geteuid() or uid == _service_uid()


def _peer_uid(sock: socket.socket) -> Optional[int]:
    try:
        _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return int(uid) & 0xFFFFFFFF
    except OSError:
        return None


def not_running(path: str, code: int) -> KeychainError:
    return KeychainError(ErrorCode.HARDWARE_UNAVAILABLE,
                         f"The keychain service is not running: nothing answers on {path} (start keychaind or its "
                         "socket unit; keychainctl --direct uses a store without the service)", f"errno {code}")


def check_peer(sock: socket.socket, path: str) -> None:
    """Refuses a listener whose uid may not serve the keychain, before anything is sent."""
    uid = _peer_uid(sock)
    if uid is not None and _trusted(uid):
        return
    sock.close()
    service = _service_uid()
    who = f"the user {SERVICE_USER} (uid {service})" if service is not None else f"the user {SERVICE_USER}"
    owner = f"uid {uid}" if uid is not None else "an unknown uid"
    raise KeychainError(ErrorCode.HARDWARE_UNAVAILABLE,
                        f"The keychain service at {path} is not trusted: its socket belongs to {owner}, and only root, "
                        f"this user (uid {os.geteuid()}) or {who} may serve the keychain; nothing was sent (point "
                        "KEYCHAIN_SOCKET at keychaind's socket)")


def exchange_failure(error: w.WireError, path: str) -> KeychainError:
    """An exchange on a connected socket failed (`WireFailure(exchanging:)`)."""
    if error.kind in ("closed", "truncated"):
        message = (f"The keychain service stopped during the call ({path}): the call may or may not have taken effect; "
                   "check and retry")
    elif error.kind == "timedOut":
        message = f"The keychain service did not answer within {REPLY_TIMEOUT} s ({path})"
    elif error.kind == "io":
        message = (f"The keychain service closed the connection ({path}): it may be at its connection limit or "
                   "stopping; the call may or may not have taken effect; check and retry")
    else:
        return KeychainError(ErrorCode.INTERNAL, f"The keychain service's reply does not decode: {error.detail}")
    return KeychainError(ErrorCode.HARDWARE_UNAVAILABLE, message, error.detail)


def _length(header: bytearray) -> int:
    length = int.from_bytes(header[:4], "big")
    if length < 2 or length > w.MAX_MESSAGE:
        raise w.WireError("badLength", f"frame length {length}")
    return length


class Unread(Exception):
    """A kept connection that keychaind had closed before it read the request: send it again, once."""


def _send_failure(error: Exception, reused: bool) -> Exception:
    """What a failed send means: on a kept connection, EPIPE or ECONNRESET is keychaind having closed it unread."""
    if isinstance(error, (BrokenPipeError, ConnectionResetError)) and reused:
        return Unread()
    if isinstance(error, (socket.timeout, asyncio.TimeoutError)):
        return w.WireError("timedOut", "the peer stopped reading")
    return w.WireError("io", f"write failed: errno {getattr(error, 'errno', 0)}")


def _receive_failure(error: Exception, first: bool, reused: bool) -> Exception:
    """What a failed read means: a reset before the reply's first byte on a kept connection is a request not read."""
    if isinstance(error, (socket.timeout, asyncio.TimeoutError)):
        return w.WireError("timedOut", "no message within the timeout")
    if isinstance(error, ConnectionResetError) and first and reused:
        return Unread()
    return w.WireError("io", f"read failed: errno {getattr(error, 'errno', 0)}")


def _ended(first: bool, reused: bool) -> Exception:
    """The peer closed: before the reply on a kept connection, it never read the request."""
    if first and reused:
        return Unread()
    return w.WireError("closed" if first else "truncated", "the peer closed the connection")


def read_frame() -> Generator[Tuple[memoryview, int, bool], int, bytearray]:
    """One frame's reads, without I/O: yields (where, timeout, first) and is sent how many bytes arrived
    (never 0); returns the message. A short reply's length and body arrive in one read."""
    head = bytearray(4096)
    view = memoryview(head)
    got = yield (view, REPLY_TIMEOUT, True)
    while got < 4:
        got += yield (view[got:], STALL_TIMEOUT, False)
    try:
        length = _length(head)
        if got > 4 + length:
            raise w.WireError("malformed", "bytes past the reply")
        body = bytearray(length)
        kept = min(length, got - 4)
        body[:kept] = view[4:4 + kept]
    finally:
        w.wipe(head)
    body_view = memoryview(body)
    while kept < length:
        kept += yield (body_view[kept:], STALL_TIMEOUT, False)
    return body


# ------------------------------------------------------------------------------------------------
# Blocking.

class Connection:
    """A connected socket and who connected it (keychaind knows a connection by its credentials at connect)."""

    __slots__ = ("sock", "identity", "reused")

    def __init__(self, sock: socket.socket, identity: Tuple[int, int]) -> None:
        self.sock, self.identity, self.reused = sock, identity, False

    @classmethod
    def open(cls, path: str) -> "Connection":
        identity = (os.geteuid(), os.getegid())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
        except OSError as error:
            sock.close()
            raise not_running(path, error.errno or 0) from None
        check_peer(sock, path)
        return cls(sock, identity)

    def exchange(self, frame: bytearray) -> bytearray:
        """Sends a frame and reads keychaind's next message (the caller wipes it)."""
        try:
            self.sock.settimeout(STALL_TIMEOUT)
            self.sock.sendall(frame)
        except OSError as error:
            raise _send_failure(error, self.reused) from None
        reads = read_frame()
        where, timeout, first = next(reads)
        try:
            while True:
                try:
                    self.sock.settimeout(timeout)
                    got = self.sock.recv_into(where)
                except OSError as error:
                    raise _receive_failure(error, first, self.reused) from None
                if got == 0:
                    raise _ended(first, self.reused)
                where, timeout, first = reads.send(got)
        except StopIteration as done:
            return cast(bytearray, done.value)

    def close(self) -> None:
        self.sock.close()


class Pool:
    """Connections whose last call completed, per socket and identity (at most `MAX_IDLE` each)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: Dict[Tuple[str, int, int], List[Connection]] = {}

    def take(self, path: str) -> Connection:
        identity = (os.geteuid(), os.getegid())
        with self._lock:
            kept = self._idle.get((path,) + identity)
            connection = kept.pop() if kept else None
        if connection is not None:
            connection.reused = True
            return connection
        return Connection.open(path)

    def release(self, path: str, connection: Connection, complete: bool) -> None:
        """Kept for a later call after a complete exchange; closed otherwise (the stream may be out of step)."""
        if not complete:
            connection.close()
            return
        connection.reused = False
        with self._lock:
            kept = self._idle.setdefault((path,) + connection.identity, [])
            if len(kept) < MAX_IDLE:
                kept.append(connection)
                return
        connection.close()

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for kept in idle.values():
            for connection in kept:
                connection.close()


POOL = Pool()
# A forked child must not share its parent's kept connections (two processes' exchanges on one stream
# would interleave): it starts with none, closing only its own copies of the descriptors.
os.register_at_fork(after_in_child=POOL.clear)


# ------------------------------------------------------------------------------------------------
# asyncio: the same frames on a non-blocking socket, through the loop.

async def _within(awaitable: Awaitable[T], seconds: float) -> T:
    """`awaitable` bounded by `seconds` (asyncio.TimeoutError after them); asyncio.timeout where there is one,
    which starts no task per wait as wait_for does."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


class AsyncConnection:
    __slots__ = ("sock", "identity", "reused")

    def __init__(self, sock: socket.socket, identity: Tuple[int, int]) -> None:
        self.sock, self.identity, self.reused = sock, identity, False

    @classmethod
    async def open(cls, path: str) -> "AsyncConnection":
        loop = asyncio.get_running_loop()
        identity = (os.geteuid(), os.getegid())
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            await loop.sock_connect(sock, path)
        except OSError as error:
            sock.close()
            raise not_running(path, error.errno or 0) from None
        check_peer(sock, path)
        return cls(sock, identity)

    async def exchange(self, frame: bytearray) -> bytearray:
        loop = asyncio.get_running_loop()
        try:
            await _within(loop.sock_sendall(self.sock, frame), STALL_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as error:
            raise _send_failure(error, self.reused) from None
        reads = read_frame()
        where, timeout, first = next(reads)
        try:
            while True:
                try:
                    got = await _within(loop.sock_recv_into(self.sock, where), timeout)
                except (OSError, asyncio.TimeoutError) as error:
                    raise _receive_failure(error, first, self.reused) from None
                if got == 0:
                    raise _ended(first, self.reused)
                where, timeout, first = reads.send(got)
        except StopIteration as done:
            return cast(bytearray, done.value)

    def close(self) -> None:
        self.sock.close()


class AsyncPool:
    """As `Pool`, for one event loop (a socket is used by the loop that made it)."""

    def __init__(self) -> None:
        self._idle: Dict[Tuple[str, int, int], List[AsyncConnection]] = {}

    async def take(self, path: str) -> AsyncConnection:
        kept = self._idle.get((path, os.geteuid(), os.getegid()))
        if kept:
            connection = kept.pop()
            connection.reused = True
            return connection
        return await AsyncConnection.open(path)

    def release(self, path: str, connection: AsyncConnection, complete: bool) -> None:
        if not complete:
            connection.close()
            return
        connection.reused = False
        kept = self._idle.setdefault((path,) + connection.identity, [])
        if len(kept) < MAX_IDLE:
            kept.append(connection)
        else:
            connection.close()
