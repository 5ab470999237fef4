#!/usr/bin/env python3
"""keychaind under mixed load for N minutes, its memory, descriptors and threads sampled (issue 38 item 13).

    scripts/soak.py [--minutes N] [--short] [--bin DIR] [--keep]

Starts its own swtpm and keychaind (as root, both sockets: the keychain API and systemd credentials) in a
temporary folder, sets a device passcode, then runs 16 client processes of five uids (root, nobody and the
numeric uids 1701-1703, through `setpriv`), each on its own service, looping over:
- `keychainctl set` / `get` / `rm` of its items, values on stdin (never in argv), each read compared with
  what the client last had acknowledged;
- items with `--access-control passcode --auth-validity 0` (every read asks): reads whose prompt, on the
  client's own terminal (a pty), is answered with the passcode, answered empty (cancelled), or abandoned
  (the client killed with SIGKILL at the prompt);
- its unit's credential fetched from the credentials socket as systemd fetches it (connecting from the
  abstract address `\\0<hex>/unit/<unit>/<ID>`), and rotated with `credential set` (root: the system's
  unit, others: `--user`);
- `keychainctl status`;
- a call killed with SIGKILL at a random moment (its write then counts as maybe written).
Once, at 40% of the run, swtpm is stopped (SIGSTOP) for longer than the TPM deadline (30 s), then resumed.
keychaind's VmRSS, open descriptors and threads are sampled every few seconds.

Checks, each a failure (exit 1) when it does not hold:
- keychaind runs to the end;
- nothing acknowledged is lost: at the end each client reads every item and credential it wrote, and each
  holds its last acknowledged value (or that of a later write that was killed or failed, which may have
  landed); every read during the run too. A killed write is made before its client is gone or never
  (keychaind checks, just before it commits, that its caller still holds its connection: `CallerPresence`),
  so a read may find it at most KILLED_WRITE_GRACE (5 s: its commit under load) after its client was seen
  to end, and never after the client's next write was acknowledged past that;
- every call answered or failed within its deadline, counted from when it was made (docs/security.md): when
  keychaind read its first request (debug builds write each request's peer pid and read time to
  KEYCHAIN_TEST_REQUEST_TIMES; a call it read none of, from its start): the TPM deadline (30 s) for each of
  keychaind's requests it makes, plus --grace (default 5 s: keychaind's last step and the client's reading the
  answer and exiting), a prompt's answer time excluded (answered at once here). The client's start before it
  sends (seconds on a loaded machine) is not keychaind's to promise: it is printed, not judged.
  `keychainctl rm` is two requests (has, then remove), and so is a read that prompts: the front's request ends
  when keychaind asks its question, and keychainctl-full reads again and answers it (docs/security.md: each
  request has its own deadline);
- no unexpected failure: outside the stall (and a deadline after it) every call succeeds but the cancelled
  prompts (USER_CANCELED) and killed calls; during it, only HARDWARE_UNAVAILABLE;
- flat after warm-up: RSS's least-squares slope under load after warm-up, the stall and a deadline after it left
  out, at most 0.15 MiB a minute (judged when those samples span 5 minutes or more: not in the 2-minute slice);
  the second quarter's and the last quarter's medians of descriptors and threads (at most +8 each), and at rest
  (no client) after the load: descriptors and threads back to what they were at rest before it (+2).
Prints the samples at start, after warm-up and at the end, latencies per operation and the checks.
docs/performance.md ("Soak") has the last full run's figures.
"""
import argparse
import errno
import fcntl
import hashlib
import json
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import termios
import threading
import time

sys.dont_write_bytecode = True  # proc_status: no __pycache__ left in the tree
from proc_status import proc_status
from soak_deadlines import check_deadlines, made_at

TPM_DEADLINE = 30.0
# Seconds after its client was seen to end that a killed write may still be landing (its commit, begun
# while the client was there: keychaind makes no write of a client that is gone).
KILLED_WRITE_GRACE = 5.0
# MiB a minute: the 30-minute run before issue 38 item 13's fixes grew 0.4.
MAX_RSS_SLOPE = 0.15
# keychaind requests per operation, where more than one: each has its own deadline.
REQUESTS = {"rm": 2, "prompted get": 2}  # by the operation's name's start
PASSCODE = "482916"
UIDS = [0, 65534, 1701, 1702, 1703]
CLIENTS = 16


