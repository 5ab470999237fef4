# Sourced by scripts/test-systemd.sh (issue 41): the checks of each system unit's items under the container's
# booted systemd, with real units. Uses its pass, fail and in_container; needs the package installed and
# keychaind's socket listening. Defines portal_files_checks and unit_items_checks.

# The Flatpak Secret portal's backend is installed where Debian 12's xdg-desktop-portal (1.16) and the session bus
# look for it (debian/rules), and the two name the same bus name.
portal_files_checks() {
  local portal=/usr/share/xdg-desktop-portal/portals/keychain.portal
  local activation=/usr/share/dbus-1/services/org.freedesktop.impl.portal.desktop.keychain.service
  local p a
  p=$(in_container cat "$portal" 2>&1); a=$(in_container cat "$activation" 2>&1)
  grep -qx 'DBusName=org.freedesktop.impl.portal.desktop.keychain' <<<"$p" \
    && grep -qx 'Interfaces=org.freedesktop.impl.portal.Secret;' <<<"$p" \
    && grep -qx 'Name=org.freedesktop.impl.portal.desktop.keychain' <<<"$a" \
    && grep -qx 'Exec=/usr/bin/keychain-secret-service' <<<"$a" && in_container test -x /usr/bin/keychain-secret-service \
    && pass "the Secret portal's backend is installed: $portal (org.freedesktop.impl.portal.Secret) and its D-Bus activation $activation" \
    || fail "the package installs the Secret portal's .portal file and D-Bus activation" "$portal: $p
$activation: $a"
}

# `in_unit UNIT CMD…`: CMD as user svc in the transient system service UNIT (systemd-run: its own cgroup
# system.slice/UNIT, which only root moves processes into), stdin and stdout passed through, the unit removed after.
in_unit() { local unit=$1; shift; in_container systemd-run --quiet --wait --pipe --collect --unit="$unit" -p User=svc "$@"; }
# `in_shell CMD…`: CMD as svc from a login shell of svc (runuser -l: a PAM session, a session scope in user.slice).
in_shell() { in_container runuser -l svc -c "$*"; }

# Two system units with the same User= and the same service and key, that uid's login shell, a transient unit
# systemd named, and an access group naming both units (docs/security.md, "each application's items are its own").
unit_items_checks() {
  local out rc a b sh got
  in_container useradd -m svc
  out=$(printf 'a-secret' | in_unit kc-a.service keychainctl set mail password 2>&1 && in_unit kc-a.service keychainctl get mail password 2>&1)
  [ "$out" = a-secret ] && pass "unit kc-a.service (User=svc) sets and reads back mail/password" || fail "kc-a.service sets and reads its item" "$out"
  out=$(in_unit kc-b.service keychainctl get mail password 2>&1); rc=$?
  got=$(in_unit kc-b.service keychainctl ls mail 2>&1)
  [ $rc -ne 0 ] && ! grep -q a-secret <<<"$out" && ! grep -q password <<<"$got" \
    && pass "kc-b.service (the same uid) neither finds nor lists kc-a's mail/password: $(head -n1 <<<"$out")" \
    || fail "kc-b.service does not find or list kc-a's item" "get (exit $rc): $out; ls: $got"
  out=$(in_shell keychainctl get mail password 2>&1); rc=$?
  got=$(in_shell keychainctl ls mail 2>&1)
  [ $rc -ne 0 ] && ! grep -q a-secret <<<"$out" && ! grep -q password <<<"$got" \
    && pass "svc's login shell neither finds nor lists kc-a's mail/password (exit $rc)" \
    || fail "svc's shell does not find or list kc-a's item" "get (exit $rc): $out; ls: $got"
  out=$(printf 'b-secret' | in_unit kc-b.service keychainctl set mail password 2>&1) || fail "kc-b.service sets mail/password" "$out"
  out=$(in_shell "printf shell-secret | keychainctl set mail password" 2>&1) || fail "svc's shell sets mail/password" "$out"
  a=$(in_unit kc-a.service keychainctl get mail password 2>&1); b=$(in_unit kc-b.service keychainctl get mail password 2>&1)
  sh=$(in_shell keychainctl get mail password 2>&1)
  [ "$a" = a-secret ] && [ "$b" = b-secret ] && [ "$sh" = shell-secret ] \
    && pass "kc-b's and the shell's writes of mail/password overwrite nothing of kc-a's: each reads back its own" \
    || fail "each of kc-a, kc-b and the shell reads back its own mail/password" "a '$a', b '$b', shell '$sh'"
  # A transient unit without --unit is run-uN.service, an application of its own: the next one is another.
  out=$(printf 'run-secret' | in_container systemd-run --quiet --wait --pipe --collect -p User=svc keychainctl set run token 2>&1) \
    || fail "an unnamed transient unit sets run/token" "$out"
  out=$(in_container systemd-run --quiet --wait --pipe --collect -p User=svc keychainctl get run token 2>&1); rc=$?
  [ $rc -ne 0 ] && ! grep -q run-secret <<<"$out" \
    && pass "a second unnamed transient unit (another run-uN.service) does not find the first one's item (exit $rc)" \
    || fail "each unnamed transient unit is its own application" "exit $rc: $out"
  # An access group naming both units (root's file, 0644): they share its items; a third unit of the same uid
  # and the uid's shell are refused, the refusal naming the line to add.
  in_container sh -c 'printf "unit kc-a.service\nunit kc-b.service\n" >/etc/keychain/groups.d/mailers.conf && chmod 0644 /etc/keychain/groups.d/mailers.conf'
  out=$(printf 'group-secret' | in_unit kc-a.service keychainctl --access-group mailers set mail shared 2>&1) \
    || fail "kc-a.service sets mail/shared in the access group mailers" "$out"
  out=$(in_unit kc-b.service keychainctl --access-group mailers get mail shared 2>&1)
  [ "$out" = group-secret ] && pass "kc-b.service reads what kc-a.service stored in the access group mailers (unit lines for both)" \
    || fail "kc-b.service reads the group's item" "$out"
  out=$(in_unit kc-c.service keychainctl --access-group mailers get mail shared 2>&1); rc=$?
  sh=$(in_shell keychainctl --access-group mailers get mail shared 2>&1)
  [ $rc -ne 0 ] && grep -q "ACCESS_DENIED" <<<"$out" && grep -q "unit kc-c.service" <<<"$out" && ! grep -q group-secret <<<"$out$sh" \
    && grep -q ACCESS_DENIED <<<"$sh" \
    && pass "kc-c.service and svc's shell, not in mailers, are refused: $(head -n1 <<<"$out")" \
    || fail "a unit and a shell not in the group are refused" "kc-c: $out; shell: $sh"
  # A group listing the uid (user svc) lets in svc's shell, never one of svc's units.
  in_container sh -c 'printf "user svc\n" >/etc/keychain/groups.d/svc-shell.conf && chmod 0644 /etc/keychain/groups.d/svc-shell.conf'
  sh=$(in_shell "printf shell-group | keychainctl --access-group svc-shell set mail shared && keychainctl --access-group svc-shell get mail shared" 2>&1)
  out=$(in_unit kc-a.service keychainctl --access-group svc-shell get mail shared 2>&1); rc=$?
  [ "$sh" = shell-group ] && [ $rc -ne 0 ] && grep -q "as 'unit kc-a.service'" <<<"$out" && ! grep -q shell-group <<<"$out" \
    && pass "a group listing 'user svc' lets svc's shell in and refuses svc's unit kc-a.service: $(head -n1 <<<"$out")" \
    || fail "a uid's line lets in its shell, not its units" "shell: $sh; kc-a (exit $rc): $out"
}
