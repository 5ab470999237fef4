#!/usr/bin/env bash
# Times a unit's start with its credential (docs/performance.md): through keychaind's credentials socket, warm
# (keychaind running, the item read before), started at boot (keychaind running, the item not read since its
# start) and cold (keychaind and its TPM stopped: socket activation starts them), against systemd's
# own LoadCredentialEncrypted= (systemd-creds encrypt --with-key=host, and --with-key=tpm2 on a swtpm) and a plain
# LoadCredential= file, in the booted Debian 12 of scripts/systemd-container.sh with the package
# installed. Also the package's size and install time.
#
#   scripts/bench-credentials.sh [--deb FILE] [--runs N]
#
# Each figure is the wall time of `systemctl start` of a Type=oneshot unit whose ExecStart is /bin/true, so
# it is the unit's start with its credential in $CREDENTIALS_DIRECTORY; the median and the spread of N runs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/systemd-container.sh
deb="" runs=20
while (($#)); do
  case $1 in
    --deb) deb=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: $0 [--deb FILE] [--runs N]" >&2; exit 2 ;;
  esac
done
[ -n "$deb" ] || deb=$(scripts/package-deb.sh | tail -n1)
trap 'container_stop bench >/dev/null 2>&1 || true' EXIT
# systemd-creds' TPM2 key: systemd 252 takes a TCTI as its TPM2 device ("swtpm:path=…", in
# SYSTEMD_TPM2_DEVICE for PID 1, which decrypts LoadCredentialEncrypted= at each start), so a swtpm of its own
# in the container stands in for /dev/tpmrm0 (the kernel here has neither CUSE nor vtpm_proxy for a device).
CONTAINER_NSPAWN_ARGS="--setenv=SYSTEMD_TPM2_DEVICE=swtpm:path=/run/swtpm-bench/tpm" container_boot bench
inside() { container_exec bench "$@"; }
inside sh -c 'mkdir -p /run/swtpm-bench /var/lib/swtpm-bench && systemd-run -q --unit=swtpm-bench swtpm socket --tpm2 \
  --tpmstate dir=/var/lib/swtpm-bench --server type=unixio,path=/run/swtpm-bench/tpm --ctrl type=unixio,path=/run/swtpm-bench/tpm.ctrl \
  --flags not-need-init,startup-clear && for i in $(seq 100); do [ -S /run/swtpm-bench/tpm ] && exit 0; sleep 0.1; done; exit 1' \
  || { echo "the swtpm for systemd-creds did not start" >&2; exit 1; }
container_put bench "$deb" /root/
echo "package: $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB; installed size $(dpkg-deb -f "$deb" Installed-Size) KiB"
start=$(date +%s.%N)
inside env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "/root/$(basename "$deb")" >/dev/null 2>&1
echo "apt-get install ./$(basename "$deb"): $(echo "$(date +%s.%N) - $start" | bc) s"

inside sh -c 'head -c 32 /dev/urandom >/root/secret
keychainctl credential set bench-keychain.service secret </root/secret || echo "credential set failed" >&2
systemd-creds encrypt --with-key=host --name=secret /root/secret /root/secret.cred
systemd-creds encrypt --with-key=tpm2 --tpm2-device=swtpm:path=/run/swtpm-bench/tpm --name=secret /root/secret /root/secret.tpm2.cred 2>/dev/null
mkdir -p /etc/credstore && cp /root/secret /etc/credstore/secret
write() { printf "[Service]\nType=oneshot\nDynamicUser=yes\n%s\nExecStart=/bin/true\n" "$2" >/etc/systemd/system/$1.service; }
write bench-keychain "LoadCredential=secret:/run/keychain/credentials.sock"
write bench-encrypted "LoadCredentialEncrypted=secret:/root/secret.cred"
write bench-tpm2 "LoadCredentialEncrypted=secret:/root/secret.tpm2.cred"
write bench-plain "LoadCredential=secret:/etc/credstore/secret"
write bench-none ""
systemctl daemon-reload'

# One figure: N starts of UNIT (before each, BEFORE runs as a command inside, HOST_BEFORE here); milliseconds, sorted.
measure() {
  local unit=$1 before=${2:-true} host_before=${3:-true} i t0 t1
  for i in $(seq 1 "$runs"); do
    inside sh -c "$before" >/dev/null 2>&1 || echo "$unit: the preparation before start $i failed (its figure is not the row's case)" >&2
    $host_before
    t0=$(date +%s%N)
    inside systemctl start "$unit" || { echo "$unit failed to start" >&2; exit 1; }
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000))
  done | sort -n | awk '{a[NR]=$1} END {printf "median %.1f ms (min %.1f, max %.1f, n %d)\n", a[int((NR+1)/2)]/1000, a[1]/1000, a[NR]/1000, NR}'
}
inside systemctl start bench-keychain.service || { inside journalctl --no-pager -n 30; exit 1; }  # keychaind up, the item read once
echo "no credential:                         $(measure bench-none)"
echo "LoadCredential= file:                  $(measure bench-plain)"
echo "LoadCredentialEncrypted= (host key):   $(measure bench-encrypted)"
# PID 1's decryption leaves its sessions (and objects) in the TPM when its child exits: /dev/tpmrm0's resource
# manager flushes them at close, a bare swtpm does not, and the third start failed ("out of memory for session
# contexts", status 243/CREDENTIALS). So they are flushed from here (tpm2-tools) before each start, outside the timing.
flush_tpm2() {
  local what
  for what in -t -l -s; do
    TPM2TOOLS_TCTI="swtpm:path=/proc/$(container_leader bench)/root/run/swtpm-bench/tpm" tpm2_flushcontext "$what" >/dev/null 2>&1 || true
  done
}
echo "LoadCredentialEncrypted= (tpm2 key):   $(measure bench-tpm2 true flush_tpm2)"
echo "keychaind, warm:                       $(measure bench-keychain)"
# reset-failed: six restarts in 10 s would hit systemd's start limit (StartLimitBurst=5) and fail the unit.
stop_keychaind='systemctl stop keychaind.service; systemctl reset-failed keychaind.service keychaind.socket'
echo "keychaind, cold, embedded swtpm (keychaind and its swtpm stopped before each: a TPM reset too): $(measure bench-keychain "$stop_keychaind")"

