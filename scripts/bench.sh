#!/bin/sh
# Builds keychainctl (the front and keychainctl-full), keychaind and keychain-bench (release) and runs
# the benchmark; arguments go to the bench. `swift run keychain-bench` alone builds only the bench,
# and the keychainctl reference needs both keychainctl executables next to it. Set SCRATCH to build
# somewhere other than .build, BUILD=debug for a debug build's figures (release by default). The
# report (Markdown) is the only thing on stdout; build output and progress go to stderr.
# `bench.sh --secret-service` runs scripts/bench-secret-service.sh instead: keychain-secret-service
# against gnome-keyring-daemon, side by side (docs/performance.md).
# `bench.sh --profiles [--runs N] [PROFILE…]`: what a user waits for on each TPM chip profile (swtpm, fast,
# typical, slow, old), whole keychainctl processes with their TPM commands (docs/performance.md, issue 39).
# `bench.sh --instructions [--daemon] [--functions]` runs scripts/warm-read-instructions.sh: callgrind's
# instructions per warm read, in-process or through keychaind.
set -eu
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--secret-service" ]; then shift; exec sh scripts/bench-secret-service.sh "$@"; fi
if [ "${1:-}" = "--instructions" ]; then shift; exec sh scripts/warm-read-instructions.sh "$@"; fi
BUILD=${BUILD:-release}
for product in keychainctl keychaind keychainctl-full; do
    swift build -c "$BUILD" --product "$product" ${SCRATCH:+--scratch-path "$SCRATCH"} >&2
done
exec swift run -c "$BUILD" ${SCRATCH:+--scratch-path "$SCRATCH"} keychain-bench "$@"
