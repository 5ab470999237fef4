#!/usr/bin/env bash
# The keychain under a real systemd (issue 20): builds the Debian package once (scripts/package-deb.sh),
# boots a Debian 12 with systemd as PID 1 (scripts/systemd-container.sh), installs the package there with
# `apt-get install ./keychain-linux_….deb` and checks what a device's administrator and users rely on.
#
#   scripts/test-systemd.sh [--deb FILE] [--updates no|yes]
#
# --updates: which Debian 12 the device is (scripts/systemd-container.sh, CONTAINER_UPDATES): `no`, bookworm's
# main alone (the point release, no security updates); `yes`, with bookworm-updates and bookworm-security.
#
# Needs root (debootstrap, nspawn, overlay mounts). A machine that cannot boot the container fails the
# run and says why; nothing here is skipped. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/systemd-container.sh
source scripts/test-systemd-units.sh

deb=""
while (($#)); do
  case $1 in
    --deb) deb=$2; shift 2 ;;
    --updates) CONTAINER_UPDATES=$2; shift 2 ;;
    *) echo "usage: $0 [--deb FILE] [--updates no|yes]" >&2; exit 2 ;;
  esac
done
case $CONTAINER_UPDATES in no|yes) ;; *) echo "$0: --updates is no or yes, not '$CONTAINER_UPDATES'" >&2; exit 2 ;; esac

passed=0 failed=0
failures=()
pass() { passed=$((passed + 1)); echo "  ok: $1"; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "  FAILED: $1"; [ -n "${2:-}" ] && sed 's/^/    /' <<<"$2"; }
finish() {
  container_stop pkg >/dev/null 2>&1 || true
  echo
  for f in "${failures[@]}"; do echo "failed: $f"; done
  echo "systemd (bookworm$([ "$CONTAINER_UPDATES" = yes ] && echo ' with its updates and security archives' || echo ' main alone')): $passed passed, $failed failed"
  ((failed == 0))
  exit
}
trap 'fail "interrupted"; finish' INT TERM
# `in_container CMD…`: the command inside the booted container, as root.
in_container() { container_exec pkg "$@"; }
# `as_user NAME CMD…`: the command inside the container as NAME (its uid, gid and groups), as a login would.
as_user() { local user=$1; shift; in_container setpriv --reuid="$user" --regid="$user" --init-groups -- env HOME=/home/"$user" "$@"; }
# A DynamicUser=yes oneshot unit NAME.service given the credential ID from keychaind's credentials
# socket, its ExecStart= the rest of the arguments run on the credential's file:
# `credential_unit db db-password /usr/bin/cat` writes db.service and reloads the manager.
credential_unit() {
  local unit=$1 id=$2; shift 2
  in_container sh -c "cat >/etc/systemd/system/$unit.service <<UNIT
[Service]
Type=oneshot
DynamicUser=yes
LoadCredential=$id:/run/keychain/credentials.sock
ExecStart=$* \\\${CREDENTIALS_DIRECTORY}/$id
UNIT
systemctl daemon-reload"
}

if [ "$(id -u)" -ne 0 ]; then fail "needs root (debootstrap, systemd-nspawn, overlay mounts)"; finish; fi

echo "== package"
if [ -z "$deb" ]; then
  deb=$(scripts/package-deb.sh | tail -n1) || { fail "scripts/package-deb.sh failed"; finish; }
fi
[ -f "$deb" ] && pass "built $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB)" || { fail "no package at '$deb'"; finish; }
bench_deb=$(dirname "$deb")/$(basename "$deb" | sed 's/^keychain-linux_/keychain-linux-bench_/')
[ -f "$bench_deb" ] || { fail "no benchmark package beside it at '$bench_deb'"; finish; }
if ! command -v lintian >/dev/null; then fail "lintian is not installed (scripts/setup-debian.sh installs it)"
else
  out=$(lintian --tag-display-limit 0 "$deb" "$bench_deb" 2>&1 | grep -v '^running with root privileges')
  grep -q '^[EW]:' <<<"$out" && fail "lintian: no errors or warnings on the packages" "$out" \
    || pass "lintian: no errors or warnings on $(basename "$deb") and $(basename "$bench_deb")"
fi
# Hardening of the executables (issue 38 item 10): full RELRO (BIND_NOW) and PIE on every ELF file either package
# installs. lintian's info tag hardening-no-fortify-functions stays: fortify rewrites C calls whose buffer size the
# compiler knows, and the calls into glibc come from Swift (bounds-checked) and the static Swift runtime; the C shim
# (CTSSCrypto) is built with -D_FORTIFY_SOURCE=2 and uses no call fortify would rewrite (docs/daemon.md).
hard_dir=$(mktemp -d); dpkg-deb -x "$deb" "$hard_dir"; dpkg-deb -x "$bench_deb" "$hard_dir"
weak=""; elves=0
while IFS= read -r -d '' f; do
  head -c4 "$f" | grep -q $'^\x7fELF' || continue
  elves=$((elves + 1))
  dyn=$(readelf -d "$f"); prog=$(readelf -lW "$f")
  grep -q 'BIND_NOW' <<<"$dyn" && grep -q 'GNU_RELRO' <<<"$prog" && grep -q 'Flags:.*PIE' <<<"$dyn" || weak+=" ${f#"$hard_dir"}"
