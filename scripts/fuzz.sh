#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers at each trust boundary (Sources/keychain-fuzz; docs/security.md).
#   scripts/fuzz.sh --build                  builds .build/fuzz/debug/keychain-fuzz (libFuzzer + AddressSanitizer)
#   scripts/fuzz.sh --ci [TARGET...]         a short run of each target from its corpus: fails on a crash
#   scripts/fuzz.sh --campaign SECONDS [TARGET...]   SECONDS per target; the summary line of each at the end
#   scripts/fuzz.sh --replay [TARGET...]     runs the kept corpus once (a fixed crash stays fixed)
# Corpora are Fuzz/corpus/<target>/ (seeds from real sessions, and every crashing input once fixed);
# what a run finds beyond them goes to .build/fuzz/found/<target>/, crashes to .build/fuzz/crashes/.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/swift/usr/bin:$PATH

targets=(frame request credentials backup bundle identity attestation-request attestation-answer options pkcs11-uri
         dbus secret-service reader journal-relay peer-process)
# About a minute in all for CI.
ci_seconds=5
mode=${1:---ci}; shift || true
seconds=$ci_seconds
if [[ $mode == --campaign ]]; then seconds=${1:?"--campaign SECONDS [TARGET...]"}; shift; fi
(($# > 0)) && targets=("$@")

build=.build/fuzz
# The whole package instrumented (the parsers live in its modules), in a build directory of its own so that
# the normal build's objects stay as they are.
nice swift build --build-path "$build" --product keychain-fuzz -Xswiftc -DFUZZING -Xswiftc -sanitize=fuzzer,address \
  2> >(grep -v "Cannot export local symbol" >&2) | grep -v "Cannot export local symbol" | tail -n 3
fuzzer=$build/debug/keychain-fuzz
[[ $mode == --build ]] && exit 0

# Swift's backtracer would wait on a crashing, instrumented process; libFuzzer reports the crash itself.
export SWIFT_BACKTRACE=enable=no
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
mkdir -p "$build/crashes"
failed=()
for target in "${targets[@]}"; do
  corpus=Fuzz/corpus/$target
  found=$build/found/$target
  mkdir -p "$corpus" "$found"
  log=$build/$target.log
  if [[ $mode == --replay ]]; then
    args=(-runs=0 "$corpus")
  else
    # New inputs go to $found (first directory); the kept corpus is read, never written.
    # An input slower than 30 s is a hang (the dbus target's calls use a TPM, slow on a loaded machine).
    # dbus's inputs are calls answered on a store and a TPM: longer ones are mostly more of the same, slower.
    max_len=65536; [[ $target == dbus ]] && max_len=4096
    args=(-max_total_time="$seconds" -max_len=$max_len -timeout=30 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix="$build/crashes/$target-" "$found" "$corpus")
  fi
  if KEYCHAIN_FUZZ_TARGET=$target nice "$fuzzer" "${args[@]}" >"$log" 2>&1; then
    summary=$(grep -E "^(#[0-9]+.*(DONE|INITED)|stat::number_of_executed_units)" "$log" | tail -n 2 | tr '\n' ' ')
    echo "fuzz $target: ok: $summary"
  else
    echo "fuzz $target: FAILED (log: $log)"; grep -E "ERROR|==[0-9]+==|Fatal error|Test unit written" "$log" | head -n 8
    failed+=("$target")
  fi
done
((${#failed[@]} == 0)) || { echo "fuzz: ${failed[*]} failed"; exit 1; }
