#!/usr/bin/env bash
# Stops a software TPM started with swtpm/start.sh DIR (its state stays: starting it again is a reboot).
set -euo pipefail
dir=${1:?usage: swtpm/stop.sh DIR}
[ -f "$dir/swtpm.pid" ] && kill "$(cat "$dir/swtpm.pid")" 2>/dev/null || true
rm -f "$dir/swtpm.pid"