done < <(find "$hard_dir" -type f -print0)
rm -rf "$hard_dir"
((elves > 0)) && [ -z "$weak" ] && pass "every one of the $elves executables is PIE with full RELRO (BIND_NOW)" \
  || fail "every executable is PIE with full RELRO (BIND_NOW)" "$elves ELF files; without:$weak"
# An appliance's budget (issue 37): the runtime package at most 10 MB to download and 25 MiB installed.
bytes=$(stat -c %s "$deb")
installed=$(dpkg-deb -f "$deb" Installed-Size)
((bytes <= 10000000)) && pass "the runtime package is $bytes bytes (at most 10 MB)" || fail "the runtime package is at most 10 MB" "$bytes bytes"
((installed <= 25 * 1024)) && pass "the runtime package installs $installed KiB (at most 25 MiB)" \
  || fail "the runtime package installs at most 25 MiB" "Installed-Size: $installed KiB"
# Nothing it needs is newer than the Debian 12 the device runs: checked by installing it below, on bookworm's
# main alone (--updates no) and on an updated Debian 12 (--updates yes).
pass "Depends: $(dpkg-deb -f "$deb" Depends)"

echo "== boot"
start=$(date +%s.%N)
if ! boot_log=$(container_boot pkg 2>&1); then fail "the container did not boot: this machine cannot run systemd in nspawn" "$boot_log"; finish; fi
pass "booted a Debian 12 with systemd $(in_container systemctl --version | head -n1 | awk '{print $2}') as PID 1 in $(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s"

suites=$(in_container sh -c "awk '/^deb /{print \$3}' /etc/apt/sources.list" | tr '\n' ' ')
pass "its apt sources: ${suites% } (libssl3 $(in_container dpkg-query -W -f='${Version}' libssl3), libsystemd0 $(in_container dpkg-query -W -f='${Version}' libsystemd0))"

echo "== install"
container_put pkg "$deb" /root/
start=$(date +%s.%N)
if out=$(in_container env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "/root/$(basename "$deb")" 2>&1); then
  pass "apt-get install ./$(basename "$deb") ($(printf '%.1f' "$(echo "$(date +%s.%N) - $start" | bc)") s)"
else
  fail "apt-get install ./$(basename "$deb")" "$out"; finish
fi
groups=$(in_container id -nG keychaind 2>&1)
[[ " $groups " == *" tss "* ]] && pass "postinst made the system user keychaind, in tss" || fail "keychaind user and its groups" "$groups"
# Nothing has connected yet: a running keychaind was started by postinst, not by the socket.
state=$(in_container systemctl is-enabled keychaind.socket keychaind.service; in_container systemctl is-active keychaind.socket keychaind.service)
[ "$state" = $'enabled\nenabled\nactive\nactive' ] \
  && pass "keychaind.socket and keychaind.service enabled, the socket listening and keychaind running before any client connected" \
  || fail "postinst enables and starts keychaind.socket and keychaind.service" "$state"
container_put pkg "$bench_deb" /root/
out=$(in_container env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "/root/$(basename "$bench_deb")" 2>&1) \
  && pass "apt-get install ./$(basename "$bench_deb") beside it" || fail "apt-get install ./$(basename "$bench_deb")" "$out"
for exe in /usr/bin/keychainctl /usr/bin/keychainctl-full /usr/bin/keychain-secret-service /usr/sbin/keychaind /usr/lib/keychain-linux/keychain-bench; do
  libs=$(in_container ldd "$exe" 2>&1)
  if grep -Eq 'not found|swift|Foundation|dispatch' <<<"$libs"; then fail "$exe loads only Debian's libraries" "$libs"
  else pass "$exe resolves every library from Debian 12 (no Swift toolchain in the container)"; fi
done
portal_files_checks

# The container has no /dev/tpmrm0: keychaind uses the embedded software TPM in its store (swtpm, spawned
# by keychaind under the unit's own sandbox), so the unit runs exactly as shipped, with no drop-in.
in_container sh -c 'useradd -m alice && useradd -m bob'

echo "== at boot"
# A device's boot: keychaind.service (WantedBy=multi-user.target) starts with the system, so the first unit asking
# for a credential finds it running; nothing connects to keychaind's sockets between the boot and that unit.
printf 'boot-value' >"$(container_dir pkg)/root/root/boot.bin"
out=$(in_container sh -c 'keychainctl credential set boot.service token </root/boot.bin' 2>&1) || fail "credential set boot.service token" "$out"
credential_unit boot token /usr/bin/cat
if ! out=$(container_reboot pkg 2>&1); then fail "the container reboots (systemctl reboot, the same overlay booted again)" "$out"; finish; fi
st=$(in_container systemctl is-active keychaind.service; in_container systemctl show -p NRestarts --value keychaind.service)
boots=$(in_container journalctl --list-boots --no-pager -q | wc -l)
[ "$st" = $'active\n0' ] && [ "$boots" -ge 2 ] \
  && pass "rebooted (boot $boots of the journal): keychaind.service is running before any client connected" \
  || fail "after a reboot keychaind.service runs before any client connects" "$st, boots $boots"
