#!/usr/bin/env bash
# The main job: install, build, and run `keychainctl demo` on an embedded software TPM.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
swift build -c release --product keychainctl
exec .build/release/keychainctl demo "$@"
