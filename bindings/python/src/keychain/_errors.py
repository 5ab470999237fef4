"""The one error of the keychain: the seed's code, a message a person can act on, and the cause."""
from __future__ import annotations

from enum import Enum
from typing import Optional


class ErrorCode(str, Enum):
    """The seed's `KeychainErrorCode` strings, plus Linux's own (Sources/Keychain/KeychainError.swift)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    USER_CANCELED = "USER_CANCELED"
    USER_FALLBACK = "USER_FALLBACK"
    SYSTEM_CANCELED = "SYSTEM_CANCELED"
    AUTHENTICATION_FAILED = "AUTHENTICATION_FAILED"
    LOCKOUT = "LOCKOUT"
    LOCKOUT_PERMANENT = "LOCKOUT_PERMANENT"
    KEY_INVALIDATED = "KEY_INVALIDATED"
    BIOMETRY_NOT_AVAILABLE = "BIOMETRY_NOT_AVAILABLE"
    BIOMETRY_NOT_ENROLLED = "BIOMETRY_NOT_ENROLLED"
    PASSCODE_NOT_SET = "PASSCODE_NOT_SET"
    UNSUPPORTED = "UNSUPPORTED"
    MISSING_USAGE_DESCRIPTION = "MISSING_USAGE_DESCRIPTION"
    INTERACTION_NOT_ALLOWED = "INTERACTION_NOT_ALLOWED"
    DEVICE_STATE_CHANGED = "DEVICE_STATE_CHANGED"
    DATA_CORRUPTED = "DATA_CORRUPTED"
    HARDWARE_UNAVAILABLE = "HARDWARE_UNAVAILABLE"
    STORAGE_ERROR = "STORAGE_ERROR"
    INTERNAL = "INTERNAL"


class KeychainError(Exception):
    """What the keychain (keychaind, or the socket to it) reported.

    ``code`` is the seed's code string (compare it with ``ErrorCode.X`` or the string), ``message``
    the library's words, ``cause`` what failed below the keychain (a TPM or SQLite code, an errno),
    in the library's words. ``str(error)`` is ``CODE: message (cause: …)``, as the Swift library writes it.
    """

    def __init__(self, code: str, message: str = "", cause: Optional[str] = None) -> None:
        self.code = code.value if isinstance(code, ErrorCode) else code
        self.message, self.cause = message, cause
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.code}: {self.message}" if self.message else self.code
        return text + (f" (cause: {self.cause})" if self.cause else "")

    def __repr__(self) -> str:
        return f"KeychainError({self.code!r}, {self.message!r}, cause={self.cause!r})"

    @classmethod
    def invalid_argument(cls, message: str) -> "KeychainError":
        return cls(ErrorCode.INVALID_ARGUMENT, message)