out=$(in_container systemctl start boot.service 2>&1); rc=$?
got=$(in_container journalctl -b -u boot.service -o cat --no-pager | grep -x boot-value)
[ $rc -eq 0 ] && [ "$got" = boot-value ] && pass "the boot's first LoadCredential= unit (boot.service) starts with its value" \
  || fail "the first LoadCredential= unit after a boot gets its value" "exit $rc, got '$got' $out $(in_container journalctl -b -u keychaind.service -o cat --no-pager | tail -n 5)"

echo "== socket activation"
# Stopped (or crashed), keychaind starts again on the next connection: the socket stays enabled beside the service.
in_container systemctl stop keychaind.service 2>/dev/null
out=$(printf 'v-root' | in_container keychainctl set appliance root-key 2>&1); rc=$?
st=$(in_container systemctl is-active keychaind.service)
[ "$st" = active ] && [ $rc -eq 0 ] && pass "stopped, keychaind.service is started again by the next connection (socket activation)" \
  || fail "a connection starts a stopped keychaind.service" "$st, exit $rc: $out"
out=$(in_container keychainctl get appliance root-key 2>&1)
[ "$out" = v-root ] && pass "root's set and get through the socket" || fail "root's set and get through the socket" "$out"
pid1=$(in_container systemctl show -p MainPID --value keychaind.service)
in_container systemctl kill -s SIGKILL keychaind.service
for _ in $(seq 1 25); do [ "$(in_container systemctl is-active keychaind.service)" = active ] && break; sleep 0.2; done
out=$(in_container keychainctl get appliance root-key 2>&1)
pid2=$(in_container systemctl show -p MainPID --value keychaind.service)
[ "$out" = v-root ] && [ "$pid2" != "$pid1" ] && [ "$pid2" != 0 ] \
  && pass "killed (SIGKILL, pid $pid1), keychaind comes back (pid $pid2) and keeps what it had committed" \
  || fail "keychaind comes back after SIGKILL" "pid $pid1 -> $pid2: $out"

echo "== two system units of one uid"
unit_items_checks

