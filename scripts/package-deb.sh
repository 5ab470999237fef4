#!/usr/bin/env bash
# Builds the Debian packages from this repository with dpkg-buildpackage (debian/: debhelper, dh_shlibdeps,
# dh_strip, dh_installsystemd): keychain-linux (the commands, one executable, keychain-multicall, with a link named
# after each; keychaind's units, sysusers and tmpfiles entries, the Secret Service activation, man pages, bash
# completion), keychain-linux-bench, the C library (libkeychain1, libkeychain-dev) and their -dbgsym packages.
# The executables link the Swift runtime statically (checked with ldd: nothing from a Swift toolchain).
#
#   scripts/package-deb.sh [--out DIR]
#
# --out: where the packages go (default .build/deb). Prints the runtime package's path on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.build/deb
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
  esac
done

version=$(cat dist/VERSION)
changelog=$(dpkg-parsechangelog -S Version)
[ "$changelog" = "$version" ] || { echo "package-deb: debian/changelog says $changelog, dist/VERSION $version: make them agree" >&2; exit 1; }
command -v swift >/dev/null || { echo "package-deb: swift is not on PATH (the Swift 6 toolchain)" >&2; exit 1; }
arch=$(dpkg --print-architecture)

# dpkg-buildpackage writes its results beside the source tree: they are moved to $out, and only the files this
# version makes there are touched.
parent=$(cd .. && pwd)
names=()
for p in keychain-linux keychain-linux-bench libkeychain1; do
  names+=("${p}_${version}_${arch}.deb" "${p}-dbgsym_${version}_${arch}.deb")
done
names+=("libkeychain-dev_${version}_${arch}.deb" "keychain-linux_${version}_${arch}.buildinfo" "keychain-linux_${version}_${arch}.changes")
for n in "${names[@]}"; do rm -f "$parent/$n"; done
# -b: binary packages only; -nc: no clean, so the Swift build stays (incremental), but its stamp goes, so that
# debian/rules builds again; no signing.
rm -f debian/debhelper-build-stamp
dpkg-buildpackage -b -nc -us -uc >&2

# No Swift toolchain on the target: nothing may load from it, nor a Swift runtime or Foundation library.
tree=debian/keychain-linux
for exe in "$tree"/usr/lib/keychain-linux/* debian/keychain-linux-bench/usr/lib/keychain-linux/*; do
  libs=$(ldd "$exe")
  if grep -Eq 'not found|/opt/swift|libswift|libFoundation|libdispatch|libBlocksRuntime|lib_FoundationICU|libicu' <<<"$libs"; then
    echo "package-deb: $exe still needs the Swift toolchain's libraries:" >&2
    grep -E 'not found|/opt/swift|libswift|libFoundation|libdispatch|libBlocksRuntime|lib_FoundationICU|libicu' <<<"$libs" >&2
    exit 1
  fi
done

# CTSSCrypto's one OpenSSL context per process works only while tpm2-tss finds OSSL_LIB_CTX_new and _free in the
# executable: with --no-export-dynamic (debian/rules) they stay in its dynamic symbol table because libcrypto refers to them.
for exe in "$tree"/usr/lib/keychain-linux/keychain-multicall debian/keychain-linux-bench/usr/lib/keychain-linux/keychain-bench; do
  exported=$(nm -D --defined-only "$exe" | awk '{print $3}' | grep -cxE 'OSSL_LIB_CTX_(new|free)' || true)
  [ "$exported" = 2 ] || { echo "package-deb: $exe does not export OSSL_LIB_CTX_new and _free: tpm2-tss would make an OpenSSL context per hash" >&2; exit 1; }
done

mkdir -p "$out"
for n in "${names[@]}"; do [ -f "$parent/$n" ] && mv "$parent/$n" "$out/"; done
echo "$out/keychain-linux_${version}_${arch}.deb"
