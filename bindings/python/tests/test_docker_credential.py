"""docker-credential-keychain speaking the credential-helpers protocol as Docker's CLI speaks it, against a real
keychaind, compared with Debian's reference helpers (golang-docker-credential-helpers) where they answer without
their own stores (issue 42 item 4)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))


@pytest.fixture
def helper(daemon, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KEYCHAIN_SOCKET": daemon.socket, "PYTHONPATH": SRC}

    def run(action, stdin="", *options):
        # As Docker runs it: the action its only argument, the request on stdin; no terminal (a session of its own).
        return subprocess.run([sys.executable, "-m", "keychain.docker_credential", "--service", f"docker.{tmp_path.name}",
                               *options, *([action] if action else [])], input=stdin.encode(), env=env, capture_output=True,
                              timeout=60, start_new_session=True)
    return run


REFUSALS = [("get", ""), ("get", "\n  \n"), ("store", '{"ServerURL":"","Username":"u","Secret":"s"}'),
            ("store", '{"ServerURL":"https://x","Username":"","Secret":"s"}'), ("version", ""), ("bogus", "")]


@pytest.mark.parametrize("reference", ["docker-credential-secretservice", "docker-credential-pass"])
def test_refusals_version_and_usage_are_the_reference_helpers_words_and_exit_codes(helper, reference):
    if shutil.which(reference) is None:
        pytest.skip(f"{reference} is not installed (golang-docker-credential-helpers)")
    for action, stdin in REFUSALS:
        ours = helper(action, stdin)
        theirs = subprocess.run([reference, action], input=stdin.encode(), capture_output=True, timeout=60)
        assert (ours.returncode, ours.stdout) == (theirs.returncode, theirs.stdout), (action, stdin, ours.stderr)
    ours, theirs = helper(None), subprocess.run([reference], capture_output=True, timeout=60)
    assert ours.returncode == theirs.returncode == 1
    assert ours.stdout == theirs.stdout.replace(reference.encode(), b"docker-credential-keychain")


def test_store_get_list_erase_as_docker_login_and_logout_use_them(helper):
    hub, mirror = "https://index.docker.io/v1/", "registry.example:5000"
    assert helper("list").stdout == b"{}\n"
    stored = helper("store", json.dumps({"ServerURL": hub, "Username": "alice", "Secret": "s3cr&t<>"}))
    assert (stored.returncode, stored.stdout) == (0, b""), stored.stdout
    # Go's decoder matches field names without regard to case, and so does this one.
    assert helper("store", '{"serverurl":"registry.example:5000","username":"bob","secret":"b0b"}').returncode == 0
    got = helper("get", hub + "\n")
    assert got.returncode == 0, got.stdout
    # Written as Go's json.Encoder writes it: compact, <, > and & escaped.
    assert got.stdout == b'{"ServerURL":"https://index.docker.io/v1/","Username":"alice","Secret":"s3cr\\u0026t\\u003c\\u003e"}\n'
    assert json.loads(got.stdout) == {"ServerURL": hub, "Username": "alice", "Secret": "s3cr&t<>"}
    assert json.loads(helper("list").stdout) == {hub: "alice", mirror: "bob"}
    # A second login replaces the first.
    helper("store", json.dumps({"ServerURL": hub, "Username": "alice2", "Secret": "new"}))
    assert json.loads(helper("get", hub).stdout)["Username"] == "alice2"
    assert (helper("erase", hub).returncode, helper("erase", hub).returncode) == (0, 0)  # erasing nothing is fine
    missing = helper("get", hub)
    assert (missing.returncode, missing.stdout) == (1, b"credentials not found in native keychain\n")
    assert json.loads(helper("list").stdout) == {mirror: "bob"}


def test_a_credential_behind_the_passcode_is_refused_without_a_terminal_and_listed_without_a_prompt(helper):
    request = json.dumps({"ServerURL": "guarded.example", "Username": "carol", "Secret": "c4r0l"})
    assert helper("store", request, "--access-control", "passcode").returncode == 0
    got = helper("get", "guarded.example", "--access-control", "passcode")
    assert got.returncode == 1 and got.stdout.startswith(b"INTERACTION_NOT_ALLOWED: ") and b"c4r0l" not in got.stdout
    assert json.loads(helper("list").stdout) == {"guarded.example": "carol"}  # the username is the label: no prompt