def now():
    return time.monotonic()


# ---------------------------------------------------------------------------------------------------------
# A client: one process of one uid, started by the orchestrator through setpriv.
# ---------------------------------------------------------------------------------------------------------

class Client:
    def __init__(self, args):
        self.n, self.until, self.bin = args.client, args.until, args.bin
        self.home = os.environ["HOME"]
        self.env = {"PATH": "/usr/bin:/bin", "HOME": self.home, "KEYCHAIN_SOCKET": args.socket, "LANG": "C.UTF-8"}
        self.credentials = args.credentials
        self.service = f"soak.c{self.n}"
        self.unit = f"soak-c{self.n}.service"
        self.rng = random.Random(os.getpid() ^ int(time.time() * 1000))
        # key -> values it may hold: its last acknowledged value (None: absent) and those of later writes
        # whose outcome is unknown (killed, failed). An acknowledged write or removal resets it.
        self.plain = {f"k{i}": {None} for i in range(6)}
        self.guarded = {f"p{i}": {None} for i in range(2)}
        self.credential = {None}
        # key -> (value, until) of writes killed after they may have reached keychaind: one whose presence
        # check came before the kill may still be committing when the client's next call reads. Until then
        # a read may see it, whatever came between; later, only what was acknowledged after it.
        self.late = {}
        self.pid = None  # the last keychainctl's

    def emit(self, **record):
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    def keychainctl(self, argv, value=None, kill_after=None):
        """Runs keychainctl; (outcome, stdout, duration): outcome "ok", an error code, or "killed"."""
        start = now()
        p = subprocess.Popen([self.bin + "/keychainctl"] + argv, env=self.env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.pid = p.pid  # keychaind's request times name it (the front and keychainctl-full it execs are one pid)
        timer = None
        if kill_after is not None:
            timer = threading.Timer(kill_after, lambda: p.kill())
            timer.start()
        out, err = p.communicate(value.encode() if value is not None else b"")
        if timer:
            timer.cancel()
        return self.outcome(p.returncode, err), out, start, now() - start

    @staticmethod
    def outcome(rc, err):
        if rc == 0:
            return "ok"
        if rc == -signal.SIGKILL:
            return "killed"
        text = err.decode(errors="replace")
        if rc == 1 and (not text.strip() or "no item" in text):
            return "ITEM_NOT_FOUND"  # keychainctl's exit 1: absent (`rm` says nothing, `get` names the item)
        for word in text.replace(":", " ").split():
            if len(word) > 4 and word.isupper() and word.replace("_", "").isalpha():
                return word
        return f"exit {rc}: {text.strip()[:200]}"

    def record(self, op, outcome, start, duration, **extra):
        self.emit(kind="call", client=self.n, uid=os.getuid(), op=op, outcome=outcome, start=start,
                  duration=duration, pid=self.pid, **extra)
        self.pid = None

    # Writes and reads of plain and guarded items.

    def write(self, table, key, extra_args, op, kill=False):
        value = "%x" % self.rng.getrandbits(64) * self.rng.randint(1, 12)
        kill_after = self.rng.uniform(0.0, 0.4) if kill else None
        outcome, _, start, duration = self.keychainctl(["set", self.service, key] + extra_args, value, kill_after)
        if outcome == "ok":
            table[key] = {value}
        else:
            table[key].add(value)
        if outcome == "killed":
            self.late.setdefault(key, []).append((value, now() + KILLED_WRITE_GRACE))
        self.record(op + (" (killed)" if kill else ""), outcome, start, duration, key=key, value=tag(value))

    def remove(self, table, key):
        outcome, _, start, duration = self.keychainctl(["rm", self.service, key])
        if outcome == "ok":
            table[key] = {None}
        elif outcome == "ITEM_NOT_FOUND":
            # Absent is right when the item may be absent (never written, removed, or its last writes were
            # killed or failed and so may not have happened); otherwise an acknowledged value is lost.
            if None not in table[key]:
                self.emit(kind="lost", client=self.n, uid=os.getuid(), key=key, final=False,
                          expected=sorted(v or "<absent>" for v in table[key])[:4], got="<absent>")
            table[key] = {None}
            outcome = "ok"
        else:
            table[key].add(None)
        self.record("rm", outcome, start, duration, key=key)

    def read(self, table, key, op="get", kill=False, final=False):
        kill_after = self.rng.uniform(0.0, 0.3) if kill else None
        outcome, out, start, duration = self.keychainctl(["get", self.service, key], None, kill_after)
        self.check_read(op + (" (killed)" if kill else ""), table, key, outcome, out, start, duration, final)

    def check_read(self, op, table, key, outcome, out, start, duration, final=False, **extra):
        got = out.decode(errors="replace") if outcome == "ok" else None
        if outcome == "ITEM_NOT_FOUND" or outcome == "ok":
            late = {value for value, until in self.late.get(key, []) if start < until}
            if got not in table[key] | late:
                self.emit(kind="lost", client=self.n, uid=os.getuid(), key=key, final=final,
                          expected=sorted(v or "<absent>" for v in table[key])[:4], got=got or "<absent>")
            else:
                table[key] = {got}  # what it holds now: later reads compare with it alone
            outcome = "ok"
        self.record(op, outcome, start, duration, key=key, value=tag(got), **extra)

    def prompted_read(self, key, how):
        """A read of a guarded item on a pty: its prompt answered with the passcode, with enter alone, or abandoned."""
        master, slave = os.openpty()
        slave_name = os.ttyname(slave)
        os.close(slave)

        def controlling_terminal():
            fd = os.open(slave_name, os.O_RDWR)
            fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
            os.close(fd)

        start = now()
        p = subprocess.Popen([self.bin + "/keychainctl", "get", self.service, key], env=self.env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, preexec_fn=controlling_terminal)
        self.pid = p.pid
        seen, asked, answered_at, waited = b"", False, None, 0.0
        deadline = start + TPM_DEADLINE + 60
        while now() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:
                    chunk = b""
                seen += chunk
                if not asked and b"Passcode" in seen:
                    asked, answered_at = True, now()
                    if how == "abandoned":
                        time.sleep(self.rng.uniform(0.0, 1.5))
                        p.kill()
                        break
                    os.write(master, (PASSCODE + "\n" if how == "answered" else "\n").encode())
            if p.poll() is not None:
                break
        out, err = p.communicate()
        os.close(master)
        duration = now() - start
        outcome = self.outcome(p.returncode, err)
        op = f"prompted get ({how})"
        if how == "abandoned":
            if not asked:
                op = "prompted get (abandoned, ended before its prompt)"
            self.record(op, outcome if outcome != "killed" else "ok", start, duration, asked=asked)
            return
        asked_after = answered_at - start if asked else None
        if how == "cancelled":
            self.record(op, "ok" if outcome == "USER_CANCELED" else outcome, start, duration, asked_after=asked_after)
            return
        if not asked and outcome == "ok":
            op += ", no prompt"
        self.check_read(op, self.guarded, key, outcome, out, start, duration, asked_after=asked_after)

    def status(self):
        outcome, _, start, duration = self.keychainctl(["status"])
        self.record("status", outcome, start, duration)

    # Credentials.

    def fetch(self, op="credential fetch", final=False):
        """Connects as systemd does, from `\\0<hex>/unit/<unit>/<ID>`; the value, or nil for a refusal."""
        start = now()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        data, outcome = b"", "ok"
        try:
            s.bind(b"\0" + ("%x/unit/%s/token" % (self.rng.getrandbits(63) | 1, self.unit)).encode())
            s.settimeout(TPM_DEADLINE + 10)
            s.connect(self.credentials)
            s.shutdown(socket.SHUT_WR)
            while len(data) <= (1 << 20):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            outcome = "refused"
        except socket.timeout:
            outcome = "timeout"
        except OSError as e:
            outcome = f"{errno.errorcode.get(e.errno, e.errno)}"
        finally:
            s.close()
        duration = now() - start
        if outcome == "ok" and len(data) > (1 << 20):
            outcome = "refused"
        if outcome == "refused" and self.credential == {None}:
            outcome = "ok"
        elif outcome == "ok":
            got = data.decode(errors="replace")
            if got not in self.credential:
                self.emit(kind="lost", client=self.n, uid=os.getuid(), key="credential", final=final,
                          expected=sorted(v or "<absent>" for v in self.credential)[:4], got=got)
            else:
                self.credential = {got}
        self.record(op, outcome, start, duration)

    def rotate(self):
        value = "%x" % self.rng.getrandbits(128)
        argv = ["credential", "set"] + ([] if os.getuid() == 0 else ["--user"]) + [self.unit, "token"]
        outcome, _, start, duration = self.keychainctl(argv, value)
        if outcome == "ok":
            self.credential = {value}
        else:
            self.credential.add(value)
        self.record("credential set", outcome, start, duration)

    # The loop.

    def run(self):
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "until", 0))
        self.rotate()
        for key in self.guarded:
            self.write(self.guarded, key, ["--access-control", "passcode", "--auth-validity", "0"], "set guarded")
        ops = [
            (24, lambda: self.write(self.plain, self.rng.choice(list(self.plain)), [], "set")),
            (26, lambda: self.read(self.plain, self.rng.choice(list(self.plain)))),
            (4, lambda: self.remove(self.plain, self.rng.choice(list(self.plain)))),
            (8, lambda: self.status()),
            (3, lambda: self.write(self.guarded, self.rng.choice(list(self.guarded)),
                                   ["--access-control", "passcode", "--auth-validity", "0"], "set guarded")),
            (6, lambda: self.prompted_read(self.rng.choice(list(self.guarded)), "answered")),
            (2, lambda: self.prompted_read(self.rng.choice(list(self.guarded)), "cancelled")),
            (3, lambda: self.prompted_read(self.rng.choice(list(self.guarded)), "abandoned")),
            (10, lambda: self.fetch()),
            (2, lambda: self.rotate()),
            (3, lambda: self.write(self.plain, self.rng.choice(list(self.plain)), [], "set", kill=True)),
            (3, lambda: self.read(self.plain, self.rng.choice(list(self.plain)), kill=True)),
        ]
        weights = [w for w, _ in ops]
        while now() < self.until:
            self.rng.choices(ops, weights)[0][1]()
            time.sleep(self.rng.uniform(0.05, 0.6))
        # The end: every item and the credential read once more, each compared with what was acknowledged.
        for key in self.plain:
            self.read(self.plain, key, op="final get", final=True)
        for key in self.guarded:
            outcome, out, start, duration = self.keychainctl(["get", self.service, key, "--passcode-stdin"], PASSCODE + "\n")
            self.check_read("final get", self.guarded, key, outcome, out, start, duration, final=True)
        self.fetch(op="final credential fetch", final=True)
        self.emit(kind="done", client=self.n)



