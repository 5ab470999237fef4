#!/bin/sh
# keychain-secret-service against gnome-keyring-daemon, side by side in one run on this machine
# (docs/performance.md). Each provider gets its own private dbus-daemon; ours is found by activation
# and keeps a store with the embedded software TPM, which is stopped (SIGSTOP) during the warm
# measures: a warm read that sent a TPM command would hang. gnome-keyring runs headless
# (--unlock --components=secrets). The providers are measured interleaved, call by call (one call of
# each in turn), so the machine's load falls on them alike; ROUNDS times (default 2).
# BEFORE=path: another keychain-secret-service (an earlier commit's build) measured in the same
# calls on a bus and store of its own, for a before/after in one run.
# Needs: dbus-daemon, gnome-keyring, libsecret-tools, python3-secretstorage, python3-keyring.
set -eu
cd "$(dirname "$0")/.."
# PROVIDER: a keychain-secret-service already built (else the release build here).
if [ -z "${PROVIDER:-}" ]; then
  swift build -c release --product keychain-secret-service >&2
  PROVIDER="$(swift build -c release --show-bin-path)/keychain-secret-service"
fi
provider=$PROVIDER
work=$(mktemp -d /tmp/keychain-ss-bench.XXXXXX)
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  for s in "$work"/*/store/swtpm/swtpm.pid; do [ -f "$s" ] && kill -CONT "$(cat "$s")" 2>/dev/null && kill "$(cat "$s")" 2>/dev/null || true; done
  sleep 0.5
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

bus() {  # bus NAME [SERVICEDIR-LINE]: starts a private dbus-daemon, sets $address
  mkdir -p "$work/$1/services" "$work/$1/home" "$work/$1/run"
  chmod 700 "$work/$1/run"
  cat > "$work/$1/bus.conf" <<CONF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:path=$work/$1/socket</listen>
<servicedir>$work/$1/services</servicedir>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy></busconfig>
CONF
  dbus-daemon --config-file="$work/$1/bus.conf" --nofork --nopidfile &
  pids="$pids $!"
  while [ ! -S "$work/$1/socket" ]; do sleep 0.05; done
  address="unix:path=$work/$1/socket"
}

ours() {  # ours NAME PROVIDER: a bus activating PROVIDER with a store of its own; sets $address, $swtpm_pid
  bus "$1"
  printf '[D-BUS Service]\nName=org.freedesktop.secrets\nExec=%s --store %s\n' "$2" "$work/$1/store" \
    > "$work/$1/services/org.freedesktop.secrets.service"
  # Start it (activation) and make the store, so the swtpm's pid is known before the first measure.
  DBUS_SESSION_BUS_ADDRESS=$address secret-tool search nothing here >/dev/null 2>&1 || true
  swtpm_pid=$(cat "$work/$1/store/swtpm/swtpm.pid")
}
ours ours "$provider"
ours_address=$address ours_swtpm=$swtpm_pid
if [ -n "${BEFORE:-}" ]; then
  ours before "$BEFORE"
  before_address=$address before_swtpm=$swtpm_pid
fi

bus gnome
gnome_address=$address
printf pw | env DBUS_SESSION_BUS_ADDRESS="$gnome_address" HOME="$work/gnome/home" XDG_RUNTIME_DIR="$work/gnome/run" \
  gnome-keyring-daemon --foreground --unlock --components=secrets >/dev/null 2>&1 &
pids="$pids $!"
until DBUS_SESSION_BUS_ADDRESS=$gnome_address dbus-send --session --print-reply --dest=org.freedesktop.DBus / \
      org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q true; do sleep 0.1; done

rounds=${ROUNDS:-2}
i=1
while [ "$i" -le "$rounds" ]; do
  echo "round $i: keychain-secret-service${BEFORE:+, before ($BEFORE)} and gnome-keyring, interleaved" >&2
  # The same client environment for all: only the bus differs.
  HOME="$work/gnome/home" XDG_RUNTIME_DIR="$work/gnome/run" /usr/bin/python3 scripts/bench-secret-service.py \
    "ours=$ours_address,freeze=$ours_swtpm" ${BEFORE:+"before=$before_address,freeze=$before_swtpm"} "gnome=$gnome_address" \
    > "$work/round.$i.json"
  i=$((i + 1))
done
/usr/bin/python3 - "$work" "$rounds" "${BEFORE:+before}" <<'PY'
import json, os, sys
work, rounds, before = sys.argv[1], int(sys.argv[2]), sys.argv[3] == 'before'
runs = [json.load(open('%s/round.%d.json' % (work, i))) for i in range(1, rounds + 1)]
def load(name):
    return [run[name] for run in runs]
ours, gnome = load('ours'), load('gnome')
earlier = load('before') if before else None
print('| measure (median ms; provider CPU µs and thread switches per call) | keychain-secret-service |'
      + (' before |' if before else '') + ' gnome-keyring | ratio |' + (' before / gnome |' if before else ''))
print('|---|---|' + ('---|' if before else '') + '---|---|' + ('---|' if before else ''))
def row(values): return ' / '.join('%.2f' % x for x in values)
def ratio(a, b): return ' / '.join('%.2fx' % (x / y) if y else '-' for x, y in zip(a, b))
for key in ours[0]:
    a = [r[key] for r in ours]; g = [r[key] for r in gnome]
    cells = [key, row(a)] + ([row([r[key] for r in earlier])] if before else []) + [row(g), ratio(a, g)]
    if before: cells.append(ratio([r[key] for r in earlier], g))
    print('| ' + ' | '.join(cells) + ' |')
PY
