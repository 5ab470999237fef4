#!/usr/bin/env bash
# A booted Debian 12 with systemd as PID 1, for tests under the real service manager (issue 20).
#
# Source it, then: container_root (the cached debootstrap root, built when absent), container_boot NAME
# (a throw-away overlay on that root, booted with systemd-nspawn), container_exec NAME CMD… (a command
# inside, as root), container_reboot NAME (a reboot that keeps the overlay), container_stop NAME. Or run it:
# `scripts/systemd-container.sh root` builds the cache.
#
# - The root is `debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm` from the mirror
#   apt is configured with here, plus the packages the keychain package depends on and swtpm (the tests'
#   TPM), so `apt-get install ./keychain-linux_….deb` inside needs no network. CONTAINER_UPDATES (or
#   KEYCHAIN_TEST_UPDATES) chooses which Debian 12 it is, whatever this machine's own apt state:
#   `no` (the default), bookworm's main alone, a device at the point release with no security updates;
#   `yes`, bookworm, bookworm-updates and bookworm-security in its sources and upgraded, an updated device.
#   It is cached under
#   /var/cache/keychain-tests/ (KEYCHAIN_TEST_CACHE), one root per package list (its path ends in a hash
#   of the list): a new list builds a new root beside the old one, never under a container booted on it.
#   Roots of older lists stay until removed by hand (`rm -rf /var/cache/keychain-tests/bookworm-systemd-*`
#   with no container running).
# - Each boot gets an overlay (the cache is the lower layer, never written) and runs
#   `systemd-nspawn -D ROOT -b --register=no --keep-unit` from a cgroup of its own: where the host's PID 1
#   is not systemd, plain `-b` fails because nspawn cannot make a scope unit.

CONTAINER_CACHE=${KEYCHAIN_TEST_CACHE:-/var/cache/keychain-tests}
CONTAINER_SUITE=bookworm
CONTAINER_UPDATES=${CONTAINER_UPDATES:-${KEYCHAIN_TEST_UPDATES:-no}}
# What the keychain package needs at run time (its Depends, see scripts/package-deb.sh), the tests' TPM, and a
# user's manager with its session bus (`systemd --user` under user@UID.service: pam_systemd, dbus-user-session)
# with secret-tool for the Secret Service provider's user unit.
CONTAINER_PACKAGES=(libtss2-esys-3.0.2-0 libtss2-tctildr0 libtss2-rc0 libtss2-mu0 libtss2-tcti-device0 libtss2-tcti-swtpm0
                    libsodium23 libsqlite3-0 libssl3 libp11-kit0 swtpm swtpm-tools systemd-container
                    libpam-systemd dbus-user-session libsecret-tools)

container_fail() { echo "systemd container: $*" >&2; return 1; }

