#!/usr/bin/env python3
"""Warm reads through keychaind from Python (bindings/python) beside Swift's, alternated (issue 42, docs/performance.md).

    scripts/bench-python.py [--reads N] [--runs R] [--bin DIR]

Each run: keychaind on a private swtpm (tests/keychaind.py, binaries from --bin or KEYCHAIN_BIN, default .build/debug),
one item "k0" of the service "warm" (34 bytes, no access control), then N warm get_item calls from one caller on its kept
connection: the blocking form (and the client process's CPU time per read, which the load moves less), then the asyncio form; then `keychain-bench --daemon-warm-reads N` from the same folder
(the Swift library's client, the same item, one caller, its own keychaind of the same build). Prints reads/s of each.
"""
import argparse
import asyncio
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "bindings", "python", "src"), os.path.join(HERE, "..", "bindings", "python", "tests")]

import keychain  # noqa: E402
from keychaind import Daemon  # noqa: E402

SECRET = "a secret of 32 bytes, more or less"


def python_reads(reads):
    daemon = Daemon(passcode=False)
    try:
        vault = keychain.create_keychain(service="warm", socket=daemon.socket)
        vault.set_item("k0", SECRET)
        assert vault.get_item("k0") == SECRET
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(reads):
            if vault.get_item("k0") != SECRET:
                raise SystemExit("get_item returned another value")
        blocking = reads / (time.perf_counter() - started)
        cpu_us = (time.process_time() - cpu) / reads * 1e6

        async def run():
            store = keychain.create_async_keychain(service="warm", socket=daemon.socket)
            assert await store.get_item("k0") == SECRET
            began = time.perf_counter()
            for _ in range(reads):
                if await store.get_item("k0") != SECRET:
                    raise SystemExit("get_item returned another value")
            return reads / (time.perf_counter() - began)
        return blocking, cpu_us, asyncio.run(run())
    finally:
        daemon.stop()


def swift_reads(folder, reads):
    bench = os.path.join(folder, "keychain-bench")
    if not os.path.exists(bench):
        return None
    done = subprocess.run([bench, "--daemon-warm-reads", str(reads)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"keychain-bench: {done.stderr}")
    # "warm getItem through keychaind, one caller: N reads in S s, R reads/s, 0 TPM commands"
    return int(done.stdout.split(" reads/s")[0].rsplit(" ", 1)[1]), done.stdout.strip()


def arguments():
    """--reads, --runs and --bin (exported as KEYCHAIN_BIN for the daemons): this script's and bench-c.py's."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bin", default=os.environ.get("KEYCHAIN_BIN") or os.path.join(HERE, "..", ".build", "debug"))
    args = parser.parse_args()
    os.environ["KEYCHAIN_BIN"] = os.path.abspath(args.bin)
    return args


def main():
    args = arguments()
    for run in range(1, args.runs + 1):
        blocking, cpu_us, in_loop = python_reads(args.reads)
        swift = swift_reads(os.environ["KEYCHAIN_BIN"], args.reads)
        line = f"run {run} (load {os.getloadavg()[0]:.1f}): Python blocking {blocking:,.0f} reads/s ({cpu_us:.0f} µs of the client's CPU a read), asyncio {in_loop:,.0f} reads/s"
        line += f"; Swift library (keychain-bench --daemon-warm-reads) {swift[0]:,} reads/s" if swift else "; no keychain-bench here"
        print(line, flush=True)


if __name__ == "__main__":
    main()
