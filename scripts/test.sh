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
# keychaind under mixed load from 16 clients of five uids with one TPM stall (issue 38 item 13): CI runs a
# 2-minute slice; docs/performance.md ("Soak") has a 30-minute run's figures. The whole run only.
if (($# == 0)); then timeout 600 python3 scripts/soak.py --short; fi
# The package under a booted systemd, built once (dpkg-buildpackage) and installed as devices get it, on two cached
# Debian 12 roots: bookworm's main alone (the point release, no security updates) and one with bookworm-updates and
# bookworm-security, whatever this machine's own apt state. The whole run only.
if (($# == 0)); then
  deb=$(timeout 1800 scripts/package-deb.sh | tail -n1)
  timeout 1800 scripts/test-systemd.sh --deb "$deb" --updates no
  timeout 1800 scripts/test-systemd.sh --deb "$deb" --updates yes
else echo "test.sh: a filter was given: the package's tests (scripts/test-systemd.sh) were not run"; fi
# A user's own package, outside the checkout, finding keychaind on PATH: the whole run only.
if (($# == 0)); then timeout 1200 scripts/test-outside-package.sh; fi
