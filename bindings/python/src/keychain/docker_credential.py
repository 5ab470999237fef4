"""docker-credential-keychain: Docker's credential-helpers protocol over keychaind (issue 42 item 4).

    ~/.docker/config.json: {"credsStore": "keychain"}        # the installed docker-credential-keychain

Docker runs ``docker-credential-keychain store|get|erase|list|version``: ``store`` reads
``{"ServerURL": …, "Username": …, "Secret": …}`` on stdin, ``get`` and ``erase`` a server URL, ``list``
nothing. Each credential is one item of the service ``docker-credential`` (yours alone: keychaind keeps
each uid's items apart), its key the server URL, its value the secret, its label the username (read
without the secret, so ``list`` never prompts). The words, outputs and exit codes are those of Debian's
golang-docker-credential-helpers 0.6.4 (``docker-credential-pass``, ``-secretservice``): errors on stdout
and exit status 1, ``credentials not found in native keychain`` for a server with none, JSON written
as Go's encoder writes it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, TextIO

from ._client import Keychain
from ._errors import KeychainError

SERVICE = "docker-credential"
#: The reference helpers' version: the protocol this one speaks.
VERSION = "0.6.4"
NOT_FOUND = "credentials not found in native keychain"


class HelperError(Exception):
    """A refusal in the reference helpers' words."""


def go_json(value: Any) -> str:
    """JSON as Go's json.Encoder writes it: compact, HTML characters escaped, a newline after."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text + "\n"


def _server_url(stream: TextIO) -> str:
    url = stream.read().strip()
    if not url:
        raise HelperError("no credentials server URL")
    return url


def _credentials(stream: TextIO) -> Dict[str, str]:
    """The store request's fields, matched without regard to case as Go's decoder matches them."""
    try:
        found = json.loads(stream.read())
    except ValueError as error:
        raise HelperError(f"invalid JSON: {error}") from None
    if not isinstance(found, dict):
        raise HelperError("invalid JSON: expected an object")
    fields = {name.lower(): value for name, value in found.items()}
    credentials = {name: fields.get(name.lower()) or "" for name in ("ServerURL", "Username", "Secret")}
    if not all(isinstance(value, str) for value in credentials.values()):
        raise HelperError("invalid JSON: ServerURL, Username and Secret are strings")
    if not credentials["ServerURL"]:
        raise HelperError("no credentials server URL")
    if not credentials["Username"]:
        raise HelperError("no credentials username")
    return credentials


def run(action: str, storage: Keychain, stdin: TextIO, out: TextIO) -> None:
    if action == "store":
        credentials = _credentials(stdin)
        storage.set_item(credentials["ServerURL"], credentials["Secret"], label=credentials["Username"])
    elif action == "get":
        url = _server_url(stdin)
        secret = storage.get_item(url) if storage.has_item(url) else None
        info = storage.get_item_info(url) if secret is not None else None
        if secret is None or info is None:
            raise HelperError(NOT_FOUND)
        out.write(go_json({"ServerURL": url, "Username": info.label or "", "Secret": secret}))
    elif action == "erase":
        storage.remove_item(_server_url(stdin))
    elif action == "list":
        listed: Dict[str, str] = {}
        for key in storage.get_all_keys():
            info = storage.get_item_info(key)
            if info is not None:
                listed[key] = info.label or ""
        out.write(go_json(dict(sorted(listed.items()))))
    elif action == "version":
        out.write(f"{VERSION}\n")
    else:
        raise HelperError(f"Unknown credential action `{action}`")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="docker-credential-keychain", description="Docker's credential helper over keychaind",
                                     add_help=True)
    parser.add_argument("--access-control", default="none", help="the seed's accessControl of stored credentials")
    parser.add_argument("--accessible", default="afterFirstUnlock", help="the seed's accessible of stored credentials")
    parser.add_argument("--service", default=SERVICE, help=f"the keychain service (default {SERVICE})")
    parser.add_argument("action", nargs="?")
    args = parser.parse_args(argv)
    if args.action is None:
        print("Usage: docker-credential-keychain <store|get|erase|list|version>")
        return 1
    try:
        storage = Keychain(service=args.service, access_control=args.access_control, accessible=args.accessible)
        run(args.action, storage, sys.stdin, sys.stdout)
    except (HelperError, KeychainError) as error:
        # The reference helpers print their errors on stdout (Docker reads them there).
        print(error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
