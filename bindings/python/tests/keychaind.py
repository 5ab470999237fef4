"""A private keychaind on a private swtpm, as scripts/soak.py starts them: for the tests and the benchmark.

The binaries come from KEYCHAIN_BIN (default: the checkout's .build/debug, which scripts/test.sh builds).
Everything lives in one temporary folder, removed at the end with keychaind's TPM turn lock.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PASSCODE = "482916"


def binaries() -> str:
    return os.environ.get("KEYCHAIN_BIN") or os.path.join(REPO, ".build", "debug")


def _wait_for(path: str, seconds: float = 30) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


class Daemon:
    """swtpm and keychaind (as this user, root in CI) on a socket every uid may reach, a device passcode set."""

    def __init__(self, passcode: bool = True, options=(), reader: bool = False) -> None:
        self.bin = binaries()
        self.work = tempfile.mkdtemp(prefix="keychain-py-")
        os.chmod(self.work, 0o755)
        self.socket = os.path.join(self.work, "keychaind.sock")
        self.procs = {}
        self.log = open(os.path.join(self.work, "keychaind.log"), "wb")
        try:
            self._start(passcode, list(options), reader)
        except BaseException:
            self.stop()
            raise

    def _start(self, passcode: bool, options, reader: bool) -> None:
        tpm = os.path.join(self.work, "tpm")
        os.makedirs(tpm + "/state", mode=0o700)
        self.procs["swtpm"] = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--server", f"type=unixio,path={tpm}/sock,mode=0600",
             "--ctrl", f"type=unixio,path={tpm}/sock.ctrl,mode=0600", "--tpmstate", f"dir={tpm}/state,mode=0600",
             "--flags", "not-need-init,startup-clear", "--log", f"file={tpm}/swtpm.log"], stdin=subprocess.DEVNULL)
        if not _wait_for(tpm + "/sock.ctrl"):
            raise RuntimeError("swtpm did not start")
        for folder in ("groups.d", "store", "reader"):
            os.makedirs(os.path.join(self.work, folder), mode=0o700)
        self.procs["keychaind"] = subprocess.Popen(
            [self.bin + "/keychaind", "--socket", self.socket, "--store", self.work + "/store", "--tcti",
             f"swtpm:path={tpm}/sock", "--groups", self.work + "/groups.d", "--reader", self.work + "/reader" if reader else "none"] + options,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.log)
        ready = self.procs["keychaind"].stdout.readline().decode()
        if "ready" not in ready:
            raise RuntimeError(f"keychaind did not start: {ready!r}: {open(self.work + '/keychaind.log').read()[-2000:]}")
        if passcode:
            self.keychainctl(["passcode", "set"], PASSCODE + "\n")
        os.chmod(self.socket, 0o666)

    def keychainctl(self, argv, stdin: str = "") -> str:
        env = {"PATH": "/usr/bin:/bin", "HOME": self.work, "KEYCHAIN_SOCKET": self.socket}
        done = subprocess.run([self.bin + "/keychainctl"] + argv, input=stdin.encode(), env=env, capture_output=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"keychainctl {' '.join(argv)}: {done.stderr.decode()}")
        return done.stdout.decode()

    def stop(self) -> None:
        for name in ("keychaind", "swtpm"):
            p = self.procs.get(name)
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            if p and p.stdout:
                p.stdout.close()
        self.log.close()
        # keychaind's turn lock of this swtpm (TPMTurn.lockName): the TPM is gone, and the lock with it.
        lock = "tpm-" + hashlib.sha256(f"swtpm:path={self.work}/tpm/sock".encode()).hexdigest()[:16] + ".lock"
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        for folder in [f"/tmp/keychain-{os.geteuid()}"] + ([runtime + "/keychain"] if runtime.startswith("/") else []):
            try:
                os.unlink(os.path.join(folder, lock))
            except FileNotFoundError:
                pass
        shutil.rmtree(self.work, ignore_errors=True)
