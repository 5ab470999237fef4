#!/usr/bin/env bash
# Starts a software TPM by hand for experiments: state and Unix sockets in DIR (made 0700, so only
# you can connect; no TCP port). Prints its TCTI string:
#   export KEYCHAIN_TCTI=$(swtpm/start.sh /tmp/tpm)    # swtpm:path=/tmp/tpm/tpm
# The library and its tests start their own (KeychainTestSupport.SoftwareTPM, the embedded TPM);
# this script is for using keychainctl and tpm2-tools against one TPM side by side.
set -euo pipefail
dir=${1:?usage: swtpm/start.sh DIR}
mkdir -p "$dir" && chmod 700 "$dir"
dir=$(cd "$dir" && pwd)
swtpm socket --tpm2 \
  --server type=unixio,path="$dir/tpm",mode=0600 \
  --ctrl type=unixio,path="$dir/tpm.ctrl",mode=0600 \
  --tpmstate dir="$dir" --flags not-need-init,startup-clear \
  --pid file="$dir/swtpm.pid" --log file="$dir/swtpm.log" --daemon
for _ in $(seq 100); do [ -S "$dir/tpm" ] && [ -S "$dir/tpm.ctrl" ] && break; sleep 0.05; done
# Low dictionary-attack limits: a mistyped owner or lockout password never locks the TPM for 1000 s.
TPM2TOOLS_TCTI="swtpm:path=$dir/tpm" tpm2_dictionarylockout -s -n 32 -t 10 -l 10 >/dev/null 2>&1 || true
echo "swtpm:path=$dir/tpm"
