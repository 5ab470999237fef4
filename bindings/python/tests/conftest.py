import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

from keychaind import Daemon  # noqa: E402


@pytest.fixture(scope="session")
def daemon():
    """One keychaind on its own swtpm for the session (a device passcode set), stopped and removed at the end."""
    started = Daemon()
    yield started
    started.stop()


@pytest.fixture
def socket_env(daemon, monkeypatch):
    """KEYCHAIN_SOCKET pointing at the session's keychaind, as a program finds it."""
    monkeypatch.setenv("KEYCHAIN_SOCKET", daemon.socket)
    monkeypatch.delenv("KEYCHAIN_STORE", raising=False)
    return daemon.socket
