#!/usr/bin/env bash
# The tests of the daemon, the client, the Secret Service, the store and the TPM layer under ThreadSanitizer or
# AddressSanitizer (docs/security.md, "Sanitizers"). Fails on a failed test or on any sanitizer report.
#   scripts/sanitize.sh thread|address            every suite below
#   scripts/sanitize.sh thread|address --slice    the daemon's suites without the contract run again through it (CI)
# Each sanitizer has a build directory of its own (.build/tsan, .build/asan): the normal build stays as it is.
# Programs the tests start from this build (keychaind, keychainctl-full, keychain-secret-service) are
# instrumented too and write their reports to the same place; swtpm and dbus-daemon are not ours and are not.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH
kind=${1:?"thread|address [--slice]"}
slice=${2:-}
case $kind in
  thread) build=.build/tsan ;;
  address) build=.build/asan ;;
  *) echo "sanitize.sh: thread or address, not $kind" >&2; exit 2 ;;
esac

daemon='KeychainTests\.(Daemon\w*|KeptConnection|CredentialsSocket|RequestHandler|Transport|SerialExecutor|WarmRead|WarmState|Client|Wire|WireReader|OffThePool|EngineSharing|JournalRelay)Tests|KeychainBasicsTests\.HandoverTests'
suites=(
  "$daemon"
  'KeychainTests\.ContractThroughDaemonTests'
  'SecretServiceTests\.'
  'KeychainStoreTests\.|KeychainTests\.(Integrity|Rollback|ReaderRollback|StoreMeta|StoreTrustProcess|MigrationRace|RelativeStore)Tests'
  'TPM2Tests\.|KeychainTests\.(TPMTurn|FrozenTPM|EmbeddedTPMStart|EngineLifetime|TSSCrypto|Process)Tests'
)
[[ $slice == --slice ]] && suites=("$daemon")
# Preloads the (instrumented) exit probe into /usr/bin/openssl, which a sanitizer runtime cannot join.
skip='openSSLsCleanUpDoesNotRunAtExit'

start=$SECONDS
nice swift build --build-tests --sanitize="$kind" --build-path "$build" \
  2> >(grep -v "Cannot export local symbol" >&2) | grep -v "Cannot export local symbol" | tail -n 1
built=$((SECONDS - start))

reports=$(mktemp -d /tmp/keychain-sanitize.XXXXXX)
export SWIFT_BACKTRACE=enable=no
# A test's child (a test run again through keychaind, a command) may take this long: instrumented, it is slower.
export KEYCHAIN_TEST_CHILD_DEADLINE=600
if [[ $kind == thread ]]; then
  # tsan.supp says why each suppression is not a race of ours; its witness is checked first, so that a
  # toolchain that no longer needs it, or a suppression that hides a plain race, is seen.
  supp=$PWD/scripts/sanitizers/tsan.supp
  nice swiftc -sanitize=thread -g scripts/sanitizers/mutex-blind-spot.swift -o "$build/mutex-blind-spot"
  check() { TSAN_OPTIONS="halt_on_error=0:$2" "$build/mutex-blind-spot" "$1" 2>&1 | grep -c "WARNING: ThreadSanitizer" || true; }
  if (($(check mutex "") == 0)); then
    echo "sanitize.sh: a contended Synchronization.Mutex is no longer misreported: tsan.supp can go" >&2; exit 1
  fi
  if (($(check mutex "suppressions=$supp") > 0 || $(check race "suppressions=$supp") == 0)); then
    echo "sanitize.sh: tsan.supp does not do what it says (mutex-blind-spot.swift)" >&2; exit 1
  fi
  nice swiftc -parse-as-library -sanitize=thread -g scripts/sanitizers/continuation-blind-spot.swift -o "$build/continuation-blind-spot"
  if (($(TSAN_OPTIONS="halt_on_error=0:suppressions=$supp" "$build/continuation-blind-spot" 2>&1 | grep -c "WARNING: ThreadSanitizer" || true) == 0)); then
    echo "sanitize.sh: a continuation resumed before its task suspends is no longer misreported: handedOver's lock can go" >&2; exit 1
  fi
  export TSAN_OPTIONS="halt_on_error=0:second_deadlock_stack=1:suppressions=$supp:log_path=$reports/report"
else
  # Leaks are not looked for: the tests' processes are killed on purpose, and the runtime keeps its metadata.
  export ASAN_OPTIONS="detect_leaks=0:log_path=$reports/report"
fi

failed=0
for filter in "${suites[@]}"; do
  if ! nice scripts/test-watchdog.sh 2400 --build-path "$build" --filter "$filter" --skip "$skip" >"$reports/tests.log" 2>&1; then
    failed=1
    grep -E "✘" "$reports/tests.log" | head -n 20 >&2
  fi
  grep -E "^(✔|✘) Test run with" "$reports/tests.log" | awk -v suites="$filter" '{ print suites ": " $0 }' || true
done
found=$(cat "$reports"/report.* 2>/dev/null | grep -cE "(WARNING: ThreadSanitizer|ERROR: AddressSanitizer)" || true)
echo "sanitize.sh $kind: build ${built} s, tests $((SECONDS - start - built)) s, $found reports (in $reports)"
if ((found > 0)); then
  cat "$reports"/report.* | grep -E "^SUMMARY" | sort | uniq -c | sort -rn | head -n 20 >&2
  exit 1
fi
rm -rf "$reports"
exit "$failed"
