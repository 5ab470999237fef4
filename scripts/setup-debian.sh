#!/usr/bin/env bash
# Installs what Keychain for Linux needs on Debian 12: the C libraries it links, the software TPM and
# the tools its tests and benchmark use. Idempotent; needs root (or sudo).
set -euo pipefail
packages=(
  libtss2-dev libsodium-dev libsqlite3-dev libssl-dev pkg-config   # linked: tpm2-tss (esys, tctildr, rc, mu), libsodium, sqlite3, libcrypto (seal-for, boot-policy signing)
  swtpm swtpm-tools                                      # the embedded and test software TPM
  tpm2-tools tpm2-abrmd libtss2-tcti-tabrmd0 dbus        # tests: the tpm2-tools reference, the resource manager
  python3                                                # store tests: a second SQLite process
  libsystemd-dev                                         # linked: sd-bus, keychain-secret-service's D-Bus connection
  dbus-daemon libsecret-tools python3-secretstorage python3-jeepney python3-keyring python3-gi gir1.2-secret-1  # Secret Service tests: a private bus, the real clients
  gnome-keyring                                          # Secret Service benchmark: the provider we compare with
  openssl                                                # identity tests: the EK certificate and its chain (swtpm_localca uses it too)
  libp11-kit-dev softhsm2 opensc                         # the PKCS#11 backend and its tests (SoftHSM2, pkcs11-tool)
  opencryptoki                                           # TokenModuleTests: openCryptoki's software token (pkcsslotd)
  libtpm2-pkcs11-1 libtpm2-pkcs11-tools                  # TokenModuleTests: tpm2-pkcs11 (tpm2_ptool), through tpm2-abrmd
  debhelper dpkg-dev debootstrap systemd-container lintian bc binutils  # the package (dpkg-buildpackage) and its tests under a booted systemd (scripts/test-systemd.sh)
  gcr xvfb xdotool                                       # SystemPrompterTests: gcr-prompter under Xvfb, its dialog typed into
  systemd util-linux                                     # SystemPromptTests: systemd-tty-ask-password-agent answering the ask-password protocol (script, unshare)
  iproute2                                               # FrozenTPMTests: ss, what a stopped swtpm has not read yet
  golang-docker-credential-helpers                       # bindings/python: docker-credential-keychain compared with the reference helpers
  gcc make valgrind                                      # bindings/c: libkeychain and its test programs (plain make and cc; pkg-config above), memcheck
  python3-pytest python3-venv python3-setuptools python3-wheel python3-mypy git  # bindings/python: its pytest suite, a venv outside the checkout (pip install, offline), its type hints (mypy --strict), git's credential helper
  nodejs node-typescript                                 # the Node package (bindings/node): node --test, tsc's checks of index.d.ts and the seed's examples
  bubblewrap                                             # PerApplicationDaemonTests: sandboxes with a /.flatpak-info, as Flatpak makes them (bwrap)
  xdg-desktop-portal python3-dbus                        # PortalSecretTests: the real Secret portal (1.16) in front of our backend, its sandboxed clients
)
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v swift >/dev/null || { echo "swift is not on PATH (Swift 6 toolchain, e.g. /opt/swift/usr/bin)" >&2; exit 1; }
