"""The seed's options: `Accessible`, `AccessControl`, `Prompt`, `android.keyStorage`, and their rules.

Each check gives the seed's `INVALID_ARGUMENT` message, the Swift library's words
(Sources/Keychain/Options, Sources/KeychainStore/ItemNames.swift), before anything is sent.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable, Mapping, Optional, Type, TypeVar, Union

from ._errors import KeychainError

MAX_SERVICE_LENGTH = 256
MAX_ACCESS_GROUP_LENGTH = 256
MAX_KEY_BYTES = 1024
MAX_LABEL_BYTES = 4096
#: The largest value `set_item` stores, in bytes (16 MiB).
MAX_VALUE_LENGTH = 16 << 20


class Accessible(str, Enum):
    """When an item can be read (Apple's kSecAttrAccessible*); ``ThisDeviceOnly``: bound to this TPM."""

    WHEN_UNLOCKED = "whenUnlocked"
    AFTER_FIRST_UNLOCK = "afterFirstUnlock"
    ALWAYS = "always"
    WHEN_PASSCODE_SET_THIS_DEVICE_ONLY = "whenPasscodeSetThisDeviceOnly"
    WHEN_UNLOCKED_THIS_DEVICE_ONLY = "whenUnlockedThisDeviceOnly"
    AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY = "afterFirstUnlockThisDeviceOnly"
    ALWAYS_THIS_DEVICE_ONLY = "alwaysThisDeviceOnly"

    def __str__(self) -> str:
        return self.value

    @property
    def is_this_device_only(self) -> bool:
        return self.value.endswith("ThisDeviceOnly")


class AccessControl(str, Enum):
    """What unlocks an item: nothing, biometrics (any, or those enrolled at write time), the passcode."""

    NONE = "none"
    BIOMETRY_ANY = "biometryAny"
    BIOMETRY_CURRENT_SET = "biometryCurrentSet"
    BIOMETRY_ANY_OR_PASSCODE = "biometryAnyOrPasscode"
    BIOMETRY_CURRENT_SET_OR_PASSCODE = "biometryCurrentSetOrPasscode"
    PASSCODE = "passcode"

    def __str__(self) -> str:
        return self.value

    @property
    def is_current_set(self) -> bool:
        return self in (AccessControl.BIOMETRY_CURRENT_SET, AccessControl.BIOMETRY_CURRENT_SET_OR_PASSCODE)


class KeyStorage(str, Enum):
    """Android's ``keyStorage``: on Linux the TPM (``tee``, the default) or a PKCS#11 token (``strongbox``)."""

    TEE = "tee"
    STRONGBOX = "strongbox"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Prompt:
    """The texts of the prompt a read shows; a field left None keeps the storage's (or the system's)."""

    title: Optional[str] = None
    subtitle: Optional[str] = None
    description: Optional[str] = None
    cancel: Optional[str] = None

    def merged(self, call: Optional["Prompt"]) -> "Prompt":
        """This (the storage's) prompt with a call's fields over it, field by field (seed: createKeychain)."""
        if call is None:
            return self
        return Prompt(*(c if c is not None else s for s, c in zip(
            (self.title, self.subtitle, self.description, self.cancel),
            (call.title, call.subtitle, call.description, call.cancel))))


@dataclass(frozen=True)
class AndroidOptions:
    key_storage: KeyStorage = KeyStorage.TEE


E = TypeVar("E", Accessible, AccessControl, KeyStorage)


def describe(value: Any) -> str:
    """A value as the Swift library's "got …" words it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return "a value of another type"


def choice(enum: Type[E], value: Any, name: str) -> E:
    """`value` as the enum (its member or its seed string), or INVALID_ARGUMENT naming the valid strings."""
    if isinstance(value, enum):
        return value
    if isinstance(value, str) and not isinstance(value, Enum):
        try:
            return enum(value)
        except ValueError:
            pass
    values = ", ".join(f"'{member.value}'" for member in enum)
    raise KeychainError.invalid_argument(f"Invalid {name}: expected one of {values}, got {describe(value)}")


def utf16_length(text: str) -> int:
    """Characters as the seed's JavaScript counts them (UTF-16 code units)."""
    return len(text.encode("utf-16-le")) // 2


def check_service(service: Any) -> str:
    expected = f"a non-empty string of up to {MAX_SERVICE_LENGTH} characters"
    if not isinstance(service, str):
        raise KeychainError.invalid_argument(f"Invalid service: expected {expected}, got {describe(service)}")
    length = utf16_length(service)
    if length == 0 or length > MAX_SERVICE_LENGTH:
        got = "an empty string" if length == 0 else f"{length} characters"
        raise KeychainError.invalid_argument(f"Invalid service: expected {expected}, got {got}")
    return service


def check_access_group(group: Any) -> str:
    if not isinstance(group, str):
        raise KeychainError.invalid_argument(f"Invalid accessGroup: expected a non-empty string, got {describe(group)}")
    length = utf16_length(group)
    if length == 0:
        raise KeychainError.invalid_argument(
            "Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group")
    if length > MAX_ACCESS_GROUP_LENGTH:
        raise KeychainError.invalid_argument(
            f"Invalid accessGroup: expected a non-empty string of up to {MAX_ACCESS_GROUP_LENGTH} characters, "
            f"got {length} characters")
    return group


def check_key(key: Any) -> bytes:
    """The key's UTF-8 bytes, or the seed's message."""
    expected = f"a non-empty string of up to {MAX_KEY_BYTES} bytes"
    if not isinstance(key, str):
        raise KeychainError.invalid_argument(f"Invalid key: expected {expected}, got {describe(key)}")
    try:
        data = key.encode("utf-8")
    except UnicodeEncodeError:
        raise KeychainError.invalid_argument(f"Invalid key: expected {expected}, got a string that is not UTF-8") from None
    if not data or len(data) > MAX_KEY_BYTES:
        got = "an empty string" if not data else f"{len(data)} bytes"
        raise KeychainError.invalid_argument(f"Invalid key: expected {expected}, got {got}")
    return data


def check_label(label: Any) -> Optional[str]:
    if label is None:
        return None
    if not isinstance(label, str):
        raise KeychainError.invalid_argument(f"Invalid label: expected a string of up to {MAX_LABEL_BYTES} bytes, "
                                             f"got {describe(label)}")
    size = len(label.encode("utf-8"))
    if size > MAX_LABEL_BYTES:
        raise KeychainError.invalid_argument(f"Invalid label: expected a string of up to {MAX_LABEL_BYTES} bytes, got {size} bytes")
    return label


def check_auth_validity(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KeychainError.invalid_argument(
            f"Invalid authValidity: expected a whole number of seconds, 0 or more, got {describe(value)}")
    if value >= 1 << 63:
        raise KeychainError.invalid_argument(f"Invalid authValidity: expected a whole number of seconds, 0 or more, "
                                             f"got {value}")
    return value


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise KeychainError.invalid_argument(f"Invalid {name}: expected true or false, got {describe(value)}")
    return value


def check_prompt(value: Any, name: str = "prompt") -> Optional[Prompt]:
    """A `Prompt`, or a mapping of its fields (unknown fields are an error, as the seed's options are)."""
    if value is None or isinstance(value, Prompt):
        return value
    if not isinstance(value, Mapping):
        raise KeychainError.invalid_argument(
            f"Invalid {name}: expected an object with the keys title, subtitle, description, cancel, got {describe(value)}")
    unknown_options([f"{name}.{key}" for key in value if key not in ("title", "subtitle", "description", "cancel")])
    for key, text in value.items():
        if text is not None and not isinstance(text, str):
            raise KeychainError.invalid_argument(f"Invalid {name}.{key}: expected a string, got {describe(text)}")
    return Prompt(**value)


def check_android(value: Any) -> KeyStorage:
    if value is None:
        return KeyStorage.TEE
    if isinstance(value, AndroidOptions):
        return choice(KeyStorage, value.key_storage, "android.keyStorage")
    if not isinstance(value, Mapping):
        raise KeychainError.invalid_argument(f"Invalid android: expected an object with the key keyStorage, got {describe(value)}")
    unknown_options([f"android.{key}" for key in value if key not in ("keyStorage", "key_storage")])
    found = value.get("keyStorage", value.get("key_storage"))
    return KeyStorage.TEE if found is None else choice(KeyStorage, found, "android.keyStorage")


def unknown_options(names: Iterable[str]) -> None:
    names = sorted(names)
    if len(names) == 1:
        raise KeychainError.invalid_argument(f"Invalid keychain options: unknown option '{names[0]}'")
    if names:
        listed = ", ".join(f"'{name}'" for name in names)
        raise KeychainError.invalid_argument(f"Invalid keychain options: unknown options {listed}")


_MOVABLE = {
    Accessible.WHEN_UNLOCKED_THIS_DEVICE_ONLY: Accessible.WHEN_UNLOCKED,
    Accessible.AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY: Accessible.AFTER_FIRST_UNLOCK,
    Accessible.ALWAYS_THIS_DEVICE_ONLY: Accessible.ALWAYS,
}


def check_protection(accessible: Accessible, access_control: AccessControl, auth_validity: int, synchronizable: bool) -> None:
    """The seed's rules of one write's protection (Swift's `ItemProtection`), in the same order and words."""
    if auth_validity > 0 and access_control.is_current_set:
        other = (AccessControl.BIOMETRY_ANY if access_control == AccessControl.BIOMETRY_CURRENT_SET
                 else AccessControl.BIOMETRY_ANY_OR_PASSCODE)
        raise KeychainError.invalid_argument(
            f"accessControl '{access_control.value}' can't be used with authValidity > 0 (got {auth_validity}): "
            f"set authValidity to 0, or use '{other.value}' to allow a window")
    if synchronizable and accessible.is_this_device_only:
        movable = _MOVABLE.get(accessible)
        fix = (f"set synchronizable to false, or use accessible '{movable.value}'" if movable
               else "set synchronizable to false")
        raise KeychainError.invalid_argument(
            f"synchronizable can't be used with accessible '{accessible.value}': "
            f"a ThisDeviceOnly item never leaves this device; {fix}")
    if synchronizable and access_control != AccessControl.NONE:
        raise KeychainError.invalid_argument(
            f"synchronizable can't be used with accessControl '{access_control.value}': "
            "an item behind authentication never leaves this device; set synchronizable to false, or use accessControl 'none'")


AccessibleLike = Union[Accessible, str]
AccessControlLike = Union[AccessControl, str]
PromptLike = Union[Prompt, Mapping[str, Optional[str]]]
