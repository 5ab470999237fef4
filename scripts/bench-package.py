#!/usr/bin/env python3
"""The runtime package's size, its commands' start and keychaind's memory, side by side (issue 37, item 3).

    scripts/bench-package.py BEFORE.deb AFTER.deb [--runs N]

Each package is unpacked (dpkg-deb -x) into a folder of its own and run from there, nothing installed: its
keychaind on a private store with the embedded software TPM (swtpm) and a socket in that folder. Then, the two
alternated run by run so that the machine's load falls on both alike:
- `keychainctl get` of one item through keychaind (the front's path): N runs each;
- each command's start to its usage (`keychainctl-full --help`, `keychaind --help`,
  `keychain-secret-service --help`): N/4 runs each;
and keychaind's resident memory (VmRSS, VmHWM) after 1,000 such reads. Prints a Markdown table:
docs/performance.md, "The package's size and start-up", has its figures.

    scripts/bench-package.py BEFORE.deb AFTER.deb --instructions

counts instructions instead (valgrind's callgrind: the same figure on a loaded machine): keychaind's per served
`keychainctl get` (the difference of two dumps 200 reads apart, after 20 reads of warm-up) and one whole
`keychainctl get` process (the front: its start, the call, its exit).
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # proc_status: no __pycache__ left in the tree
from proc_status import proc_status


def unpack(deb, into):
    subprocess.run(["dpkg-deb", "-x", deb, into], check=True)
    fields = subprocess.run(["dpkg-deb", "-f", deb, "Package", "Version", "Installed-Size"],
                            check=True, capture_output=True, text=True).stdout
    info = dict(line.split(": ", 1) for line in fields.splitlines())
    return info


class Side:
    def __init__(self, name, deb, work):
        self.name, self.deb = name, deb
        self.root = os.path.join(work, name)
        os.makedirs(self.root)
        self.info = unpack(deb, self.root)
        self.bin = lambda command: os.path.join(self.root, "usr/sbin" if command == "keychaind" else "usr/bin", command)
        self.socket = os.path.join(self.root, "keychaind.sock")
        self.store = os.path.join(self.root, "store")
        self.env = {"PATH": os.environ["PATH"], "KEYCHAIN_SOCKET": self.socket, "HOME": self.root}
        self.daemon = None

    def start(self, wrapper=()):
        self.daemon = subprocess.Popen([*wrapper, self.bin("keychaind"), "--socket", self.socket, "--store", self.store, "--reader", "none"],
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                                       start_new_session=True)  # its embedded swtpm in its group: stop() ends both
        line = self.daemon.stdout.readline().decode()
        if "ready" not in line:
            raise SystemExit(f"{self.name}: keychaind did not start: {line!r}")
        subprocess.run([self.bin("keychainctl"), "set", "bench", "k"], input=b"v" * 32, env=self.env, check=True)

    def run(self, argv):
        start = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(f"{self.name}: {' '.join(argv)} exited {done.returncode}")
        return elapsed

    def memory(self):
        fields = proc_status(self.daemon.pid)
        return fields["VmRSS"], fields["VmHWM"]

    def stop(self):
        if self.daemon:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                try:
                    os.killpg(self.daemon.pid, sig)
                    self.daemon.wait(timeout=wait)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            # The embedded TPM's swtpm runs in a session of its own and outlives keychaind (as a device's TPM
            # outlives the service): this store's is stopped here.
            subprocess.run(["pkill", "-f", f"path={self.store}/swtpm/"], check=False)
            self.daemon = None


def summary(samples):
    samples = sorted(samples)
    return f"{statistics.median(samples) * 1000:.2f} ms (p90 {samples[int(len(samples) * 0.9)] * 1000:.2f})"


def main():
    args = sys.argv[1:]
    runs = 200
    if "--runs" in args:
        i = args.index("--runs")
        runs = int(args[i + 1])
        del args[i:i + 2]
    instructions = "--instructions" in args
    if instructions:
        args.remove("--instructions")
    if len(args) != 2:
        raise SystemExit(__doc__)
    work = tempfile.mkdtemp(prefix="keychain-bench-package-")
    sides = [Side("before", args[0], work), Side("after", args[1], work)]
    if instructions:
        try:
            count_instructions(sides, work)
        finally:
            for side in sides:
                side.stop()
            shutil.rmtree(work, ignore_errors=True)
        return
    try:
        for side in sides:
            side.start()
        rows = {}
        commands = [("keychainctl get (through keychaind)", lambda s: [s.bin("keychainctl"), "get", "bench", "k"], runs)]
        for command in ("keychainctl-full", "keychaind", "keychain-secret-service"):
            commands.append((f"{command} --help", lambda s, c=command: [s.bin(c), "--help"], max(runs // 4, 10)))
        for label, argv, n in commands:
            samples = {side.name: [] for side in sides}
            for _ in range(n):
                for side in sides:
                    samples[side.name].append(side.run(argv(side)))
            rows[label] = {name: summary(values) for name, values in samples.items()}
        # 1,000 reads in all (the gets above included), then keychaind's memory.
        for side in sides:
            for _ in range(max(0, 1000 - runs)):
                side.run([side.bin("keychainctl"), "get", "bench", "k"])
            rss, hwm = side.memory()
            rows["keychaind's memory after 1,000 reads (VmRSS, peak VmHWM)"] = rows.get(
                "keychaind's memory after 1,000 reads (VmRSS, peak VmHWM)", {})
            rows["keychaind's memory after 1,000 reads (VmRSS, peak VmHWM)"][side.name] = f"{rss} (peak {hwm})"
        print(f"| | before: {sides[0].info['Package']} {sides[0].info['Version']} | after: {sides[1].info['Package']} {sides[1].info['Version']} |")
        print("|---|--:|--:|")
        print(f"| .deb | {os.path.getsize(sides[0].deb):,} bytes | {os.path.getsize(sides[1].deb):,} bytes |")
        print(f"| installed (Installed-Size) | {int(sides[0].info['Installed-Size']):,} KiB | {int(sides[1].info['Installed-Size']):,} KiB |")
        for label, values in rows.items():
            print(f"| {label} | {values['before']} | {values['after']} |")
        print(f"\n{runs} alternated runs of the get, {max(runs // 4, 10)} of each --help; load average {os.getloadavg()[0]:.1f} at the end.")
    finally:
        for side in sides:
            side.stop()
        shutil.rmtree(work, ignore_errors=True)


def callgrind_total(path):
    """The instructions (Ir) of a callgrind output file's totals line."""
    with open(path) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def count_instructions(sides, work):
    reads = 200
    rows = {}
    for side in sides:
        out = os.path.join(work, f"{side.name}.callgrind")
        side.start(wrapper=("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"))
        get = [side.bin("keychainctl"), "get", "bench", "k"]
        for _ in range(20):
            side.run(get)
        dumps = []
        for _ in range(2):
            subprocess.run(["callgrind_control", "--dump", str(side.daemon.pid)], check=True, capture_output=True)
            dumps.append(sorted(p for p in os.listdir(work) if p.startswith(f"{side.name}.callgrind.{side.daemon.pid}."))[-1])
            for _ in range(reads):
                side.run(get)
        # Each dump holds what ran since the one before it: the second holds the reads between the two.
        served = callgrind_total(os.path.join(work, dumps[1])) / reads
        front = os.path.join(work, f"{side.name}.front")
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={front}", *get], env=side.env, check=True,
                       capture_output=True)
        rows[side.name] = (served, callgrind_total(front))
        side.stop()
    print(f"| instructions (callgrind) | before: {sides[0].deb} | after: {sides[1].deb} |")
    print("|---|--:|--:|")
    print(f"| keychaind, per `keychainctl get` served ({reads} reads) | {rows['before'][0]:,.0f} | {rows['after'][0]:,.0f} |")
    print(f"| one `keychainctl get` process (the front) | {rows['before'][1]:,} | {rows['after'][1]:,} |")


if __name__ == "__main__":
    main()