# ---------------------------------------------------------------------------------------------------------
# The orchestrator: swtpm, keychaind, the clients, the samples, the checks.
# ---------------------------------------------------------------------------------------------------------

def tag(value):
    """A value as the records name it: its first 12 characters (the soak's values are random hex, not secrets)."""
    return None if value is None else value[:12]


def sample(pid):
    fields = proc_status(pid)
    return {"t": now(), "rss": int(fields["VmRSS"].split()[0]), "anon": int(fields["RssAnon"].split()[0]),
            "file": int(fields["RssFile"].split()[0]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": int(fields["Threads"])}


def wait_for(path, seconds=20):
    end = now() + seconds
    while now() < end:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def orchestrate(args):
    if os.geteuid() != 0:
        raise SystemExit("soak.py: run as root (its clients are several uids, through setpriv)")
    minutes = args.minutes
    warmup = max(20.0, minutes * 60 * 0.1)
    work = tempfile.mkdtemp(prefix="keychain-soak-")
    os.chmod(work, 0o755)
    procs, failures = {}, []
    log = open(os.path.join(work, "keychaind.log"), "wb")
    try:
        # swtpm, as the tests start it.
        tpm = os.path.join(work, "tpm")
        os.makedirs(tpm + "/state", mode=0o700)
        procs["swtpm"] = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--server", f"type=unixio,path={tpm}/sock,mode=0600",
             "--ctrl", f"type=unixio,path={tpm}/sock.ctrl,mode=0600", "--tpmstate", f"dir={tpm}/state,mode=0600",
             "--flags", "not-need-init,startup-clear", "--log", f"file={tpm}/swtpm.log"], stdin=subprocess.DEVNULL)
        if not wait_for(tpm + "/sock.ctrl"):
            raise SystemExit("swtpm did not start")
        for d in ("groups.d", "credentials", "store"):
            os.makedirs(os.path.join(work, d), mode=0o755, exist_ok=True)
        os.chmod(os.path.join(work, "store"), 0o700)
        sock, credentials = os.path.join(work, "keychaind.sock"), os.path.join(work, "credentials/credentials.sock")
        procs["keychaind"] = subprocess.Popen(
            [args.bin + "/keychaind", "--socket", sock, "--store", work + "/store", "--tcti", f"swtpm:path={tpm}/sock",
             "--groups", work + "/groups.d", "--reader", "none", "--credentials-socket", credentials],
            # As the package's unit runs it (dist/systemd/keychaind.service): two malloc arenas.
            # Debug builds' test hook: each request's peer pid and the time keychaind read it (a call's "made").
            env={**os.environ, "MALLOC_ARENA_MAX": "2", "KEYCHAIN_TEST_REQUEST_TIMES": os.path.join(work, "requests.times")},
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
        ready = procs["keychaind"].stdout.readline().decode()
        if "ready" not in ready:
            raise SystemExit(f"keychaind did not start: {ready!r}; see {work}/keychaind.log")
        daemon = procs["keychaind"].pid
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "KEYCHAIN_SOCKET": sock}
        done = subprocess.run([args.bin + "/keychainctl", "passcode", "set"], input=(PASSCODE + "\n").encode(),
                              env=env, capture_output=True)
        if done.returncode != 0:
            raise SystemExit(f"passcode set failed: {done.stderr.decode()}")
        for path in (sock, credentials):
            os.chmod(path, 0o666)
        rest_before = sample(daemon)

        # The clients.
        start = now()
        until = start + minutes * 60
        records, lock = [], threading.Lock()
        clients = []
        for n in range(CLIENTS):
            uid = UIDS[n % len(UIDS)]
            home = os.path.join(work, f"c{n}")
            os.makedirs(home, mode=0o700)
            os.chown(home, uid, uid)
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, os.path.abspath(__file__),
                    "--client", str(n), "--until", repr(until), "--bin", args.bin, "--socket", sock,
                    "--credentials", credentials]
            p = subprocess.Popen(argv, env={"PATH": "/usr/bin:/bin", "HOME": home}, stdout=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, cwd=home)
            clients.append(p)

            def read_records(p=p):
                for line in p.stdout:
                    with lock:
                        records.append(json.loads(line))
            threading.Thread(target=read_records, daemon=True).start()

        # Samples, and the stall at 40% of the run.
        samples, stall, interval = [], None, 1.0 if minutes <= 5 else 3.0
        stall_at, stall_for = start + minutes * 60 * 0.4, TPM_DEADLINE + 15
        while any(p.poll() is None for p in clients):
            if procs["keychaind"].poll() is not None:
                failures.append(f"keychaind ended (status {procs['keychaind'].returncode}) during the load")
                break
            samples.append(sample(daemon))
            if stall is None and now() >= stall_at:
                os.kill(procs["swtpm"].pid, signal.SIGSTOP)
                stall = (now(), None)
                print(f"[{now() - start:6.0f} s] swtpm stopped (SIGSTOP) for {stall_for:.0f} s", flush=True)
            if stall and stall[1] is None and now() >= stall[0] + stall_for:
                os.kill(procs["swtpm"].pid, signal.SIGCONT)
                stall = (stall[0], now())
                print(f"[{now() - start:6.0f} s] swtpm resumed (SIGCONT)", flush=True)
            if len(samples) % max(1, int(60 / interval)) == 0:
                s = samples[-1]
                with lock:
                    n = sum(1 for r in records if r["kind"] == "call")
                print(f"[{s['t'] - start:6.0f} s] RSS {s['rss'] / 1024:.1f} MiB, {s['fds']} fds, {s['threads']} threads, "
                      f"{n} calls, load {os.getloadavg()[0]:.1f}", flush=True)
            if now() > until + 600:
                failures.append("a client did not end 10 minutes after the load: killed")
                for p in clients:
                    p.kill()
            time.sleep(interval)
        if stall and stall[1] is None:
            os.kill(procs["swtpm"].pid, signal.SIGCONT)
            stall = (stall[0], now())
        for p in clients:
            p.wait()
        time.sleep(5)
        rest_after = sample(daemon) if procs["keychaind"].poll() is None else None
        if rest_after is None:
            failures.append(f"keychaind ended (status {procs['keychaind'].returncode})")
        made_at(records, os.path.join(work, "requests.times"))
        with open(os.path.join(work, "calls.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(dict(r, start=r.get("start", start) - start, made=r.get("made", start) - start)) + "\n")
        report(args, start, warmup, samples, records, rest_before, rest_after, stall, clients, failures)
    finally:
        for name in ("keychaind", "swtpm"):
            p = procs.get(name)
            if p and p.poll() is None:
                if name == "swtpm":
                    os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
        log.close()
        # keychaind's turn lock of this swtpm (TPMTurn.lockName): the TPM is gone, and the lock with it.
        lock = "tpm-" + hashlib.sha256(f"swtpm:path={work}/tpm/sock".encode()).hexdigest()[:16] + ".lock"
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        for folder in [f"/tmp/keychain-{os.geteuid()}"] + ([runtime + "/keychain"] if runtime.startswith("/") else []):
            try:
                os.unlink(os.path.join(folder, lock))
            except FileNotFoundError:
                pass
        if failures and args.keep:
            print(f"kept {work}")
        elif not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


def report(args, start, warmup, samples, records, rest_before, rest_after, stall, clients, failures):
    calls = [r for r in records if r["kind"] == "call"]
    lost = [r for r in records if r["kind"] == "lost"]
    done = [r for r in records if r["kind"] == "done"]
    if len(done) != len(clients):
        failures.append(f"{len(clients) - len(done)} clients did not finish their final check")
    for r in lost:
        failures.append(f"client {r['client']} (uid {r['uid']}) {r['key']}: expected one of {r['expected']}, got {r['got']!r}"
                        + (" at the end" if r["final"] else ""))
        # The key's history, to tell a lost write from a late one.
        print(f"\nclient {r['client']} {r['key']}: its calls (seconds from the start, duration, outcome, value)")
        for c in calls:
            if c["client"] == r["client"] and c.get("key") == r["key"]:
                print(f"  {c['start'] - start:8.3f} {c['duration']:7.3f} s  {c['op']:<28} {c['outcome']:<22} {c.get('value')}"
                      f"  pid {c.get('pid')}")

    def during_stall(r):
        return stall and r["start"] + r["duration"] >= stall[0] and r["start"] <= (stall[1] or now()) + TPM_DEADLINE

    unexpected = {}
    for r in calls:
        # The credentials socket says nothing but the value (systemd's protocol): its HARDWARE_UNAVAILABLE is a refusal.
        stalled = "refused" if r["op"].endswith("credential fetch") else "HARDWARE_UNAVAILABLE"
        ok = r["outcome"] in ("ok", "killed") or (during_stall(r) and r["outcome"] == stalled)
        if not ok:
            unexpected.setdefault((r["op"], r["outcome"]), []).append(r)
    for (op, outcome), rs in sorted(unexpected.items()):
        failures.append(f"{len(rs)} × {op}: {outcome} (first at {rs[0]['start'] - start:.0f} s, uid {rs[0]['uid']})")
    summary = check_deadlines(calls, start, TPM_DEADLINE, REQUESTS, args.grace, failures)

    elapsed = now() - start
    print(f"\n## Soak: {args.minutes:g} min of load, {CLIENTS} clients of uids {', '.join(map(str, UIDS))}; "
          f"{len(calls)} calls ({len(calls) / max(elapsed, 1):.1f}/s); load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| operation | calls | outcomes | median | p99 | max |\n|---|--:|---|--:|--:|--:|")
    ops = {}
    for r in calls:
        ops.setdefault(r["op"], []).append(r)
    for op, rs in sorted(ops.items(), key=lambda kv: -len(kv[1])):
        d = sorted(r["duration"] for r in rs)
        outcomes = {}
        for r in rs:
            outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
        text = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]))
        print(f"| {op} | {len(rs)} | {text} | {statistics.median(d) * 1000:.0f} ms | {d[int(len(d) * 0.99)] * 1000:.0f} ms "
              f"| {d[-1] * 1000:.0f} ms |")
    if stall:
        inside = [r for r in calls if during_stall(r)]
        print(f"\nThe stall: swtpm stopped at {stall[0] - start:.0f} s for {stall[1] - stall[0]:.0f} s; {len(inside)} calls "
              f"overlapped it (or its deadline after it), the longest {max((r['duration'] for r in inside), default=0):.1f} s.")
    print(summary)

    # The samples: flat after warm-up.
    loaded = [s for s in samples if s["t"] - start >= warmup]
    if len(loaded) >= 8:
        q = len(loaded) // 4
        early, late = loaded[q:2 * q], loaded[-q:]
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        print("\n| keychaind | at rest before | first sample | after warm-up "
              f"({warmup:.0f} s) | 2nd quarter (median) | last quarter (median) | max | at rest after |")
        print("|---|--:|--:|--:|--:|--:|--:|--:|")
        for key, unit, scale in (("rss", "MiB", 1024), ("anon", "MiB", 1024), ("file", "MiB", 1024), ("fds", "", 1),
                                 ("threads", "", 1)):
            fmt = (lambda v: f"{v / scale:.1f} {unit}") if scale != 1 else (lambda v: f"{v:.0f}")
            print(f"| {key} | {fmt(rest_before[key])} | {fmt(samples[0][key])} | {fmt(loaded[0][key])} | {fmt(med(early, key))} "
                  f"| {fmt(med(late, key))} | {fmt(max(s[key] for s in samples))} | {fmt(rest_after[key]) if rest_after else '-'} |")
        # Resident memory's slope under load: least squares over the samples after warm-up, the stall and a
        # deadline after it left out (its extra threads come and go). Judged over 5 minutes or more of them: the
        # 2-minute slice has about 30 s, too few to tell 0.4 MiB a minute from a warm-up's last steps.
        steady = [x for x in loaded if not (stall and stall[0] <= x["t"] <= (stall[1] or now()) + TPM_DEADLINE)]
        span = (steady[-1]["t"] - steady[0]["t"]) / 60 if len(steady) > 1 else 0
        if span > 0:
            mt, mr = statistics.fmean(x["t"] for x in steady), statistics.fmean(x["rss"] for x in steady)
            slope = (sum((x["t"] - mt) * (x["rss"] - mr) for x in steady) / sum((x["t"] - mt) ** 2 for x in steady)) * 60 / 1024
            print(f"RSS slope under load after warm-up (stall left out): {slope:+.3f} MiB/min over {span:.1f} min of samples"
                  + ("" if span >= 5 else " (not judged: under 5 minutes)"))
            if span >= 5 and slope > MAX_RSS_SLOPE:
                failures.append(f"RSS grew {slope:.2f} MiB a minute under load after warm-up (at most {MAX_RSS_SLOPE})")
        for key in ("fds", "threads"):
            if med(late, key) > med(early, key) + 8:
                failures.append(f"{key} grew from {med(early, key)} (2nd quarter) to {med(late, key)} (last)")
            if rest_after and rest_after[key] > rest_before[key] + 2:
                failures.append(f"{key} at rest: {rest_before[key]} before the load, {rest_after[key]} after it")
    else:
        failures.append(f"too few samples after warm-up ({len(loaded)}) to judge flatness")
    print(f"{len(samples)} samples, every {samples[1]['t'] - samples[0]['t']:.1f} s." if len(samples) > 1 else "")
    print("\nchecks: " + ("all held" if not failures else "FAILED:\n  " + "\n  ".join(failures)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--short", action="store_true", help="2 minutes (CI's slice)")
    parser.add_argument("--bin", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../.build/debug"))
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds allowed beyond the TPM deadline, counted from when keychaind read the request")
    parser.add_argument("--keep", action="store_true", help="keep the folder (keychaind's log) after a failure")
    parser.add_argument("--client", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--credentials", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.bin = os.path.realpath(args.bin)
    if args.short:
        args.minutes = 2
    if args.client is not None:
        Client(args).run()
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
