"""keychaind's prompts (kind 0x82) and the program's answers (0x83).

For a read behind an access control keychaind asks the caller, which answers with a passcode, a
finger (the simulated reader), or ends the prompt (cancel, fallback, interrupted, unavailable);
keychaind then runs the TPM policy itself. The default prompter is the controlling terminal.
"""
from __future__ import annotations

import os
import termios
from dataclasses import dataclass
from typing import Awaitable, Callable, List, Optional, Tuple, Union

from . import _wire as w
from ._options import Prompt


@dataclass(frozen=True)
class PromptRequest:
    """What keychaind asks: the merged prompt texts, the ways to answer, the item, the attempt (1, 2, …)."""

    prompt: Prompt
    methods: List[str]
    service: str
    key: str
    attempt: int = 1
    previous_failure: Optional[str] = None

    @classmethod
    def decode(cls, message: "w.Message") -> "PromptRequest":
        texts = message.bytes(w.T_PROMPT_TEXTS)
        prompt = Prompt()
        if texts is not None:
            nested = w.Message.decode(texts)
            if nested.kind != w.FIELDS:
                raise w.WireError("malformed", "the prompt field is not a list of fields")
            prompt = Prompt(nested.string(1), nested.string(2), nested.string(3), nested.string(4))
        methods = message.json(w.T_METHODS) or []
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            raise w.WireError("malformed", "the prompt's methods are not a list of words")
        return cls(prompt, methods, message.string(w.T_SERVICE) or "", message.string(w.T_PROMPT_KEY) or "",
                   message.uint(w.T_ATTEMPT) or 1, message.string(w.T_PREVIOUS_FAILURE))


class Answer:
    """The user's answer to a prompt. Make one with `Answer.passcode`, `Answer.finger`, or use
    `Answer.CANCEL` (USER_CANCELED), `Answer.FALLBACK` (USER_FALLBACK), `Answer.INTERRUPTED`
    (SYSTEM_CANCELED), `Answer.unavailable(reason)` (INTERACTION_NOT_ALLOWED)."""

    __slots__ = ("kind", "finger_name", "secret", "reason")
    CANCEL: "Answer"
    FALLBACK: "Answer"
    INTERRUPTED: "Answer"

    def __init__(self, kind: int, finger_name: Optional[str] = None, secret: Optional[bytearray] = None,
                 reason: Optional[str] = None) -> None:
        self.kind, self.finger_name, self.secret, self.reason = kind, finger_name, secret, reason

    @classmethod
    def passcode(cls, value: Union[str, bytes, bytearray, memoryview]) -> "Answer":
        """The device passcode; its bytes are copied into a buffer wiped once sent (wipe yours)."""
        return cls(w.A_PASSCODE, secret=bytearray(value.encode("utf-8") if isinstance(value, str) else value))

    @classmethod
    def finger(cls, name: str) -> "Answer":
        """The simulated reader reads this finger: a match if it is enrolled, no match if not."""
        return cls(w.A_FINGER, finger_name=name)

    @classmethod
    def unavailable(cls, reason: str) -> "Answer":
        return cls(w.A_UNAVAILABLE, reason=reason)

    def __repr__(self) -> str:
        names = {w.A_FINGER: "finger", w.A_PASSCODE: "passcode", w.A_CANCEL: "CANCEL", w.A_FALLBACK: "FALLBACK",
                 w.A_INTERRUPTED: "INTERRUPTED", w.A_UNAVAILABLE: "unavailable"}
        return f"Answer.{names.get(self.kind, self.kind)}"


Answer.CANCEL, Answer.FALLBACK, Answer.INTERRUPTED = Answer(w.A_CANCEL), Answer(w.A_FALLBACK), Answer(w.A_INTERRUPTED)

#: A prompt callback: asked for each question of a read; may be a coroutine function in the asyncio form.
#: Returning None is `Answer.CANCEL`.
Prompter = Callable[[PromptRequest], Union[Optional[Answer], Awaitable[Optional[Answer]]]]


