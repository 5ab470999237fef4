"""A backend for Python's `keyring`: its passwords kept by keychaind, where no session bus exists.

keyring's service is the storage's service and its username the item's key, so a program that uses
`keyring` and one that uses `create_keychain(service=…)` see the same items. Selected by its entry
point (`keyring.backends`: ``keychaind``) when keychaind's socket is there (KEYCHAIN_SOCKET, or
/run/keychain/keychaind.sock), above the Secret Service's priority; or by name:
``PYTHON_KEYRING_BACKEND=keychain.keyring_backend.KeychainBackend``.

Properties (``KEYRING_PROPERTY_ACCESSIBLE``, ``KEYRING_PROPERTY_ACCESS_CONTROL`` or
``with_properties(access_control="passcode")``) set the protection of the passwords it writes.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from keyring import backend, credentials, errors

from ._client import Keychain
from ._errors import KeychainError
from ._socket import SYSTEM_SOCKET


class _ClassProperty:
    """keyring reads a backend's `priority` on the class (its own helper is internal, and moved between versions)."""

    def __init__(self, getter: Callable[[Any], float]) -> None:
        self.getter = getter

    def __get__(self, instance: Any, owner: Any) -> float:
        return self.getter(owner)


class KeychainBackend(backend.KeyringBackend):  # type: ignore[misc]
    """Passwords in keychaind (Keychain for Linux): TPM-sealed, per user, no session bus needed."""

    #: Set by keyring's properties: the seed's strings ('whenUnlocked', 'passcode', …).
    accessible: Optional[str] = None
    access_control: Optional[str] = None
    #: keychaind's socket (``KEYRING_PROPERTY_SOCKET``); None: KEYCHAIN_SOCKET, else the system's.
    socket: Optional[str] = None

    @_ClassProperty
    def priority(cls) -> float:
        """Above the Secret Service's 5 where keychaind's socket is; not viable elsewhere."""
        if os.environ.get("KEYCHAIN_SOCKET") or os.path.exists(SYSTEM_SOCKET):
            return 6.0
        raise RuntimeError(f"no keychaind: KEYCHAIN_SOCKET is not set and {SYSTEM_SOCKET} does not exist")

    @property
    def name(self) -> str:
        return "keychain.keyring_backend keychaind (Keychain for Linux)"

    def _storage(self, service: str) -> Keychain:
        options: Dict[str, Any] = {}
        if self.accessible:
            options["accessible"] = self.accessible
        if self.access_control:
            options["access_control"] = self.access_control
        return Keychain(service=service, socket=self.socket, **options)

    def get_password(self, service: str, username: str) -> Optional[str]:
        try:
            return self._storage(service).get_item(username)
        except KeychainError as error:
            raise errors.KeyringError(str(error)) from error

    def set_password(self, service: str, username: str, password: str) -> None:
        try:
            self._storage(service).set_item(username, password)
        except KeychainError as error:
            raise errors.PasswordSetError(str(error)) from error

    def delete_password(self, service: str, username: str) -> None:
        try:
            storage = self._storage(service)
            if not storage.has_item(username):
                raise errors.PasswordDeleteError("Password not found")
            storage.remove_item(username)
        except KeychainError as error:
            raise errors.PasswordDeleteError(str(error)) from error

    def get_credential(self, service: str, username: Optional[str]) -> Optional[credentials.Credential]:
        """The password of `username`, or with no username the first of the service's (keys sorted)."""
        try:
            storage = self._storage(service)
            if username is None:
                keys = storage.get_all_keys()
                if not keys:
                    return None
                username = keys[0]
            password = storage.get_item(username)
        except KeychainError as error:
            raise errors.KeyringError(str(error)) from error
        return None if password is None else credentials.SimpleCredential(username, password)
