// SPDX-License-Identifier: MIT
//
// One private OpenSSL library context for all of tpm2-tss's crypto, instead of one per operation.
//
// tpm2-tss 3.2.1 (src/tss2-esys/esys_crypto_ossl.c) calls OSSL_LIB_CTX_new for every hash and HMAC
// context, every caller nonce and the RSA salt, and frees it after: about 10 contexts per cold read,
// each loading the default provider and building its algorithm tables again (docs/performance.md,
// "Cold read"). It makes its own context so that it never hashes or draws nonces through a provider
// loaded in OpenSSL's global context (a TPM provider). 3.2.1 has no crypto callbacks
// (Esys_SetCryptoCallbacks is 4.0's), so this file interposes the two calls instead: a program
// linking it defines OSSL_LIB_CTX_new and OSSL_LIB_CTX_free, the dynamic linker binds
// libtss2-esys's references to these definitions, and
// - a call from libtss2-esys gets one process-wide context made once by libcrypto's OSSL_LIB_CTX_new,
//   never the global default one, so tpm2-tss's isolation from the global context stays; its free is
//   skipped;
// - every other call (ours, SoftHSM2, tpm2-pkcs11, FAPI) goes to libcrypto's functions unchanged.
//
// - Important: 3.2.1 keeps nothing of its own in the context between operations (its hash and HMAC
//   states are separate objects, freed after each). What stays is OpenSSL's: the default provider,
//   fetched algorithms, and DRBGs, which OpenSSL keeps per thread and reseeds in a forked child (it
//   compares the pid at each generate). OpenSSL contexts are safe to share between threads.
//
// And one more process-wide setting, here because every program that links TPM2 links this file:
// OpenSSL's own clean-up at exit is turned off. libcrypto registers OPENSSL_cleanup with atexit on
// its first initialization, and exit() then frees OpenSSL's global tables while other threads of
// the process may still use them or run OpenSSL's thread-exit handlers (openssl/openssl#6214). A
// Swift program calls exit from a pool thread while idle libdispatch workers, which ran TPM and
// OpenSSL work, exit too: keychainctl-full aborted in about 1 of 1,000 runs under load with
// "malloc_consolidate(): invalid chunk size", OPENSSL_cleanup on one thread and a worker's
// tcache_thread_shutdown on another. OPENSSL_INIT_NO_ATEXIT (OPENSSL_init_crypto(3)) keeps the
// clean-up from being registered; the memory it would free goes back to the system with the process.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <openssl/crypto.h>

#include "CTSSCrypto.h"

typedef OSSL_LIB_CTX *(*NewFunction)(void);
typedef void (*FreeFunction)(OSSL_LIB_CTX *);

static NewFunction realNew;
static FreeFunction realFree;
// Where libtss2-esys's loaded segments are (0 and 0 when it is not loaded), found once: a dladdr of
// the caller at each call (ten per cold read) was about 3 % of a cold read's instructions. The
// library stays mapped: the program links it.
static uintptr_t esysStart, esysEnd;
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static _Atomic(OSSL_LIB_CTX *) shared;

static atomic_ulong esysRequests, esysContextsMade, esysFreesSkipped, forwardedNews, forwardedFrees;

/// dl_iterate_phdr's callback: the span of the loaded segments of the object holding `data`
/// (Esys_Initialize's address) becomes esysStart..<esysEnd.
static int findEsysSegments(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    uintptr_t start = UINTPTR_MAX, end = 0, function = (uintptr_t)data;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[i];
        if (segment->p_type != PT_LOAD) continue;
        uintptr_t from = info->dlpi_addr + segment->p_vaddr, to = from + segment->p_memsz;
        if (from < start) start = from;
        if (to > end) end = to;
    }
    if (function < start || function >= end) return 0;
    esysStart = start;
    esysEnd = end;
    return 1;
}

static void resolve(void) {
    realNew = (NewFunction)dlsym(RTLD_NEXT, "OSSL_LIB_CTX_new");
    realFree = (FreeFunction)dlsym(RTLD_NEXT, "OSSL_LIB_CTX_free");
    // libtss2-esys is a DT_NEEDED of every program that links the TPM2 target, loaded before main.
    void *esys = dlopen("libtss2-esys.so.0", RTLD_LAZY | RTLD_NOLOAD);
    if (esys == NULL) return;
    void *function = dlsym(esys, "Esys_Initialize");
    if (function != NULL) dl_iterate_phdr(findEsysSegments, function);
    dlclose(esys);
}

static int calledFromEsys(const void *returnAddress) {
    uintptr_t address = (uintptr_t)returnAddress;
    return esysStart != 0 && address >= esysStart && address < esysEnd;
}

/// The shared context, made on first use; two threads racing keep one and free the other.
static OSSL_LIB_CTX *sharedContext(void) {
    OSSL_LIB_CTX *context = atomic_load(&shared);
    if (context != NULL) return context;
    OSSL_LIB_CTX *made = realNew();
    if (made == NULL) return NULL;
    atomic_fetch_add(&esysContextsMade, 1);
    if (atomic_compare_exchange_strong(&shared, &context, made)) return made;
    realFree(made);
    return context;
}

OSSL_LIB_CTX *OSSL_LIB_CTX_new(void) {
    const void *caller = __builtin_return_address(0);
    pthread_once(&resolved, resolve);
    if (realNew == NULL) return NULL;
    if (calledFromEsys(caller)) {
        atomic_fetch_add(&esysRequests, 1);
        return sharedContext();
    }
    atomic_fetch_add(&forwardedNews, 1);
    return realNew();
}

void OSSL_LIB_CTX_free(OSSL_LIB_CTX *context) {
    pthread_once(&resolved, resolve);
    if (context != NULL && context == atomic_load(&shared)) {
        atomic_fetch_add(&esysFreesSkipped, 1);
        return;
    }
    atomic_fetch_add(&forwardedFrees, 1);
    if (realFree != NULL) realFree(context);
}

/// Before main and before anything in the program initializes OpenSSL: the first initialization
/// decides whether OPENSSL_cleanup is registered with atexit.
__attribute__((constructor)) static void noCleanupAtExit(void) {
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

CTSSCryptoCounts CTSSCrypto_counts(void) {
    return (CTSSCryptoCounts){
        .esysRequests = atomic_load(&esysRequests),
        .esysContextsMade = atomic_load(&esysContextsMade),
        .esysFreesSkipped = atomic_load(&esysFreesSkipped),
        .forwardedNews = atomic_load(&forwardedNews),
        .forwardedFrees = atomic_load(&forwardedFrees),
    };
}

const void *CTSSCrypto_sharedContext(void) { return atomic_load(&shared); }
