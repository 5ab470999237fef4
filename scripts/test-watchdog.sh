#!/usr/bin/env bash
# Runs `swift test --skip-build ARGS…` with a deadline, and turns a hang into a failure that names it:
# when the deadline passes, the tests that started and never finished are printed (Swift Testing's
# "◇ Test NAME started." without its "✔/✘ Test NAME …" line), then the run is stopped (status 124).
#
#   scripts/test-watchdog.sh SECONDS [swift test arguments…]
set -uo pipefail
deadline=$1; shift
log=$(mktemp /tmp/keychain-test-log.XXXXXX)
# Line-buffered (stdbuf, inherited by the test bundle): a hung run is killed, and what it had not flushed
# (block-buffered into the pipe) was lost, names of the stuck tests included.
timeout --kill-after=30 "$deadline" stdbuf -oL -eL swift test --skip-build "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
if ((status == 124 || status == 137)); then
  echo >&2
  echo "test-watchdog: the tests did not finish in $deadline s; these started and never finished:" >&2
  # A name may start in several suites (the same test name in two suites): count starts against ends.
  /usr/bin/python3 - "$log" >&2 <<'PY'
import re, sys, collections
started, ended = collections.Counter(), collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"^\S+ (Test|Suite) (.+?) (started\.|passed|failed|skipped|recorded)", line)
    if not m or line.startswith("◇ Test case"):
        continue
    (started if m.group(3) == "started." else ended)[(m.group(1), m.group(2))] += 1
stuck = [(kind, name) for (kind, name), n in started.items() if n > ended[(kind, name)]]
for kind, name in stuck:
    print(f"  {kind.lower()}: {name}")
if not stuck:
    print("  (none named: the hang is outside a test, e.g. in the runner's start or end)")
PY
  # swift test starts the test bundle in a process group of its own: stopping swift test leaves it running.
  pkill -KILL -f -- "$PWD/\.build/.*\.xctest" || true
fi
rm -f "$log"
exit "$status"
