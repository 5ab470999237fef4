#!/usr/bin/env python3
"""Warm reads through keychaind from C (bindings/c) beside Python's and Swift's, alternated (issue 42, docs/performance.md).

    scripts/bench-c.py [--reads N] [--runs R] [--bin DIR]

Each run: the C library's bench program (bindings/c/tests/bench.c, built with make into a temporary folder) on its own
keychaind and swtpm, as scripts/bench-python.py runs Python's: one item "k0" of the service "warm" (34 bytes, no access
control), N warm kc_get_item calls from one caller on its kept connection, and the client process's CPU time a read;
then Python's blocking form and `keychain-bench --daemon-warm-reads N` (the Swift library's client) as bench-python.py
measures them. Prints reads/s of each.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench_python", os.path.join(HERE, "bench-python.py"))
bench_python = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_python)
Daemon = bench_python.Daemon


def c_reads(program, reads):
    daemon = Daemon(passcode=False)
    try:
        done = subprocess.run([program, daemon.socket, str(reads)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"bench: {done.stderr}")
        # "C: N reads in S s, R reads/s, U µs of the client's CPU a read"
        words = done.stdout.split()
        return float(words[6]), float(words[8])
    finally:
        daemon.stop()


def main():
    args = bench_python.arguments()
    with tempfile.TemporaryDirectory(prefix="keychain-bench-c-") as out:
        subprocess.run(["make", "-s", "-C", os.path.join(HERE, "..", "bindings", "c"), f"O={out}", f"{out}/bench"], check=True)
        for run in range(1, args.runs + 1):
            rate, cpu_us = c_reads(os.path.join(out, "bench"), args.reads)
            blocking, py_cpu_us, _ = bench_python.python_reads(args.reads)
            swift = bench_python.swift_reads(os.environ["KEYCHAIN_BIN"], args.reads)
            line = (f"run {run} (load {os.getloadavg()[0]:.1f}): C {rate:,.0f} reads/s ({cpu_us:.0f} µs of the client's CPU "
                    f"a read); Python blocking {blocking:,.0f} reads/s ({py_cpu_us:.0f} µs)")
            line += f"; Swift library (keychain-bench --daemon-warm-reads) {swift[0]:,} reads/s" if swift else "; no keychain-bench here"
            print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
