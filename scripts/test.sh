#!/usr/bin/env bash
# Installs what the tests need and runs them all: each suite starts its own swtpm (and tpm2-abrmd).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
python3 scripts/doc-snippets.py
# No warnings: a warning is an error here, as in CI.
swift build --build-tests -Xswiftc -warnings-as-errors
# A hung test must not hold CI for 90 minutes: 20 minutes is ample (the suite takes about 3 alone, 14 on a
# machine loaded 20 deep). A hang fails the run naming the tests that started and never finished.
scripts/test-watchdog.sh "${KEYCHAIN_TEST_DEADLINE:-1200}" "$@"
# The package under a booted systemd (a cached Debian 12 root, the release build made once): the whole run only.
if (($# == 0)); then timeout 2400 scripts/test-systemd.sh; else echo "test.sh: a filter was given: the systemd tests (scripts/test-systemd.sh) were not run"; fi
# A user's own package, outside the checkout, finding keychaind on PATH: the whole run only.
if (($# == 0)); then timeout 1200 scripts/test-outside-package.sh; fi