# A device with a TPM: the TPM runs whether keychaind does or not, as /dev/tpmrm0 does, and as systemd-creds' swtpm
# above. A swtpm unit of its own stands in for it (the kernel here makes no /dev/tpmrm0), keychaind reaches it by
# KEYCHAIN_TCTI (a drop-in) with a store of its own; "cold" is then keychaind's start alone, and a restart of that
# swtpm (a TPM reset, as at a reboot) before each start is the first credential after a boot (reset-failed: ten
# restarts would hit the start limit, as for keychaind).
inside sh -c 'mkdir -p /run/swtpm-keychain /var/lib/swtpm-keychain && systemd-run -q --unit=swtpm-keychain -p Restart=no swtpm socket --tpm2 \
  --tpmstate dir=/var/lib/swtpm-keychain --server type=unixio,path=/run/swtpm-keychain/tpm,mode=0666 \
  --ctrl type=unixio,path=/run/swtpm-keychain/tpm.ctrl,mode=0666 --flags not-need-init,startup-clear \
  && for i in $(seq 100); do [ -S /run/swtpm-keychain/tpm ] && exit 0; sleep 0.1; done; exit 1' \
  || { echo "the swtpm standing in for /dev/tpmrm0 did not start" >&2; exit 1; }
inside sh -c 'systemctl stop keychaind.service && mkdir -p /etc/systemd/system/keychaind.service.d \
  && printf "[Service]\nEnvironment=KEYCHAIN_TCTI=swtpm:path=/run/swtpm-keychain/tpm\nExecStart=\nExecStart=/usr/sbin/keychaind --store /var/lib/keychain/store-tpm --groups /etc/keychain/groups.d --credentials-socket /run/keychain/credentials.sock\n" \
     >/etc/systemd/system/keychaind.service.d/bench-tpm.conf && systemctl daemon-reload \
  && keychainctl credential set bench-keychain.service secret </root/secret && systemctl start bench-keychain.service' \
  || { inside journalctl --no-pager -n 30; exit 1; }
echo "keychaind on a TPM that runs, warm:     $(measure bench-keychain)"
echo "keychaind on a TPM that runs, cold (keychaind stopped before each): $(measure bench-keychain "$stop_keychaind")"
reset_tpm='systemctl reset-failed swtpm-keychain.service; systemctl restart swtpm-keychain.service; for i in $(seq 100); do swtpm_ioctl --unix /run/swtpm-keychain/tpm.ctrl -c && break; sleep 0.05; done'
echo "keychaind on a TPM that runs, cold after a TPM reset (keychaind stopped, the TPM restarted before each): $(measure bench-keychain \
  "$stop_keychaind; $reset_tpm")"
# keychaind started at boot (the package enables keychaind.service): the boot's first unit finds it running, its
# store open, and nothing read since its start. Before each start, outside the timing: keychaind restarted, then
# waited for until its "ready" line (it listens) is in the journal; no client connects in between.
started='systemctl reset-failed keychaind.service keychaind.socket; systemctl restart keychaind.service
pid=$(systemctl show -p MainPID --value keychaind.service)
for i in $(seq 200); do journalctl -q -o cat _PID=$pid | grep -q "^keychaind: ready" && exit 0; sleep 0.05; done; exit 1'
# systemd's TPM2 credential once more, just before the rows it is compared with (the load drifts over a run).
echo "LoadCredentialEncrypted= (tpm2 key), again: $(measure bench-tpm2 true flush_tpm2)"
echo "keychaind started at boot, the credential's first read (keychaind restarted and ready before each, the TPM running): $(measure bench-keychain "$started")"
echo "keychaind started at boot after a TPM reset, the credential's first read (the TPM restarted, then keychaind restarted and ready, before each): $(measure bench-keychain \
  "$reset_tpm; $started")"
