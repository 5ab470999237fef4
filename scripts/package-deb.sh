#!/usr/bin/env bash
# Builds keychain_<version>_<arch>.deb from this repository: every executable linked so that it runs on a
# Debian 12 with no Swift toolchain (the Swift runtime and Foundation static: `--static-swift-stdlib`, checked
# with ldd), the units, sysusers and tmpfiles entries, man pages and bash completion (dist/).
#
#   scripts/package-deb.sh [--out DIR] [--no-build]
#
# --out: where the .deb goes (default .build/deb); --no-build: package the release build already there.
# Prints the .deb's path on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.build/deb
build=1
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "usage: $0 [--out DIR] [--no-build]" >&2; exit 2 ;;
  esac
done

version=$(cat dist/VERSION)
arch=$(dpkg --print-architecture)
deb="$out/keychain_${version}_${arch}.deb"

flags=(-c release --static-swift-stdlib)
if ((build)); then swift build "${flags[@]}" >&2; fi
bin=$(swift build "${flags[@]}" --show-bin-path)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg="$stage/keychain"
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/sbin" "$pkg/usr/lib/keychain" "$pkg/lib/systemd/system" \
  "$pkg/usr/lib/sysusers.d" "$pkg/usr/lib/tmpfiles.d" "$pkg/usr/share/man/man1" "$pkg/usr/share/man/man8" \
  "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/doc/keychain"

# keychainctl and keychainctl-full go together (the front runs the full tool from its own directory).
install -m 0755 "$bin/keychainctl" "$bin/keychainctl-full" "$pkg/usr/bin/"
install -m 0755 "$bin/keychaind" "$pkg/usr/sbin/"
# The Secret Service provider: D-Bus activation, and its user unit where a systemd user manager runs.
install -m 0755 "$bin/keychain-secret-service" "$pkg/usr/bin/"
install -d "$pkg/usr/share/dbus-1/services" "$pkg/usr/lib/systemd/user"
# Its own file name: gnome-keyring ships org.freedesktop.secrets.service, and both packages may be installed.
install -m 0644 dist/dbus/org.freedesktop.secrets.service "$pkg/usr/share/dbus-1/services/org.freedesktop.secrets.keychain.service"
install -m 0644 dist/systemd/user/keychain-secret-service.service "$pkg/usr/lib/systemd/user/"
# The benchmark (docs/performance.md) is not a command for users: off PATH.
install -m 0755 "$bin/keychain-bench" "$pkg/usr/lib/keychain/"

