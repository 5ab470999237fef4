#!/usr/bin/env bash
# Starts a software TPM by hand for experiments: state in DIR, commands on PORT, control on PORT+1.
#   swtpm/start.sh /tmp/tpm 2321 && export KEYCHAIN_TCTI=swtpm:host=127.0.0.1,port=2321
# The library and its tests start their own (KeychainTestSupport.SoftwareTPM, the embedded TPM);
# this script is for using keychainctl and tpm2-tools against one TPM side by side.
set -euo pipefail
dir=${1:?usage: swtpm/start.sh DIR [PORT]}
port=${2:-2321}
mkdir -p "$dir" && chmod 700 "$dir"
swtpm socket --tpm2 \
  --server type=tcp,port="$port",bindaddr=127.0.0.1 \
  --ctrl type=tcp,port="$((port + 1))",bindaddr=127.0.0.1 \
  --tpmstate dir="$dir" --flags not-need-init,startup-clear \
  --pid file="$dir/swtpm.pid" --log file="$dir/swtpm.log" --daemon
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.05; done
# Low dictionary-attack limits: a mistyped owner or lockout password never locks the TPM for 1000 s.
TPM2TOOLS_TCTI="swtpm:host=127.0.0.1,port=$port" tpm2_dictionarylockout -s -n 32 -t 10 -l 10 >/dev/null 2>&1 || true
echo "swtpm:host=127.0.0.1,port=$port"
