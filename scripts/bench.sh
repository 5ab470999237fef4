#!/bin/sh
# Builds keychainctl (the front and keychainctl-full), keychaind and keychain-bench (release) and runs
# the benchmark; arguments go to the bench. `swift run keychain-bench` alone builds only the bench,
# and the keychainctl reference needs both keychainctl executables next to it. Set SCRATCH to build
# somewhere other than .build. The report (Markdown) is the only thing on stdout; build output and
# progress go to stderr.
# `bench.sh --secret-service` runs scripts/bench-secret-service.sh instead: keychain-secret-service
# against gnome-keyring-daemon, side by side (docs/performance.md).
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--secret-service" ]; then shift; exec sh scripts/bench-secret-service.sh "$@"; fi
swift build -c release --product keychainctl ${SCRATCH:+--scratch-path "$SCRATCH"} >&2
swift build -c release --product keychaind ${SCRATCH:+--scratch-path "$SCRATCH"} >&2
swift build -c release --product keychainctl-full ${SCRATCH:+--scratch-path "$SCRATCH"} >&2
exec swift run -c release ${SCRATCH:+--scratch-path "$SCRATCH"} keychain-bench "$@"
