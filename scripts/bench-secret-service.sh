#!/bin/sh
# keychain-secret-service against gnome-keyring-daemon, side by side in one run on this machine
# (docs/performance.md). Each provider gets its own private dbus-daemon; ours is found by activation
# and keeps a store with the embedded software TPM, which is stopped (SIGSTOP) during the warm
# measures: a warm read that sent a TPM command would hang. gnome-keyring runs headless
# (--unlock --components=secrets). The two are measured in turn, ROUNDS times (default 2).
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
  [ -f "$work/ours/store/swtpm/swtpm.pid" ] && kill "$(cat "$work/ours/store/swtpm/swtpm.pid")" 2>/dev/null || true
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

bus ours
printf '[D-BUS Service]\nName=org.freedesktop.secrets\nExec=%s --store %s\n' "$provider" "$work/ours/store" \
  > "$work/ours/services/org.freedesktop.secrets.service"
ours_address=$address
# Start it (activation) and make the store, so the swtpm's pid is known before the first measure.
DBUS_SESSION_BUS_ADDRESS=$ours_address secret-tool search nothing here >/dev/null 2>&1 || true
swtpm_pid=$(cat "$work/ours/store/swtpm/swtpm.pid")

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
  echo "round $i: keychain-secret-service" >&2
  DBUS_SESSION_BUS_ADDRESS=$ours_address /usr/bin/python3 scripts/bench-secret-service.py --freeze "$swtpm_pid" > "$work/ours.$i.json"
  echo "round $i: gnome-keyring" >&2
  DBUS_SESSION_BUS_ADDRESS=$gnome_address HOME="$work/gnome/home" XDG_RUNTIME_DIR="$work/gnome/run" \
    /usr/bin/python3 scripts/bench-secret-service.py > "$work/gnome.$i.json"
  i=$((i + 1))
done
/usr/bin/python3 - "$work" "$rounds" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print('| measure (median ms) | keychain-secret-service | gnome-keyring | ratio |')
print('|---|---|---|---|')
ours = [json.load(open('%s/ours.%d.json' % (work, i))) for i in range(1, rounds + 1)]
gnome = [json.load(open('%s/gnome.%d.json' % (work, i))) for i in range(1, rounds + 1)]
for key in ours[0]:
    a = [r[key] for r in ours]; b = [r[key] for r in gnome]
    print('| %s | %s | %s | %s |' % (key, ' / '.join('%.2f' % x for x in a), ' / '.join('%.2f' % x for x in b),
                                     ' / '.join('%.2fx' % (x / y) for x, y in zip(a, b))))
PY
