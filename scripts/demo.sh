#!/usr/bin/env bash
# The main job: install, build, and run `keychainctl demo` on an embedded software TPM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
# keychainctl is a small front that runs keychainctl-full, beside it, for everything but item commands
# through keychaind: build both.
swift build -c release --product keychainctl
swift build -c release --product keychainctl-full
exec .build/release/keychainctl demo "$@"
