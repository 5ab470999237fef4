"""git-credential-keychain driven by real `git credential fill/approve/reject` (issue 42 item 4)."""
import os
import shlex
import subprocess
import sys

import pytest

from keychaind import PASSCODE
from terminal import on_terminal


SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src"))


@pytest.fixture
def git(daemon, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KEYCHAIN_SOCKET": daemon.socket, "PYTHONPATH": SRC,
           "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    helper = f"!{shlex.quote(sys.executable)} -m keychain.git_credential --service git.{tmp_path.name}"

    def run(action, text, extra="", answer=None):
        if answer is not None:
            return on_terminal(["git", "-c", f"credential.helper={helper}{extra}", "credential", action], env, answer,
                               text.encode())
        return subprocess.run(["git", "-c", f"credential.helper={helper}{extra}", "credential", action],
                              input=text.encode(), env=env, capture_output=True, timeout=60, start_new_session=True)
    return run


def test_approve_then_fill_then_reject(git):
    assert git("fill", "protocol=https\nhost=example.com\n\n").returncode != 0  # nothing stored, no prompt allowed
    approved = git("approve", "protocol=https\nhost=example.com\nusername=alice\npassword=s3cret=x\n\n")
    assert approved.returncode == 0, approved.stderr
    filled = git("fill", "protocol=https\nhost=example.com\n\n")
    assert filled.returncode == 0, filled.stderr
    assert filled.stdout.decode().splitlines() == ["protocol=https", "host=example.com", "username=alice",
                                                   "password=s3cret=x"]
    # Another host, another user of the same host: apart.
    assert git("fill", "protocol=https\nhost=other.example\n\n").returncode != 0
    git("approve", "protocol=https\nhost=example.com\nusername=bob\npassword=b0b\n\n")
    bob = git("fill", "protocol=https\nhost=example.com\nusername=bob\n\n")
    assert "password=b0b" in bob.stdout.decode().splitlines()
    rejected = git("reject", "protocol=https\nhost=example.com\nusername=alice\npassword=s3cret=x\n\n")
    assert rejected.returncode == 0, rejected.stderr
    after = git("fill", "protocol=https\nhost=example.com\n\n")
    assert "username=bob" in after.stdout.decode().splitlines()  # alice's is gone, bob's kept


def test_a_credential_behind_the_passcode_is_read_only_after_the_passcode_on_a_terminal(git):
    extra = " --access-control passcode"
    assert git("approve", "protocol=https\nhost=guarded.example\nusername=carol\npassword=c4r0l\n\n", extra).returncode == 0
    # The helper has no terminal (a session of its own): its prompt reaches no one, and no password comes out.
    out = git("fill", "protocol=https\nhost=guarded.example\nusername=carol\n\n", extra)
    assert out.returncode != 0 and b"c4r0l" not in out.stdout
    assert b"INTERACTION_NOT_ALLOWED" in out.stderr
    # On a terminal, the helper's prompt asks for the device passcode, and git gets the password.
    answered = git("fill", "protocol=https\nhost=guarded.example\nusername=carol\n\n", extra, answer=(PASSCODE + "\n").encode())
    assert answered.returncode == 0, answered.stderr
    assert "password=c4r0l" in answered.stdout.decode().splitlines()
