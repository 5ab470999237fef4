"""The application's identifier, the seed's default service (Sources/Keychain/ApplicationIdentity.swift):
KEYCHAIN_APP_ID; else the systemd unit the process runs in; else GIO_LAUNCHED_DESKTOP_FILE."""
from __future__ import annotations

import os
import re
from typing import Optional

MISSING = ("No application identifier for the default service: set KEYCHAIN_APP_ID, run the program as its systemd "
           "unit or from its desktop file, or give the storage a service (create_keychain(service=…))")


def application_identifier() -> Optional[str]:
    given = os.environ.get("KEYCHAIN_APP_ID")
    if given:
        return given
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            found = unit_application(f.read())
        if found:
            return found
    except OSError:
        pass
    desktop = os.environ.get("GIO_LAUNCHED_DESKTOP_FILE")
    if desktop:
        base = desktop.rsplit("/", 1)[-1]
        if base.endswith(".desktop") and len(base) > len(".desktop"):
            return base[:-len(".desktop")]
    return None


def unit_application(cgroup: str) -> Optional[str]:
    for line in cgroup.split("\n"):
        fields = line.split(":", 2)
        if len(fields) != 3 or not ((fields[0] == "0" and fields[1] == "") or fields[1] == "name=systemd"):
            continue
        units = [u for u in fields[2].split("/") if u.endswith(".service") or u.endswith(".scope")]
        if units:
            return _application(units[-1])
    return None


def _application(unit: str) -> Optional[str]:
    scope = unit.endswith(".scope")
    name = unit[:-len(".scope")] if scope else unit[:-len(".service")]
    if name.startswith("app-"):
        name = name[len("app-"):]
        if scope:
            if "-" not in name:
                return None
            name = name[:name.rindex("-")]
        elif "@" in name:
            name = name[:name.index("@")]
        if "-" in name:
            name = name[name.index("-") + 1:]
        return _unescaped(name) or None
    if scope or name.startswith("user@") or name.startswith("user-runtime-dir@"):
        return None
    return _unescaped(name) or None


def _unescaped(text: str) -> str:
    data = re.sub(rb"\\x([0-9a-fA-F]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8"))
    return data.decode("utf-8", "replace")
