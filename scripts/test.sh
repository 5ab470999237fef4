#!/usr/bin/env bash
# Installs what the tests need and runs them all: each suite starts its own swtpm (and tpm2-abrmd).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
python3 scripts/doc-snippets.py
swift build --build-tests
swift test --skip-build "$@"
