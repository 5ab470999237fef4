#!/bin/sh
# Runs the integration suites of the TPM layer, the engine, keychaind and provisioning on TPMs that
# behave like chips (docs/tpm-profiles.md): every SoftwareTPM() of the run takes the profile that
# KEYCHAIN_TEST_TPM_PROFILE names. The same results are expected as on plain swtpm, only slower; no
# test asserts on time. CI (scripts/test.sh) runs this script's default suites on fast, typical and old
# (93-103, 108-175 and 43-44 s on the shared 2-core machine, 2026-12-05); the whole of both test targets on a profile is
#   FILTER='TPM2Tests|KeychainTests' scripts/tpm-profiles.sh typical     (543 tests, about 7 minutes)
#   scripts/tpm-profiles.sh               fast and typical profiles, then the old firmware's suites
#   scripts/tpm-profiles.sh typical       one profile (fast, typical, slow or old)
# Set FILTER to run other suites. Builds first (debug, tests included); exits non-zero if a run fails.
set -eu
cd "$(dirname "$0")/.."
PATH=/opt/swift/usr/bin:$PATH
swift build --build-tests -Xswiftc -warnings-as-errors >&2  # the flags of the usual build, so it is reused
# Suites that mean the same on any chip (the TPM layer's, the engine's, keychaind's, provisioning's).
ALL="TrialSessionTests|AccessibleLevelTests|SeedContractTests|BootStateTests|BootApprovalTests|ProvisioningTests|DaemonEngineTests|DaemonTests|RollbackTests|ChipProfileKeychainTests"
# On revision 1.16 (no PolicyAuthorizeNV): approvals are UNSUPPORTED there, so no BootApprovalTests.
OLD="AccessibleLevelTests|SeedContractTests|BootStateTests|ChipProfileKeychainTests"
status=0
for profile in ${1:-fast typical old}; do
    suites=${FILTER:-$ALL}
    [ "$profile" = old ] && suites=${FILTER:-$OLD}
    started=$(date +%s)
    if KEYCHAIN_TEST_TPM_PROFILE=$profile swift test --skip-build --filter "$suites" >&2; then result=passed; else result=FAILED; status=1; fi
    echo "profile $profile: $result in $(( $(date +%s) - started )) s ($suites)"
done
exit $status