def answer_frame(answer: Optional[Answer]) -> bytearray:
    """The answer frame (WirePromptAnswer); the answer's passcode buffer is wiped into it."""
    if answer is None:
        answer = Answer.CANCEL
    if not isinstance(answer, Answer):
        answer = Answer.unavailable(f"the prompt callback returned {type(answer).__name__}, not an Answer")
    fields: List[Tuple[int, Optional[w.Bytes]]] = [(w.T_ANSWER_KIND, w.uint(answer.kind))]
    if answer.kind == w.A_FINGER:
        fields.append((w.T_ANSWER_FINGER, w.text(answer.finger_name or "")))
    elif answer.kind == w.A_PASSCODE:
        fields.append((w.T_ANSWER_PASSCODE, answer.secret or bytearray()))
    elif answer.kind == w.A_UNAVAILABLE:
        fields.append((w.T_ANSWER_REASON, w.text(answer.reason or "")))
    frame = w.encode(w.ANSWER, fields, framed=True)
    if answer.secret is not None:
        w.wipe(answer.secret)
    return frame


class TerminalPrompter:
    """The default prompter: the process's controlling terminal (``/dev/tty``, as getpass and sudo ask),
    the passcode read with echo off into a buffer that is wiped once sent. Without a terminal (a
    service, a pipe, a background job) it answers `Answer.unavailable`, as the Swift library does:
    the read fails with INTERACTION_NOT_ALLOWED."""

    def __init__(self, path: str = "/dev/tty") -> None:
        self.path = path

    def _open(self) -> Tuple[Optional[int], Optional[str]]:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as error:
            return None, f"terminal: no controlling terminal ({self.path}: {error.strerror})"
        if not os.isatty(fd) or os.tcgetpgrp(fd) != os.getpgrp():
            os.close(fd)
            return None, f"terminal: this process is not in the foreground of {self.path}"
        return fd, None

    def reachable(self) -> Optional[str]:
        """None when a prompt would reach a person, else why not."""
        fd, why = self._open()
        if fd is not None:
            os.close(fd)
        return why

    def __call__(self, request: PromptRequest) -> Answer:
        fd, why = self._open()
        if fd is None:
            return Answer.unavailable(why or "no terminal")
        try:
            lines = [request.prompt.title or f"Unlock '{request.key}' of {request.service}"]
            lines += [t for t in (request.prompt.subtitle, request.prompt.description) if t]
            if request.previous_failure:
                lines.append(f"Attempt {request.attempt}: {request.previous_failure}")
            passcode = "passcode" in request.methods
            label = "Passcode" if passcode else "Finger (simulated reader)"
            cancel = request.prompt.cancel or "cancel"
            os.write(fd, ("\n" + "\n".join(_printable(t) for t in lines) + f"\n{label} (enter alone: {_printable(cancel)}): ")
                     .encode("utf-8", "replace"))
            line = _read_line(fd, echo=not passcode)
            if line is None:
                return Answer.INTERRUPTED
            if not line:
                return Answer.CANCEL
            if passcode:
                answer = Answer(w.A_PASSCODE, secret=line)
                return answer
            name = line.decode("utf-8", "replace")
            w.wipe(line)
            return Answer.finger(name)
        finally:
            os.close(fd)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _read_line(fd: int, echo: bool) -> Optional[bytearray]:
    """One line (without its newline) into a bytearray; None when the read fails (a signal)."""
    saved = None
    if not echo:
        try:
            saved = termios.tcgetattr(fd)
            silent = list(saved)
            silent[3] = (silent[3] & ~termios.ECHO) | termios.ECHONL
            termios.tcsetattr(fd, termios.TCSANOW, silent)
        except termios.error:
            saved = None
    # Filled in place (a bytearray that grows leaves copies behind in freed memory).
    buffer, length = bytearray(1024), 0
    try:
        while length < len(buffer):
            try:
                chunk = os.read(fd, 1)
            except OSError:
                w.wipe(buffer)
                return None
            if not chunk or chunk == b"\n":
                break
            buffer[length] = chunk[0]
            length += 1
        line = bytearray(memoryview(buffer)[:length])
        w.wipe(buffer)
        return line
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
