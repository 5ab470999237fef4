#!/usr/bin/env python3
"""Warm reads through keychaind from every door a program in another language uses, side by side in one run, alternated
(issue 42, docs/performance.md "The bindings side by side").

    scripts/bench-bindings.py [--reads N] [--runs R] [--bin DIR]

Each run, one after another, each client on a keychaind and swtpm of its own (binaries from --bin or KEYCHAIN_BIN, default
.build/debug), one item of 34 bytes and no access control read N times warm by one caller:
  C       bindings/c's bench program (built with make into a temporary folder), kept connection;
  Python  bindings/python's blocking form (scripts/bench-python.py), kept connection;
  Node    bindings/node/bench/warm-read.js, one client, kept connection (after 3,000 reads that warm V8's compiler);
  Swift KeychainClient   `keychain-bench --client-warm-reads N`: the small client, a connection per call;
  Swift library          `keychain-bench --daemon-warm-reads N`: the library's client, kept connections.
Prints each run's reads/s and, at the end, the median of each and C's ratio to each Swift client.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import importlib.util

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_python = load("bench_python", "bench-python.py")
bench_c = load("bench_c", "bench-c.py")


def rate_of(command, pattern, timeout=900):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"bench-bindings: {' '.join(command)}: {done.stderr.strip()[-2000:]}")
    match = re.search(pattern, done.stdout)
    if not match:
        raise SystemExit(f"bench-bindings: no rate in the output of {' '.join(command)}: {done.stdout.strip()[-2000:]}")
    return float(match.group(1).replace(",", ""))


def main():
    args = bench_python.arguments()
    folder = os.environ["KEYCHAIN_BIN"]
    bench = os.path.join(folder, "keychain-bench")
    if not os.path.exists(bench):
        raise SystemExit(f"bench-bindings: no keychain-bench in {folder} (swift build --product keychain-bench)")
    node = os.path.join(HERE, "..", "bindings", "node", "bench", "warm-read.js")
    rates = {name: [] for name in ("C", "Python", "Node", "Swift KeychainClient", "Swift library")}
    with tempfile.TemporaryDirectory(prefix="keychain-bench-bindings-") as out:
        subprocess.run(["make", "-s", "-C", os.path.join(HERE, "..", "bindings", "c"), f"O={out}", f"{out}/bench"], check=True)
        for run in range(1, args.runs + 1):
            rates["C"].append(bench_c.c_reads(os.path.join(out, "bench"), args.reads)[0])
            rates["Python"].append(bench_python.python_reads(args.reads)[0])
            rates["Node"].append(rate_of(["node", node, "1", str(args.reads)], r"1 client × \d+ warm reads through keychaind: (\d+) reads/s"))
            rates["Swift KeychainClient"].append(rate_of([bench, "--client-warm-reads", str(args.reads)], r"(\d+) reads/s"))
            rates["Swift library"].append(rate_of([bench, "--daemon-warm-reads", str(args.reads)], r"(\d+) reads/s"))
            print(f"run {run} (load {os.getloadavg()[0]:.1f}): "
                  + ", ".join(f"{name} {values[-1]:,.0f}" for name, values in rates.items()) + " reads/s", flush=True)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print("medians: " + ", ".join(f"{name} {value:,.0f} reads/s" for name, value in medians.items()))
    print(f"C against Swift's KeychainClient {medians['C'] / medians['Swift KeychainClient']:.2f}×, "
          f"against the Swift library {medians['C'] / medians['Swift library']:.2f}×")


if __name__ == "__main__":
    sys.exit(main())
