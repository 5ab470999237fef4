"""keyring's own backend tests (keyring.testing.backend.BackendBasicTests) against keychaind."""
import subprocess
import sys

import pytest
from keyring.testing.backend import BackendBasicTests

from keychain.keyring_backend import KeychainBackend


SOCKET = None


@pytest.fixture(scope="module", autouse=True)
def _socket_path(daemon):
    """Set before keyring's own fixture makes the backend (module scope comes first), kept for its cleanup."""
    global SOCKET
    SOCKET = daemon.socket


class TestKeychainBackend(BackendBasicTests):
    def init_keyring(self):
        return KeychainBackend().with_properties(socket=SOCKET)


def test_keyrings_cli_sets_gets_and_deletes_through_keychaind(socket_env, tmp_path):
    """keyring's own CLI (the backend named by PYTHON_KEYRING_BACKEND; the venv test finds it by its entry point)."""
    env = {"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": socket_env, "HOME": str(tmp_path),
           "PYTHON_KEYRING_BACKEND": "keychain.keyring_backend.KeychainBackend",
           "PYTHONPATH": ":".join(sys.path)}
    run = lambda *argv, stdin="": subprocess.run([sys.executable, "-m", "keyring", *argv], input=stdin.encode(), env=env,
                                                 capture_output=True, timeout=60)
    assert run("set", "cli.service", "alice", stdin="s3cret\n").returncode == 0
    got = run("get", "cli.service", "alice")
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"s3cret\n"
    assert run("del", "cli.service", "alice").returncode == 0
    assert run("get", "cli.service", "alice").returncode == 1


def test_without_keychaind_the_backend_is_not_viable(monkeypatch):
    monkeypatch.delenv("KEYCHAIN_SOCKET", raising=False)
    monkeypatch.setattr("keychain.keyring_backend.SYSTEM_SOCKET", "/nonexistent/keychaind.sock")
    assert not KeychainBackend.viable