# The mirror apt uses on this machine (deb822 or one-line sources).
container_mirror() {
  local uri
  uri=$(grep -hsE '^URIs: .*/debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
  [ -n "$uri" ] || uri=$(grep -hsE '^deb .*/debian/? ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | head -n1 | awk '{print $2}')
  echo "${uri:-http://deb.debian.org/debian}"
}

# The security archive apt uses on this machine, or Debian's.
container_security_mirror() {
  local uri
  uri=$(grep -hsE '^URIs: .*/debian-security/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
  [ -n "$uri" ] || uri=$(grep -hsE '^deb .*/debian-security/? ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | head -n1 | awk '{print $2}')
  echo "${uri:-http://deb.debian.org/debian-security}"
}

# Prints the cached root, building it first when it is absent or incomplete. Two layers, each cached: the
# debootstrap base (about 100 s on a quiet machine, once) and the root with CONTAINER_PACKAGES on it.
container_root() {
  local base="$CONTAINER_CACHE/$CONTAINER_SUITE-minbase" root want variant=$CONTAINER_SUITE
  [ "$CONTAINER_UPDATES" = yes ] && variant=$CONTAINER_SUITE-updated
  want="$variant: ${CONTAINER_PACKAGES[*]}"
  root="$CONTAINER_CACHE/$variant-systemd-$(printf '%s' "$want" | sha256sum | cut -c1-12)"
  if [ -f "$root/.keychain-tests-root" ] && [ "$(cat "$root/.keychain-tests-root")" = "$want" ]; then echo "$root"; return; fi
  mkdir -p "$CONTAINER_CACHE"
  # One build at a time (another run may be building the same root); the one that waited finds it made.
  local lock
  exec {lock}>"$CONTAINER_CACHE/.build.lock"
  flock "$lock"
  if [ -f "$root/.keychain-tests-root" ] && [ "$(cat "$root/.keychain-tests-root")" = "$want" ]; then exec {lock}>&-; echo "$root"; return; fi
  local log="$CONTAINER_CACHE/build.log"
  if [ ! -f "$base/.keychain-tests-base" ]; then
    command -v debootstrap >/dev/null || container_fail "debootstrap is not installed (scripts/setup-debian.sh installs it)" || return
    rm -rf "$base.new"
    echo "systemd container: debootstrap $CONTAINER_SUITE from $(container_mirror) into $base (once)" >&2
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus "$CONTAINER_SUITE" "$base.new" "$(container_mirror)" >"$log" 2>&1 \
      || { tail -n 20 "$log" >&2; rm -rf "$base.new"; container_fail "debootstrap failed (log above)"; return; }
    touch "$base.new/.keychain-tests-base"
    rm -rf "$base" && mv "$base.new" "$base"
  fi
  echo "systemd container: $root: the base ($variant) and ${CONTAINER_PACKAGES[*]}" >&2
  rm -rf "$root.new"
  cp -a "$base" "$root.new"
  cp /etc/resolv.conf "$root.new/etc/resolv.conf"
  # debootstrap's sources are bookworm's main alone; an updated device has the updates and the security archive.
  if [ "$CONTAINER_UPDATES" = yes ]; then
    printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' "$(container_mirror)" "$CONTAINER_SUITE" \
      "$(container_mirror)" "$CONTAINER_SUITE" "$(container_security_mirror)" "$CONTAINER_SUITE" >"$root.new/etc/apt/sources.list"
    { chroot "$root.new" apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive chroot "$root.new" apt-get full-upgrade -y -qq; } >>"$log" 2>&1 \
      || { tail -n 20 "$log" >&2; rm -rf "$root.new"; container_fail "updating the root from the updates and security archives failed (log above)"; return; }
  fi
  { chroot "$root.new" apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive chroot "$root.new" apt-get install -y -qq --no-install-recommends "${CONTAINER_PACKAGES[@]}" \
    && chroot "$root.new" apt-get clean; } >>"$log" 2>&1 \
    || { tail -n 20 "$log" >&2; rm -rf "$root.new"; container_fail "installing ${CONTAINER_PACKAGES[*]} failed (log above)"; return; }
  # Each boot is a new machine (an empty machine-id), and no getty on the console.
  : >"$root.new/etc/machine-id"
  ln -sf /dev/null "$root.new/etc/systemd/system/console-getty.service"
  rm -f "$root.new/.keychain-tests-base"
  echo "$want" >"$root.new/.keychain-tests-root"
  rm -rf "$root" && mv "$root.new" "$root"
  exec {lock}>&-
  echo "$root"
}

container_dir() { echo "/run/keychain-tests/$1"; }

# Boots NAME on an overlay of the cached root and waits until systemd inside is up (is-system-running
# answers running or degraded). Fails, saying why, when the machine cannot boot it.
container_boot() {
  local name=$1 root dir
  root=$(container_root) || return
  command -v systemd-nspawn >/dev/null || container_fail "systemd-nspawn is not installed (package systemd-container)" || return
  dir=$(container_dir "$name")
  container_stop "$name" 2>/dev/null || true
  mkdir -p "$dir"/{upper,work,root}
  mount -t overlay overlay -o "lowerdir=$root,upperdir=$dir/upper,workdir=$dir/work" "$dir/root" \
    || container_fail "cannot mount an overlay on $root" || return
  # A cgroup of its own in the named systemd hierarchy (cgroup v1 here) or the unified one.
  local cg
  if [ -d /sys/fs/cgroup/systemd ]; then cg=/sys/fs/cgroup/systemd/keychain-tests-$name
  elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then cg=/sys/fs/cgroup/keychain-tests-$name
  else container_fail "no systemd or unified cgroup hierarchy at /sys/fs/cgroup"; return; fi
  mkdir -p "$cg"
  echo "$cg" >"$dir/cgroup"
  container_launch "$name"
}

# Runs systemd-nspawn on NAME's overlay (mounted by container_boot, kept across a reboot) and waits until
# systemd inside is up.
container_launch() {
  local name=$1 dir leader state cg
  dir=$(container_dir "$name")
  cg=$(cat "$dir/cgroup")
  # setsid: the container's console is a pipe to our log, never our terminal.
  # CONTAINER_NSPAWN_ARGS: more of nspawn's options (e.g. --setenv=SYSTEMD_TPM2_DEVICE=… for PID 1).
  # shellcheck disable=SC2086
  setsid bash -c 'cg=$1 root=$2 machine=$3; shift 3; echo $$ >"$cg/cgroup.procs" && exec systemd-nspawn -q -D "$root" -b --register=no \
      --keep-unit --console=pipe --machine="$machine" --resolv-conf=off "$@" </dev/null' _ "$cg" "$dir/root" "kc-$name" \
      ${CONTAINER_NSPAWN_ARGS:-} >"$dir/console.log" 2>&1 &
  echo $! >"$dir/nspawn.pid"
  local i
  for i in $(seq 1 150); do
    if ! kill -0 "$(cat "$dir/nspawn.pid")" 2>/dev/null; then
      tail -n 30 "$dir/console.log" >&2
      container_fail "systemd-nspawn exited before the container booted (console above): this machine cannot boot it"
      return
    fi
    leader=$(container_leader "$name" 2>/dev/null || true)
    if [ -n "$leader" ]; then
      state=$(container_exec "$name" systemctl is-system-running 2>/dev/null || true)
      case "$state" in running|degraded) return 0 ;; esac
    fi
    sleep 0.2
  done
  tail -n 30 "$dir/console.log" >&2
  container_fail "systemd in $name did not come up in 30 s (state '${state:-none}', console above)"
}

# Reboots NAME as a device reboots: `systemctl reboot` inside (every unit stopped in order, then PID 1's
# reboot(), on which systemd-nspawn exits with status 133 rather than boot again), then a new boot of the same
# overlay, so whatever was written inside (the package, its enablement links, the store) is still there.
container_reboot() {
  local name=$1 dir pid i
  dir=$(container_dir "$name")
  pid=$(cat "$dir/nspawn.pid")
  container_exec "$name" systemctl reboot || container_fail "systemctl reboot failed in $name" || return
  for i in $(seq 1 150); do container_running "$pid" || break; sleep 0.2; done
  if container_running "$pid"; then container_fail "$name did not go down within 30 s of systemctl reboot"; return; fi
  wait "$pid" 2>/dev/null || true
  container_launch "$name"
}

# Whether process PID still runs: a zombie (nspawn exited, its parent this shell, not reaped yet) does not.
container_running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }

# The container's PID 1 as the host sees it: the child of systemd-nspawn.
container_leader() {
  local dir pid
  dir=$(container_dir "$1")
  pid=$(cat "$dir/nspawn.pid")
  local child
  child=$(cat /proc/"$pid"/task/*/children 2>/dev/null | tr ' ' '\n' | grep -m1 . || true)
  [ -n "$child" ] && [ "$(cat /proc/"$child"/comm 2>/dev/null)" = systemd ] && echo "$child"
}

# Runs a command inside NAME as root (all of its namespaces, its root), with a plain environment.
container_exec() {
  local name=$1 leader; shift
  leader=$(container_leader "$name") || container_fail "$name is not running" || return
  nsenter --target "$leader" --mount --uts --ipc --net --pid --root -- \
    /usr/bin/env -i -C / PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

# Copies a host file into NAME (through the overlay's upper layer is not safe: write through the mount).
container_put() { cp "$2" "$(container_dir "$1")/root/$3"; }

# Stops NAME (poweroff, then SIGKILL after 10 s) and removes its overlay and cgroup.
container_stop() {
  local name=$1 dir pid
  dir=$(container_dir "$name")
  [ -d "$dir" ] || return 0
  if [ -f "$dir/nspawn.pid" ] && pid=$(cat "$dir/nspawn.pid") && kill -0 "$pid" 2>/dev/null; then
    # SIGRTMIN+4 to the container's systemd is poweroff; nspawn exits once it has.
    local leader; leader=$(container_leader "$name" 2>/dev/null || true)
    [ -n "$leader" ] && kill -s SIGRTMIN+4 "$leader" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    local i; for i in $(seq 1 50); do container_running "$pid" || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  mountpoint -q "$dir/root" && umount -l "$dir/root"
  [ -f "$dir/cgroup" ] && rmdir "$(cat "$dir/cgroup")" 2>/dev/null
  rm -rf "$dir"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    root) container_root ;;
    *) echo "usage: $0 root   (builds or prints the cached root; source the file for the rest)" >&2; exit 2 ;;
  esac
fi
