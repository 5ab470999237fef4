// SPDX-License-Identifier: MIT
#ifndef CTSSCRYPTO_H
#define CTSSCRYPTO_H

/// What the OSSL_LIB_CTX interposer has done in this process (tss_crypto.c), for tests and measurements.
typedef struct {
    /// OSSL_LIB_CTX_new calls made by libtss2-esys: each got the one shared private context.
    unsigned long esysRequests;
    /// Real OSSL_LIB_CTX_new calls made for libtss2-esys (1 once the shared context exists).
    unsigned long esysContextsMade;
    /// OSSL_LIB_CTX_free calls of the shared context, skipped.
    unsigned long esysFreesSkipped;
    /// OSSL_LIB_CTX_new and OSSL_LIB_CTX_free calls of every other caller, forwarded unchanged.
    unsigned long forwardedNews;
    unsigned long forwardedFrees;
} CTSSCryptoCounts;

CTSSCryptoCounts CTSSCrypto_counts(void);

/// The private context libtss2-esys shares, or NULL before its first OSSL_LIB_CTX_new.
const void *CTSSCrypto_sharedContext(void);

#endif
