"""Keychain for Linux from Python: the seed's keychain API on keychaind (the TPM-backed keychain service).

    from keychain import AccessControl, Accessible, create_keychain

    vault = create_keychain(service="vault", accessible=Accessible.WHEN_UNLOCKED_THIS_DEVICE_ONLY,
                            access_control=AccessControl.PASSCODE)
    vault.set_item("refreshToken", token)          # never prompts
    token = vault.get_item("refreshToken")         # asks for the passcode on the terminal

Pure Python over keychaind's socket (KEYCHAIN_SOCKET, else /run/keychain/keychaind.sock); docs/python.md.
"""
from ._client import (AccessControlCheck, AsyncKeychain, ItemInfo, Keychain, can_use_access_control,
                      create_async_keychain, create_keychain)
from ._errors import ErrorCode, KeychainError
from ._options import MAX_VALUE_LENGTH, AccessControl, Accessible, AndroidOptions, KeyStorage, Prompt
from ._prompt import Answer, PromptRequest, TerminalPrompter



def __getattr__(name: str) -> Keychain:
    """`keychain.keychain`, the seed's default storage: the application identifier as its service
    (KEYCHAIN_APP_ID, the systemd unit, the desktop file id), made at each use; INVALID_ARGUMENT without one."""
    if name == "keychain":
        return Keychain()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AccessControl", "AccessControlCheck", "Accessible", "AndroidOptions", "Answer", "AsyncKeychain", "ErrorCode",
    "ItemInfo", "KeyStorage", "Keychain", "KeychainError", "MAX_VALUE_LENGTH", "Prompt", "PromptRequest",
    "TerminalPrompter", "can_use_access_control", "create_async_keychain", "create_keychain",
]
