"""A program outside the checkout, with only what `pip install` put in a venv: a secret stored and read
with an access control through keychaind, keyring's CLI finding the backend by its entry point, and
git's and Docker's helpers on PATH."""
import os
import shutil
import subprocess

import pytest

from keychaind import PASSCODE

PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

PROGRAM = '''
import keychain
from keychain import AccessControl, Accessible, Answer, create_keychain

asked = []
def prompter(request):
    asked.append((request.key, request.methods))
    return Answer.passcode(PASSCODE)

vault = create_keychain(service="outside.vault", accessible=Accessible.WHEN_UNLOCKED_THIS_DEVICE_ONLY,
                        access_control=AccessControl.PASSCODE, prompter=prompter)
vault.set_item("refreshToken", "r-123")
print(vault.get_item("refreshToken"), asked, vault.get_item_info("refreshToken").access_control.value, keychain.__file__)
'''


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    root = tmp_path_factory.mktemp("outside")
    # A copy: setuptools builds in the source folder, and the checkout stays clean.
    source = root / "source"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(root / "venv")], check=True, timeout=300)
    # Offline: Debian's setuptools (system site packages) builds it, no index is asked.
    done = subprocess.run([str(root / "venv/bin/pip"), "install", "--quiet", "--no-build-isolation", "--no-index", str(source)],
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr.decode()
    return root


def test_a_program_outside_the_checkout_stores_and_reads_a_secret_behind_the_passcode(venv, daemon):
    (venv / "program.py").write_text(f"PASSCODE = {PASSCODE!r}\n" + PROGRAM)
    env = {"PATH": f"{venv}/venv/bin:/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "HOME": str(venv)}
    done = subprocess.run([f"{venv}/venv/bin/python", "program.py"], cwd=str(venv), env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    value, rest = done.stdout.decode().split(" ", 1)
    assert value == "r-123"
    assert rest.startswith("[('refreshToken', ['passcode'])] passcode ")
    assert rest.strip().startswith(f"[('refreshToken', ['passcode'])] passcode {venv}/venv/lib/")


def test_keyring_finds_the_backend_by_its_entry_point_and_git_finds_its_helper(venv, daemon):
    env = {"PATH": f"{venv}/venv/bin:/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "HOME": str(venv)}
    backends = subprocess.run([f"{venv}/venv/bin/python", "-m", "keyring", "--list-backends"], env=env, capture_output=True,
                              timeout=120)
    assert b"keychain.keyring_backend.KeychainBackend (priority: 6" in backends.stdout, backends.stdout
    keyring = lambda *argv, stdin="": subprocess.run([f"{venv}/venv/bin/python", "-m", "keyring", *argv], env=env,
                                                     input=stdin.encode(), capture_output=True, timeout=120)
    assert keyring("set", "outside.keyring", "dave", stdin="d4ve\n").returncode == 0
    assert keyring("get", "outside.keyring", "dave").stdout == b"d4ve\n"
    assert shutil.which("git-credential-keychain", path=env["PATH"]) == f"{venv}/venv/bin/git-credential-keychain"
    # Docker finds its helper on PATH by the credsStore name: docker-credential-keychain.
    version = subprocess.run(["docker-credential-keychain", "version"], env=env, capture_output=True, timeout=120)
    assert (version.returncode, version.stdout) == (0, b"0.6.4\n"), version.stderr