echo "== users"
out=$(printf 'alice-secret' | as_user alice keychainctl set mail password 2>&1 && as_user alice keychainctl get mail password 2>&1)
[ "$out" = alice-secret ] && pass "alice (a normal user) sets and gets her item through the socket" || fail "alice's set and get" "$out"
out=$(as_user bob keychainctl get mail password 2>&1); rc=$?
[ $rc -ne 0 ] && ! grep -q alice-secret <<<"$out" && pass "bob does not see alice's item (exit $rc)" || fail "bob does not see alice's item" "$out"
out=$(as_user alice keychainctl lock 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "ACCESS_DENIED" <<<"$out" && grep -q "Only root or a member of the access group 'admin'" <<<"$out" \
  && pass "an admin command (lock) refuses alice: $(head -n1 <<<"$out")" || fail "lock refuses a non-admin" "exit $rc: $out"
out=$(in_container keychainctl lock 2>&1) && pass "root may lock" || fail "root may lock" "$out"

echo "== systemd credentials"
# A value with a NUL, a 0xff and no final newline: byte for byte or not at all.
printf 'pa\000ss\377Zq9w' >"$(container_dir pkg)/root/root/db-password.bin"
out=$(in_container sh -c 'keychainctl credential set db.service db-password </root/db-password.bin' 2>&1) \
  && pass "root stores db.service's db-password (credential set, value on stdin)" || fail "credential set as root" "$out"
out=$(in_container keychainctl credential ls db.service 2>&1)
[ "$out" = db-password ] && pass "credential ls db.service lists db-password" || fail "credential ls db.service" "$out"
out=$(printf x | as_user alice keychainctl credential set db.service db-password 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "ACCESS_DENIED: Only root or a member of the access group 'admin' may store, read, list or remove systemd credentials" <<<"$out" \
  && pass "alice's credential set is refused: ACCESS_DENIED" || fail "credential set refuses a non-admin" "exit $rc: $out"
out=$(as_user alice keychainctl credential get db.service db-password 2>&1); rc=$?
[ $rc -ne 0 ] && ! grep -q Zq9w <<<"$out" && pass "alice's credential get is refused (exit $rc)" || fail "credential get refuses a non-admin" "$out"
for unit in db other; do credential_unit $unit db-password /usr/bin/od -An -tx1 -v; done
out=$(in_container systemctl start db.service 2>&1); rc=$?
got=$(in_container journalctl -u db.service -o cat --no-pager | grep -E '^ *[0-9a-f]{2}( [0-9a-f]{2})*$' | tr -d ' \n')
want=$(od -An -tx1 -v "$(container_dir pkg)/root/root/db-password.bin" | tr -d ' \n')
[ $rc -eq 0 ] && [ "$got" = "$want" ] && pass "a DynamicUser=yes unit's \$CREDENTIALS_DIRECTORY/db-password is the value byte for byte ($want)" \
  || fail "db.service gets its credential byte for byte" "exit $rc, got '$got', want '$want' $out"
out=$(in_container systemctl start other.service 2>&1); rc=$?
result=$(in_container systemctl show -p Result --value other.service)
log=$(in_container journalctl -u keychaind.service -o cat --no-pager | grep 'unit other.service')
[ $rc -ne 0 ] && [ "$result" != success ] && grep -q "credential db-password: no such credential" <<<"$log" \
  && pass "other.service asking for db.service's ID fails to start ($result); keychaind: $(head -n1 <<<"$log")" \
  || fail "a second unit asking for the first one's ID fails to start" "exit $rc result $result log '$log'"
# The reason in the refused unit's own journal too (keychain-journal-relay, root's: journalctl -u shows another
# process's line about a unit only from uid 0 with OBJECT_SYSTEMD_UNIT=), never the value.
# The relay's line is in the unit's journal once journald has it (one run saw it only in the relay's): up to 10 s.
for _ in $(seq 20); do
  unitlog=$(in_container journalctl -u other.service -o cat --no-pager | grep "keychaind refused this unit's credential") && break; sleep 0.5
done
grep -q "credential db-password: no such credential (keychainctl credential set other.service db-password)" <<<"$unitlog" \
  && pass "journalctl -u other.service says why: $unitlog" \
  || fail "a refused credential's reason is in the unit's own journal" "$unitlog $(in_container journalctl -u keychain-journal-relay.service -o cat --no-pager | tail -n 5)"
# Only keychaind may say something in a unit's journal: the socket is root:keychaind 0620, and a datagram from any
# other uid that reaches it anyway (the mode opened by root here) is dropped by the uid the kernel gives.
# One datagram, MANAGER\0UNIT\0REASON (bash strings hold no NUL: perl joins its arguments).
relay_send='socket(my $s, AF_UNIX, SOCK_DGRAM, 0) or die; send($s, join("\0", @ARGV), 0, pack_sockaddr_un("/run/keychain/journal.sock")) or die "send: $!\n"'
out=$(as_user alice perl -MSocket -e "$relay_send" system db.service "forged by alice" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "Permission denied" <<<"$out" && pass "alice cannot send to the relay's socket: $out" \
  || fail "the relay's socket refuses alice" "exit $rc: $out"
in_container chmod 0666 /run/keychain/journal.sock
as_user alice perl -MSocket -e "$relay_send" system db.service "forged by alice"
in_container chmod 0620 /run/keychain/journal.sock
# Root may relay (the relay trusts uid 0 and keychaind's): a unit name systemd would not give is dropped, and a
# reason's newline and escape byte are escaped, so nobody forges a second line.
in_container perl -MSocket -e "$relay_send" system $'db.service\nkeychaind: x' "bad unit"
in_container perl -MSocket -e "$relay_send" system db.service $'first\nkeychaind: forged \e[31m line'
# The relay's lines are in the journal once journald has them: wait for the last one sent, for up to 20 s.
for _ in $(seq 40); do in_container journalctl -u db.service -o cat --no-pager | grep -q 'keychaind: forged' && break; sleep 0.5; done
dblog=$(in_container journalctl -u db.service -o cat --no-pager | grep "keychaind refused this unit's credential")
relaylog=$(in_container journalctl -u keychain-journal-relay.service -o cat --no-pager)
! grep -q "forged by alice" <<<"$dblog" && grep -q "dropped a datagram from uid $(in_container id -u alice)" <<<"$relaylog" \
  && pass "a datagram from alice that reached the socket is dropped: $(grep 'from uid' <<<"$relaylog" | tail -n1)" \
  || fail "the relay drops a datagram from a uid other than keychaind's" "db.service: $dblog relay: $relaylog"
grep -qF 'first\nkeychaind: forged \x1b[31m line' <<<"$dblog" && ! grep -q "^keychaind: forged" <<<"$dblog" \
  && grep -q "dropped a unit name systemd does not give" <<<"$relaylog" \
  && pass "the relay escapes a reason's control bytes and drops a bad unit name: $(tail -n1 <<<"$dblog")" \
  || fail "the relay escapes and checks what it is sent" "db.service: $dblog relay: $relaylog"
# whenUnlocked on a locked device: the unit must not start, and the journal says why.
out=$(in_container sh -c 'printf "24680\n" | keychainctl passcode set && printf api-token | keychainctl credential set api.service token --accessible whenUnlocked && keychainctl lock' 2>&1) \
  || fail "passcode set, a whenUnlocked credential, lock" "$out"
credential_unit api token /usr/bin/cat
out=$(in_container systemctl start api.service 2>&1); rc=$?
log=$(in_container journalctl -u keychaind.service -o cat --no-pager | grep 'unit api.service')
[ $rc -ne 0 ] && grep -q "INTERACTION_NOT_ALLOWED" <<<"$log" && ! grep -q api-token <<<"$log" \
  && pass "a whenUnlocked credential on a locked device fails its unit; keychaind: $(head -n1 <<<"$log")" \
  || fail "a locked device's whenUnlocked credential fails its unit" "exit $rc log '$log'"
unitlog=$(in_container journalctl -u api.service -o cat --no-pager | grep "keychaind refused this unit's credential")
grep -q "credential token: INTERACTION_NOT_ALLOWED" <<<"$unitlog" && ! grep -q api-token <<<"$unitlog" \
  && pass "journalctl -u api.service says why, without the value: $unitlog" || fail "api.service's journal says why" "$unitlog"
out=$(in_container sh -c 'printf "24680\n" | keychainctl unlock && systemctl start api.service && journalctl -u api.service -o cat --no-pager | grep -x api-token' 2>&1) \
  && pass "unlocked, api.service starts with its token" || fail "unlocked, api.service starts with its token" "$out"
journal=$(in_container journalctl -u keychaind.service -o cat --no-pager)
! grep -q -e 'api-token' -e 'Zq9w' <<<"$journal" && pass "keychaind's journal never holds a value" || fail "keychaind's journal holds no value" "$journal"

echo "== provisioning through keychaind"
out=$(as_user alice keychainctl identity 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "ACCESS_DENIED: Only root or a member of the access group 'admin'" <<<"$out" \
  && pass "alice's identity through keychaind is refused: $(head -n1 <<<"$out")" || fail "identity refuses a non-admin" "exit $rc: $out"
out=$(in_container keychainctl identity --out /root/identity.json 2>&1) && in_container grep -q '"storageRootKey"' /root/identity.json \
  && pass "root's identity through keychaind (no longer UNSUPPORTED)" || fail "root's identity through keychaind" "$out"
# The fleet's pipeline (no TPM): the value sealed to this device's TPM as bundled.service's credential api-key.
printf 'sealed\001for\377this-tpm' >"$(container_dir pkg)/root/root/bundled.bin"
out=$(in_container sh -c 'keychainctl seal-for /root/identity.json --credential bundled.service:api-key </root/bundled.bin >/tmp/bundled.bundle && chmod 644 /tmp/bundled.bundle' 2>&1) \
  || fail "seal-for --credential bundled.service:api-key" "$out"
out=$(as_user alice keychainctl import /tmp/bundled.bundle 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "ACCESS_DENIED" <<<"$out" && pass "alice's import through keychaind is refused: $(head -n1 <<<"$out")" \
  || fail "import refuses a non-admin" "exit $rc: $out"
out=$(in_container keychainctl import /tmp/bundled.bundle 2>&1)
grep -q "imported: systemd credential api-key of bundled.service" <<<"$out" && pass "root imports it through keychaind: $out" \
  || fail "root imports a credential bundle through keychaind" "$out"
credential_unit bundled api-key /usr/bin/od -An -tx1 -v
out=$(in_container systemctl start bundled.service 2>&1); rc=$?
got=$(in_container journalctl -u bundled.service -o cat --no-pager | grep -E '^ *[0-9a-f]{2}( [0-9a-f]{2})*$' | tr -d ' \n')
want=$(od -An -tx1 -v "$(container_dir pkg)/root/root/bundled.bin" | tr -d ' \n')
[ $rc -eq 0 ] && [ "$got" = "$want" ] && pass "bundled.service finds the imported bundle's value byte for byte at its start ($want)" \
  || fail "an imported credential bundle reaches its unit" "exit $rc, got '$got', want '$want' $out"

echo "== a user's manager"
# alice and bob with lingering: systemd starts user@UID.service (systemd --user) and its session bus at boot of
# the user, with no login. `as_manager USER CMD…`: CMD as USER, talking to that user's manager and bus.
as_manager() { local user=$1; shift; local uid; uid=$(in_container id -u "$user")
  as_user "$user" env XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus "$@"; }
# `user_credential_unit USER NAME ID`: USER's own oneshot unit NAME.service given the credential ID, which
# writes the file's bytes in hex to ~/NAME.out.
user_credential_unit() {
  local user=$1 unit=$2 id=$3
  as_user "$user" sh -c "mkdir -p ~/.config/systemd/user && cat >~/.config/systemd/user/$unit.service <<UNIT
[Service]
Type=oneshot
LoadCredential=$id:/run/keychain/credentials.sock
ExecStart=/bin/sh -c 'od -An -tx1 -v \"\\\${CREDENTIALS_DIRECTORY}/$id\" >%h/$unit.out'
UNIT"
  as_manager "$user" systemctl --user daemon-reload
}
for user in alice bob; do in_container loginctl enable-linger "$user"; done
for _ in $(seq 1 150); do
  st=$(for user in alice bob; do in_container systemctl is-active "user@$(in_container id -u $user).service"; done | sort -u)
  [ "$st" = active ] && break; sleep 0.2
done
[ "$st" = active ] && pass "lingering alice and bob each have a user manager (user@UID.service active)" \
  || fail "user@UID.service of alice and bob comes up with lingering" "$st"
printf 'alice\000unit\377key' >"$(container_dir pkg)/root/var/tmp/alice-unit.bin"; in_container chmod 644 /var/tmp/alice-unit.bin
out=$(as_user alice sh -c 'keychainctl credential set --user app.service api-key </var/tmp/alice-unit.bin && keychainctl credential ls --user app.service' 2>&1)
[ "$out" = api-key ] && pass "alice stores a credential for her own user unit (credential set --user app.service api-key), no admin needed" \
  || fail "alice's credential set --user" "$out"
out=$(in_container keychainctl credential ls app.service 2>&1)
[ -z "$out" ] && pass "the system's app.service has no credential: alice's is her manager's alone" || fail "alice's credential is not the system's" "$out"
user_credential_unit alice app api-key
out=$(as_manager alice systemctl --user start app.service 2>&1); rc=$?
got=$(in_container cat /home/alice/app.out 2>&1 | tr -d ' \n')
want=$(od -An -tx1 -v "$(container_dir pkg)/root/var/tmp/alice-unit.bin" | tr -d ' \n')
[ $rc -eq 0 ] && [ "$got" = "$want" ] && pass "alice's user unit (systemctl --user) finds her value byte for byte ($want)" \
  || fail "alice's user unit gets her credential" "exit $rc, got '$got', want '$want' $out"
user_credential_unit bob app api-key
out=$(as_manager bob systemctl --user start app.service 2>&1); rc=$?
uid_bob=$(in_container id -u bob)
log=$(in_container journalctl -u keychaind.service -o cat --no-pager | grep "unit app.service (user manager of uid $uid_bob)")
[ $rc -ne 0 ] && ! in_container test -s /home/bob/app.out && grep -q "credential api-key: no such credential (as uid $uid_bob: keychainctl credential set --user app.service api-key)" <<<"$log" \
  && pass "bob's manager asking for app.service's api-key gets nothing of alice's and his unit fails; keychaind names bob's own command: $(head -n1 <<<"$log")" \
  || fail "another user's manager gets nothing of alice's" "exit $rc log '$log' $(in_container cat /home/bob/app.out 2>&1)"
out=$(as_user bob keychainctl credential get --user app.service api-key 2>&1); rc=$?
[ $rc -ne 0 ] && ! grep -q 'unit' <<<"$out" && pass "bob's credential get --user app.service api-key finds nothing (exit $rc)" \
  || fail "bob cannot read alice's user unit's credential" "exit $rc: $out"
# A plain process of alice binds the manager's kind of address. Nothing tells it from her manager (the manager's
# forked child connects, as alice, in cgroups delegated to her), so it gets what her manager would: her own units'
# credentials (what her `credential get --user` gives), never a system unit's (docs/credentials.md).
fake() { as_user alice perl -MSocket -e '
  socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
  bind($s, pack_sockaddr_un("\0" . sprintf("%x", 1 + int(rand(2**31))) . "/unit/$ARGV[0]/$ARGV[1]")) or die "bind: $!";
  connect($s, pack_sockaddr_un("/run/keychain/credentials.sock")) or die "connect: $!";
  my ($all, $buf) = ("", ""); while (sysread($s, $buf, 65536)) { $all .= $buf } print unpack("H*", substr($all, 0, 64)), " ", length($all), "\n";' "$@" 2>&1; }
got=$(fake app.service api-key)
[ "$got" = "$want $(wc -c <"$(container_dir pkg)/root/var/tmp/alice-unit.bin")" ] \
  && pass "a plain process of alice faking her manager's address gets her own unit's value, as her credential get --user would" \
  || fail "a plain process of alice gets at most her own units' credentials" "read '$got', want '$want'"
got=$(fake db.service db-password)
log=$(in_container journalctl -u keychaind.service -o cat --no-pager | grep "unit db.service (user manager of uid $(in_container id -u alice)) credential db-password" | tail -n1)
want_db=$(od -An -tx1 -v "$(container_dir pkg)/root/root/db-password.bin" | tr -d ' \n')
! grep -q "$want_db" <<<"$got" && grep -q "no such credential" <<<"$log" \
  && pass "faking the address of system unit db.service, alice gets nothing of the system's ($(awk '{print $2}' <<<"$got") bytes of zeros); keychaind: $log" \
  || fail "a plain process of alice gets no system unit's credential" "read '$got' log '$log'"

echo "== the Secret Service provider's user unit"
# alice's session bus (dbus-user-session) activates org.freedesktop.secrets through the package's user unit;
# the provider serves alice's items through keychaind (the system socket), with no store of its own.
out=$(printf 'ss\000secret' | as_manager alice secret-tool store --label 'mail' service mail.example user alice 2>&1); rc=$?
st=$(as_manager alice systemctl --user is-active keychain-secret-service.service)
[ $rc -eq 0 ] && [ "$st" = active ] && pass "secret-tool store as alice: the bus activated keychain-secret-service.service (systemd --user)" \
  || fail "secret-tool store activates the provider's user unit" "exit $rc state $st: $out $(as_manager alice journalctl --user -u keychain-secret-service --no-pager -n 20 2>&1)"
as_manager alice systemctl --user stop keychain-secret-service.service
got=$(as_manager alice secret-tool lookup service mail.example user alice 2>&1 | od -An -tx1 -v | tr -d ' \n')
[ "$got" = "$(printf 'ss\000secret' | od -An -tx1 -v | tr -d ' \n')" ] && ! in_container test -e /home/alice/.local/share/keychain \
  && pass "stopped, the provider is activated again and secret-tool lookup returns the value (a NUL in it) from keychaind's store; alice has no store of her own" \
  || fail "secret-tool lookup through the restarted provider" "got '$got' $(in_container ls -la /home/alice/.local/share 2>&1)"
got=$(as_manager bob secret-tool lookup service mail.example user alice 2>&1)
[ -z "$got" ] && pass "bob's own provider (his bus, his unit) finds nothing of alice's" || fail "bob's provider does not see alice's item" "$got"

echo "== the service's sandbox"
show=$(in_container systemctl show -p NRestarts -p Result -p ExecMainStatus keychaind.service)
# One restart: the SIGKILL above. A SIGSYS (the system-call filter) would show as more, or as Result=signal now.
grep -q '^Result=success' <<<"$show" && grep -q '^NRestarts=1$' <<<"$show" \
  && pass "no SIGSYS: every call above ran under the shipped SystemCallFilter= (one restart, the SIGKILL)" \
  || fail "keychaind ran every call under its system-call filter" "$show $(in_container journalctl -u keychaind.service --no-pager -n 20)"
analysis=$(in_container systemd-analyze security keychaind.service 2>&1)
score=$(sed -n 's/.*Overall exposure level for keychaind.service: \([0-9.]*\).*/\1/p' <<<"$analysis")
if [ -n "$score" ] && [ "$(echo "$score <= 2.0" | bc)" = 1 ]; then pass "systemd-analyze security keychaind.service: $score (at most 2.0)"
else fail "systemd-analyze security keychaind.service scores at most 2.0" "score '$score'"; fi
# What keeps it from lower: the settings it counts against the unit (docs/security.md says why each stays).
grep '✗' <<<"$analysis" | sed 's/^/    exposed: /'
# The kernel's tunables in keychaind's mount namespace: /sys hidden whole (InaccessiblePaths=, in place of
# ProtectKernelTunables=' read-only /sys), /proc's tunables absent (ProcSubset=pid).
in_container systemctl start keychaind.service
pid=$(in_container systemctl show -p MainPID --value keychaind.service)
seen=$(in_container nsenter --target "$pid" --mount -- sh -c 'for p in /sys/kernel /sys/devices/system/cpu/online /sys/fs/cgroup \
  /proc/sys/kernel /proc/sysrq-trigger; do [ -e "$p" ] && echo "$p"; done; ls -A /sys' 2>&1)
[ -n "$pid" ] && [ "$pid" != 0 ] && [ -z "$seen" ] \
  && pass "keychaind (pid $pid) sees nothing of /sys, nor /proc/sys or /proc/sysrq-trigger" \
  || fail "keychaind's mount namespace hides /sys and /proc's tunables" "pid '$pid', visible: $seen"


echo "== a ThisDeviceOnly credential and the boot state"
# After the sandbox checks: a stop and start by hand resets NRestarts. As keychaind's user on its store, with keychaind stopped (boot-state approval is not served through keychaind).
direct() { in_container setpriv --reuid=keychaind --regid=keychaind --init-groups -- env HOME=/var/lib/keychain \
  keychainctl --direct --store /var/lib/keychain/store "$@"; }
out=$(printf 'tdo-value' | in_container keychainctl credential set tdo.service token --accessible afterFirstUnlockThisDeviceOnly 2>&1) \
  || fail "credential set --accessible afterFirstUnlockThisDeviceOnly" "$out"
credential_unit tdo token /usr/bin/cat
out=$(in_container sh -c 'systemctl start tdo.service && journalctl -u tdo.service -o cat --no-pager | grep -x tdo-value' 2>&1) \
  && pass "tdo.service starts with its ThisDeviceOnly credential on the approved boot state" || fail "tdo.service starts on the approved boot state" "$out"
other=$(printf 'ab%.0s' $(seq 32))
in_container systemctl stop keychaind.service
out=$(printf '24680\n' | direct boot-state approve --pcr "7=$other" 2>&1 && direct tpm reboot 2>&1) \
  || fail "approve another boot state (PCR 7 = $other), so that today's is no longer approved" "$out"
out=$(in_container systemctl start tdo.service 2>&1); rc=$?
log=$(in_container journalctl -u keychaind.service -o cat --no-pager | grep 'unit tdo.service' | tail -n1)
[ $rc -ne 0 ] && grep -q "refused: unit tdo.service (system manager) credential token: DEVICE_STATE_CHANGED" <<<"$log" && ! grep -q tdo-value <<<"$log" \
  && pass "a ThisDeviceOnly credential on a boot state nobody approved fails its unit; keychaind: $log" \
  || fail "an unapproved boot state fails the ThisDeviceOnly credential's unit" "exit $rc log '$log'"
in_container systemctl stop keychaind.service
# The TPM rebooted: afterFirstUnlock needs the first unlock again (a passcode is set above).
out=$(printf '24680\n' | direct boot-state approve 2>&1 && direct tpm reboot 2>&1 && printf '24680\n' | in_container keychainctl unlock 2>&1 \
  && in_container systemctl start tdo.service 2>&1) \
  && pass "today's boot state approved again (and the device unlocked after the TPM's reboot), tdo.service starts" \
  || fail "approved again, tdo.service starts" "$out $(in_container journalctl -u keychaind.service -o cat --no-pager | grep 'unit tdo.service' | tail -n1)"
journal=$(in_container journalctl -u keychaind.service -o cat --no-pager)
! grep -q -e 'tdo-value' -e 'for-this-tpm' <<<"$journal" && pass "keychaind's journal holds neither value" || fail "keychaind's journal holds no value" "$journal"

echo "== upgrade"
# An administrator who wants keychaind on the first connection only disables the service; an upgrade (the same
# package again: postinst configure with the old version) keeps that, and starts nothing.
in_container systemctl disable --now keychaind.service 2>/dev/null
out=$(in_container dpkg -i "/root/$(basename "$deb")" 2>&1) || fail "dpkg -i of the package over itself (an upgrade)" "$out"
st=$(in_container systemctl is-enabled keychaind.service; in_container systemctl is-active keychaind.service keychaind.socket)
[ "$st" = $'disabled\ninactive\nactive' ] && pass "an upgrade keeps a keychaind.service the administrator disabled disabled and stopped, its socket listening" \
  || fail "an upgrade keeps the administrator's disabled keychaind.service" "$st"

echo "== apt-get upgrade from Debian's archive"
# Debian 12 has a package named keychain (an ssh-agent front end): under that name ours was replaced by it on the
# next upgrade. The container's sources are Debian's (bookworm, with its updates where --updates yes).
out=$(in_container sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q && DEBIAN_FRONTEND=noninteractive apt-get full-upgrade -y -q' 2>&1) \
  || fail "apt-get update, upgrade and full-upgrade in the container" "$(tail -n 20 <<<"$out")"
st=$(in_container dpkg-query -W -f='${Status} ${Version}' keychain-linux 2>&1; echo; in_container systemctl is-enabled keychaind.socket; in_container systemctl is-active keychaind.socket)
# keychaind's restarts above restarted its embedded TPM: the first unlock since, then root's item from before.
got=$(in_container sh -c 'printf "24680\n" | keychainctl unlock >/dev/null && keychainctl get appliance root-key' 2>&1)
kc=$(in_container dpkg-query -W -f='${Status}' keychain 2>/dev/null)
[ "$st" = "install ok installed $(dpkg-deb -f "$deb" Version)"$'\nenabled\nactive' ] && [ "$got" = v-root ] && in_container test -x /usr/sbin/keychaind && [ "$kc" != "install ok installed" ] \
  && pass "apt-get upgrade and full-upgrade leave keychain-linux installed, its socket enabled and listening, and root's item readable" \
  || fail "apt-get upgrade and full-upgrade keep the keychain" "$st / get: $got / Debian's keychain: '$kc'"

echo "== remove and purge"
out=$(in_container env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q keychain-linux-bench keychain-linux 2>&1) || fail "apt-get remove keychain-linux" "$out"
st=$(in_container systemctl is-active keychaind.socket keychaind.service; in_container sh -c 'ls /run/keychain/*.sock 2>/dev/null')
[ "$st" = $'inactive\ninactive' ] && pass "remove stopped keychaind.socket and keychaind.service and took their sockets" \
  || fail "remove stops the socket and the service and takes their sockets" "$st"
in_container test -d /var/lib/keychain/store && ! in_container test -e /usr/sbin/keychaind \
  && pass "remove took the binaries and kept the store" || fail "remove keeps the store, takes the binaries"
out=$(in_container env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q keychain-linux 2>&1) || fail "apt-get purge keychain-linux" "$out"
grep -q "purge kept /var/lib/keychain" <<<"$out" && in_container test -d /var/lib/keychain/store \
  && pass "purge kept the store and said so: $(grep -m1 'purge kept /var/lib/keychain' <<<"$out")" \
  || fail "purge keeps the store and says so" "$out"
left=$(in_container sh -c 'dpkg -l "keychain-linux*" 2>/dev/null | grep "^[a-z][a-z] *keychain"; ls /etc/systemd/system/*/keychaind* /etc/systemd/system/keychaind* 2>/dev/null; systemctl list-unit-files "keychaind*" --no-legend')
[ -z "$left" ] && pass "purge left no package state, unit file or enablement link" || fail "purge leaves nothing of the package" "$left"

finish
