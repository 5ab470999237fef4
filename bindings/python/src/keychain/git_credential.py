"""git-credential-keychain: git's credential helper protocol over keychaind.

    git config --global credential.helper keychain            # the installed git-credential-keychain
    git config --global credential.helper "keychain --access-control passcode"

git runs ``git-credential-keychain get|store|erase`` with ``key=value`` lines on stdin. Each credential
is one item of the service ``git-credential`` (yours alone: keychaind keeps each uid's items apart),
its key ``protocol://username@host/path`` (username and path percent-encoded), its value the password.
A ``get`` without a username answers the first stored one of that protocol, host and path.
"""
from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, TextIO
from urllib.parse import quote, unquote

from ._client import Keychain
from ._errors import KeychainError

SERVICE = "git-credential"


def read_attributes(stream: TextIO) -> Dict[str, str]:
    attributes: Dict[str, str] = {}
    for line in stream:
        line = line.rstrip("\n")
        if not line:
            break
        name, _, value = line.partition("=")
        attributes[name] = value
    return attributes


def _prefix(attributes: Dict[str, str]) -> str:
    return f"{attributes.get('protocol', '')}://"


def _suffix(attributes: Dict[str, str]) -> str:
    return f"@{attributes.get('host', '')}/{quote(attributes.get('path', ''), safe='')}"


def key_of(attributes: Dict[str, str]) -> str:
    return _prefix(attributes) + quote(attributes.get("username", ""), safe="") + _suffix(attributes)


def matching(storage: Keychain, attributes: Dict[str, str]) -> List[str]:
    """The stored keys of this protocol, host and path (and username, when given)."""
    if "username" in attributes:
        key = key_of(attributes)
        return [key] if storage.has_item(key) else []
    prefix, suffix = _prefix(attributes), _suffix(attributes)
    return [k for k in storage.get_all_keys() if k.startswith(prefix) and k.endswith(suffix)
            and "@" not in k[len(prefix):len(k) - len(suffix)]]


def run(action: str, attributes: Dict[str, str], storage: Keychain, out: TextIO) -> None:
    if "protocol" not in attributes or "host" not in attributes:
        return  # git always sends both; anything else is not ours to answer
    if action == "get":
        for key in matching(storage, attributes):
            password = storage.get_item(key)
            if password is None:
                continue
            username = unquote(key[len(_prefix(attributes)):len(key) - len(_suffix(attributes))])
            out.write(f"username={username}\npassword={password}\n")
            return
    elif action == "store":
        if "username" in attributes and "password" in attributes:
            storage.set_item(key_of(attributes), attributes["password"])
    elif action == "erase":
        for key in matching(storage, attributes):
            storage.remove_item(key)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="git-credential-keychain", description="git's credential helper over keychaind")
    parser.add_argument("--access-control", default="none", help="the seed's accessControl of stored credentials")
    parser.add_argument("--accessible", default="afterFirstUnlock", help="the seed's accessible of stored credentials")
    parser.add_argument("--service", default=SERVICE, help=f"the keychain service (default {SERVICE})")
    parser.add_argument("action", help="get, store or erase (others are ignored, as git asks)")
    args = parser.parse_args(argv)
    try:
        storage = Keychain(service=args.service, access_control=args.access_control, accessible=args.accessible)
        run(args.action, read_attributes(sys.stdin), storage, sys.stdout)
    except KeychainError as error:
        print(f"git-credential-keychain: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
