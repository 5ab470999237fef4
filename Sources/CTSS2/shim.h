#ifndef KEYCHAIN_CTSS2_SHIM_H
#define KEYCHAIN_CTSS2_SHIM_H
#include <tss2/tss2_esys.h>
#include <tss2/tss2_tctildr.h>
#include <tss2/tss2_rc.h>
#include <tss2/tss2_mu.h>

// Macros built from other macros do not import into Swift: re-export the ones we use.
static const TPM2_RC KC_RC_LOCKOUT = TPM2_RC_LOCKOUT;
static const TPM2_RC KC_RC_RETRY = TPM2_RC_RETRY;
static const TPM2_RC KC_RC_YIELDED = TPM2_RC_YIELDED;
static const TPM2_RC KC_RC_TESTING = TPM2_RC_TESTING;
static const TPM2_RC KC_RC_NV_RATE = TPM2_RC_NV_RATE;
static const TPM2_PT KC_PT_LOCKOUT_COUNTER = TPM2_PT_LOCKOUT_COUNTER;
static const TPM2_PT KC_PT_MAX_AUTH_FAIL = TPM2_PT_MAX_AUTH_FAIL;
static const TPM2_PT KC_PT_MANUFACTURER = TPM2_PT_MANUFACTURER;
static const TPM2_PT KC_PT_PERMANENT = TPM2_PT_PERMANENT;
static const ESYS_TR KC_ESYS_TR_NONE = ESYS_TR_NONE;
static const ESYS_TR KC_ESYS_TR_PASSWORD = ESYS_TR_PASSWORD;
static const ESYS_TR KC_ESYS_TR_RH_OWNER = ESYS_TR_RH_OWNER;
static const ESYS_TR KC_ESYS_TR_RH_LOCKOUT = ESYS_TR_RH_LOCKOUT;
static const ESYS_TR KC_ESYS_TR_RH_NULL = ESYS_TR_RH_NULL;
static const ESYS_TR KC_ESYS_TR_RH_ENDORSEMENT = ESYS_TR_RH_ENDORSEMENT;
static const TPMA_SESSION KC_SESSION_CONTINUE = TPMA_SESSION_CONTINUESESSION;
static const TPMA_SESSION KC_SESSION_DECRYPT = TPMA_SESSION_DECRYPT;
static const TPMA_SESSION KC_SESSION_ENCRYPT = TPMA_SESSION_ENCRYPT;
static const TPM2_PT KC_PT_HR_LOADED = TPM2_PT_HR_LOADED;
static const TPM2_PT KC_PT_HR_ACTIVE = TPM2_PT_HR_ACTIVE;
static const TPM2_PT KC_PT_HR_TRANSIENT_AVAIL = TPM2_PT_HR_TRANSIENT_AVAIL;

// The TCTI's transmit and receive are macros over a function table: a raw command for handles
// ESAPI has no resource for (another process's leftover sessions).
static inline TSS2_RC kc_tcti_transmit(TSS2_TCTI_CONTEXT *tcti, size_t size, const uint8_t *command) {
    return Tss2_Tcti_Transmit(tcti, size, command);
}
static inline TSS2_RC kc_tcti_receive(TSS2_TCTI_CONTEXT *tcti, size_t *size, uint8_t *response) {
    return Tss2_Tcti_Receive(tcti, size, response, TSS2_TCTI_TIMEOUT_BLOCK);
}
#endif