# No Swift toolchain on the target: nothing may load from it, nor a Swift runtime or Foundation library.
for exe in "$pkg"/usr/bin/* "$pkg"/usr/sbin/* "$pkg"/usr/lib/keychain/*; do
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$exe"
  libs=$(ldd "$exe")
  if grep -Eq 'not found|/opt/swift|libswift|libFoundation|libdispatch|libBlocksRuntime|lib_FoundationICU|libicu' <<<"$libs"; then
    echo "package-deb: $exe still needs the Swift toolchain's libraries:" >&2
    grep -E 'not found|/opt/swift|libswift|libFoundation|libdispatch|libBlocksRuntime|lib_FoundationICU|libicu' <<<"$libs" >&2
    exit 1
  fi
done

install -m 0644 dist/systemd/keychaind.socket dist/systemd/keychaind.service "$pkg/lib/systemd/system/"
install -m 0644 dist/systemd/keychaind.sysusers.conf "$pkg/usr/lib/sysusers.d/keychaind.conf"
install -m 0644 dist/systemd/keychain.tmpfiles.conf "$pkg/usr/lib/tmpfiles.d/keychain.conf"
gzip -9n <dist/man/keychainctl.1 >"$pkg/usr/share/man/man1/keychainctl.1.gz"
echo ".so man1/keychainctl.1" | gzip -9n >"$pkg/usr/share/man/man1/keychainctl-full.1.gz"
gzip -9n <dist/man/keychaind.8 >"$pkg/usr/share/man/man8/keychaind.8.gz"
gzip -9n <dist/man/keychain-secret-service.1 >"$pkg/usr/share/man/man1/keychain-secret-service.1.gz"
install -m 0644 dist/bash-completion/keychainctl "$pkg/usr/share/bash-completion/completions/keychainctl"
install -m 0644 docs/daemon.md "$pkg/usr/share/doc/keychain/daemon.md"
install -m 0644 docs/credentials.md docs/secret-service.md "$pkg/usr/share/doc/keychain/"

# Debian's machine-readable copyright, and the changelog a native package carries.
{
  echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
  echo "Upstream-Name: keychain"
  echo
  echo "Files: *"
  grep -m1 '^Copyright' LICENSE
  echo "License: Expat"
  sed -n '/^Permission/,$p' LICENSE | sed 's/^$/./; s/^/ /'
} >"$pkg/usr/share/doc/keychain/copyright"
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
{
  echo "keychain ($version) unstable; urgency=medium"
  echo
  echo "  * Built from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)."
  echo
  echo " -- Keychain for Linux authors <keychain-linux@users.noreply.github.com>  $date"
} | gzip -9n >"$pkg/usr/share/doc/keychain/changelog.gz"

# Depends: the Debian package of every shared library the executables load (ldd, then dpkg -S), at least
# the version built against.
declare -A seen=()
depends=()
while read -r lib; do
  # dpkg knows a file by the path its package ships, /lib or /usr/lib (merged /usr).
  package=""
  for path in "$lib" "${lib#/usr}" "/usr$lib"; do
    package=$(dpkg -S "$path" 2>/dev/null | head -n1 | cut -d: -f1) && [ -n "$package" ] && break
  done
  [ -n "$package" ] || { echo "package-deb: no Debian package ships $lib" >&2; exit 1; }
  [ -n "${seen[$package]:-}" ] && continue
  seen[$package]=1
  upstream=$(dpkg-query -W -f='${Version}' "$package" | sed 's/-[^-]*$//')
  depends+=("$package (>= $upstream)")
done < <(for exe in "$pkg"/usr/bin/* "$pkg"/usr/sbin/* "$pkg"/usr/lib/keychain/*; do ldd "$exe"; done \
         | awk '$3 ~ /^\// {print $3}' | sort -u)
# tpm2-tss loads its TCTI modules with dlopen: the TPM device's and swtpm's.
for p in libtss2-tcti-device0 libtss2-tcti-swtpm0; do
  [ -n "${seen[$p]:-}" ] || depends+=("$p")
done
depends+=("init-system-helpers (>= 1.54~)" "systemd | systemd-standalone-sysusers")

installed_size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<EOF
Package: keychain
Version: $version
Architecture: $arch
Maintainer: Keychain for Linux authors <keychain-linux@users.noreply.github.com>
Installed-Size: $installed_size
Depends: $(IFS=,; echo "${depends[*]}" | sed 's/,/, /g')
Suggests: swtpm, tpm2-tools
Section: admin
Priority: optional
Homepage: https://github.com/keychain-linux/keychain
Description: TPM-backed keychain with the iOS and Android keychain contract
 Items are kept per service and key, encrypted under keys of the device's
 TPM 2.0 (or a PKCS#11 token), each with an accessibility level and an
 access control (passcode, fingerprint). keychaind serves every local user
 over one TPM connection and hands systemd services their credentials
 (LoadCredential= from its credentials socket); keychainctl is the command.
EOF
install -m 0755 dist/debian/postinst dist/debian/prerm dist/debian/postrm "$pkg/DEBIAN/"
(cd "$pkg" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$pkg/DEBIAN/md5sums"
chmod 0644 "$pkg/DEBIAN/md5sums" "$pkg/DEBIAN/control"

mkdir -p "$out"
dpkg-deb --root-owner-group -Zgzip --build "$pkg" "$deb" >&2
echo "$deb"
