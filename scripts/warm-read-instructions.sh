#!/bin/sh
# Instructions per warm getItem, counted by valgrind's callgrind: a count that does not move with the
# machine's load, where wall-clock rates here do (docs/performance.md).
#
# Two runs of `keychain-bench --warm-reads N` (one item, its key opened first, on a private swtpm),
# with N = READS and 5 x READS; the difference of their totals over the difference of N is one warm
# read, without the bench's start, swtpm and the first (cold) read. With --functions, also the
# functions whose own code takes most of a read (self instructions per read, from callgrind_annotate).
# With --daemon, the reads go through keychaind (`keychain-bench --daemon-warm-reads N`, one client):
# the client's instructions per read (the bench's process) and keychaind's, both under callgrind
# (keychaind through a `keychaind` beside a copy of the bench that runs the real one under valgrind).
# With --cold, in-process cold reads instead (`keychain-bench --cold-reads N`: the key unsealed again
# before each read), READS 20 by default.
#
#   scripts/warm-read-instructions.sh [--daemon | --cold] [--functions]
#       BUILD=release|debug (release), READS (2000), SCRATCH as for scripts/bench.sh
#
# valgrind 3.19 (Debian 12) dies in its own code at the first sigsuspend of a Swift program with an
# async main; scripts/valgrind-sigsuspend.c, preloaded, is the workaround (it says why).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-release}
FUNCTIONS=no
DAEMON=no
COLD=no
for arg in "$@"; do
    case $arg in
    --functions) FUNCTIONS=yes ;;
    --daemon) DAEMON=yes ;;
    --cold) COLD=yes ;;
    *) echo "usage: $0 [--daemon | --cold] [--functions]" >&2; exit 2 ;;
    esac
done
[ "$DAEMON$COLD" = yesyes ] && { echo "usage: $0 [--daemon | --cold] [--functions]" >&2; exit 2; }
if [ "$COLD" = yes ]; then READS=${READS:-20}; else READS=${READS:-2000}; fi
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)" >&2; exit 2; }
products="keychain-bench"
[ "$DAEMON" = yes ] && products="keychain-bench keychaind"
for product in $products; do swift build -c "$BUILD" --product "$product" ${SCRATCH:+--scratch-path "$SCRATCH"} >&2; done
bin="$(swift build -c "$BUILD" --show-bin-path ${SCRATCH:+--scratch-path "$SCRATCH"})"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM
cc -shared -fPIC -O2 -o "$work/sigsuspend.so" scripts/valgrind-sigsuspend.c
# valgrind 3.19's debuginfo reader gives up on the DWARF 5 that clang emits for CTSSCrypto's C (Swift's
# is DWARF 4): the programs run as copies without debug info (their symbols stay, for --functions).
objcopy --strip-debug "$bin/keychain-bench" "$work/keychain-bench"
[ "$DAEMON" = yes ] && objcopy --strip-debug "$bin/keychaind" "$work/keychaind"
bench="$work/keychain-bench"
mode=--warm-reads
[ "$COLD" = yes ] && mode=--cold-reads
if [ "$DAEMON" = yes ]; then
    # The bench starts the keychaind beside it: this one runs the real one under callgrind.
    mkdir "$work/bin"
    cp "$work/keychain-bench" "$work/bin/keychain-bench"
    {
        echo '#!/bin/sh'
        echo "LD_PRELOAD='$work/sigsuspend.so' exec valgrind --tool=callgrind --callgrind-out-file=\"\$WARM_READS_DAEMON_OUT\" \\"
        echo "    '$work/keychaind' \"\$@\" 2>>'$work/keychaind.log'"
    } >"$work/bin/keychaind"
    chmod +x "$work/bin/keychaind"
    bench="$work/bin/keychain-bench"
    mode=--daemon-warm-reads
fi
total() { sed -n 's/^totals: //p' "$1"; }
count() {
    WARM_READS_DAEMON_OUT="$work/daemon.$1.out" LD_PRELOAD="$work/sigsuspend.so" valgrind --tool=callgrind \
        --callgrind-out-file="$work/$1.out" "$bench" "$mode" "$1" >"$work/$1.report" 2>"$work/$1.log" || {
        cat "$work/$1.log" >&2
        [ -f "$work/keychaind.log" ] && cat "$work/keychaind.log" >&2
        exit 1
    }
}
small=$READS
large=$((READS * 5))
count "$small"
count "$large"
per_read() { echo $(( ($(total "$2") - $(total "$1")) / (large - small) )); }
if [ "$DAEMON" = yes ]; then
    echo "warm getItem through keychaind ($BUILD build): the client $(per_read "$work/$small.out" "$work/$large.out")" \
        "instructions per read, keychaind $(per_read "$work/daemon.$small.out" "$work/daemon.$large.out")" \
        "(callgrind, $small and $large reads); $(cat "$work/$large.report")"
else
    kind=warm
    [ "$COLD" = yes ] && kind=cold
    echo "$kind getItem ($BUILD build): $(per_read "$work/$small.out" "$work/$large.out") instructions per read" \
        "(callgrind: $(total "$work/$small.out") instructions for $small reads, $(total "$work/$large.out") for $large);" \
        "$(cat "$work/$large.report")"
fi
[ "$FUNCTIONS" = yes ] || exit 0

# The functions' own instructions per read: the difference of the two runs' profiles.
profile() {
    /usr/bin/python3 - "$1" "$2" $((large - small)) "$3" <<'PYTHON'
import re, subprocess, sys
def own(path):
    out = subprocess.run(["callgrind_annotate", "--inclusive=no", "--auto=no", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    counts = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+(\S.*?)(?:\s+\[.*\])?$", line)
        if m and "PROGRAM TOTALS" not in line:
            counts[m.group(2)] = int(m.group(1).replace(",", ""))
    return counts
a, b, n, who = own(sys.argv[1]), own(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / n, k) for k in b)
print(f"\n| {who}: instructions per read (the function's own) | function |\n|--:|---|")
for per_read, name in reversed(rows[-30:]):
    symbol = name.split(":", 1)[-1]
    demangled = subprocess.run(["swift", "demangle", "--simplified", "--compact", symbol],
                               capture_output=True, text=True).stdout.strip() or symbol
    print(f"| {per_read:,.0f} | `{demangled[:120]}` |")
PYTHON
}
if [ "$DAEMON" = yes ]; then
    profile "$work/$small.out" "$work/$large.out" "the client"
    profile "$work/daemon.$small.out" "$work/daemon.$large.out" keychaind
else
    profile "$work/$small.out" "$work/$large.out" in-process
fi
