// SPDX-License-Identifier: MIT
//
// Not for users: loaded with LD_PRELOAD into one of our programs by TSSCryptoTests, it says at the
// program's exit whether OpenSSL's clean-up ran (Sources/CTSSCrypto/tss_crypto.c turns it off).
//
// Its constructor runs before the program's own and before anything initializes OpenSSL, so the
// handler it registers with atexit is registered before any OPENSSL_cleanup libcrypto would
// register, and runs after it (exit runs its handlers in reverse order). OPENSSL_init_crypto
// returns 0 once OPENSSL_cleanup has run. The verdict goes to stderr as one line.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <openssl/crypto.h>

// OpenSSL 3's internal flag (include/crypto/crypto.h, not installed): initialize only the base and,
// after OPENSSL_cleanup, return 0 without raising an error into the freed error tables.
#ifndef OPENSSL_INIT_BASE_ONLY
#define OPENSSL_INIT_BASE_ONLY 0x00040000L
#endif

static void sayWhetherOpenSSLWasCleanedUp(void) {
    const char *line = OPENSSL_init_crypto(OPENSSL_INIT_BASE_ONLY, NULL) == 1
        ? "keychain-exit-probe: OpenSSL alive at exit\n"
        : "keychain-exit-probe: OPENSSL_cleanup ran at exit\n";
    // write, not stdio: stdio may be flushed and closed by now.
    ssize_t ignored = write(2, line, __builtin_strlen(line));
    (void)ignored;
}

__attribute__((constructor)) static void registerTheProbe(void) {
    atexit(sayWhetherOpenSSLWasCleanedUp);
}
