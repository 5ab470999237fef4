/* Warm reads through keychaind from C (scripts/bench-c.py): one item, then N get_item calls from one caller on its
 * kept connection. Prints "C: N reads in S s, R reads/s, U µs of the client's CPU a read".
 * Usage: bench SOCKET N */
#define _POSIX_C_SOURCE 200809L
#include "keychain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) return fprintf(stderr, "usage: bench SOCKET N\n"), 2;
    long reads = atol(argv[2]);
    const char *secret = "a secret of 32 bytes, more or less";
    kc_options o = {.service = "warm", .socket = argv[1]};
    kc_storage *s = NULL;
    kc_error *e = NULL;
    if (kc_storage_new(&o, &s, &e) || kc_set_item(s, "k0", secret, strlen(secret), NULL, &e))
        return fprintf(stderr, "%s\n", kc_error_message(e)), 1;
    double started = seconds(CLOCK_MONOTONIC), cpu = seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < reads; i++) {
        kc_secret *value = NULL;
        if (kc_get_item(s, "k0", NULL, &value, &e) || !value || kc_secret_size(value) != strlen(secret))
            return fprintf(stderr, "read %ld: %s\n", i, kc_error_message(e)), 1;
        kc_secret_free(value);
    }
    double elapsed = seconds(CLOCK_MONOTONIC) - started, used = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu;
    printf("C: %ld reads in %.2f s, %.0f reads/s, %.0f µs of the client's CPU a read\n", reads, elapsed, reads / elapsed,
           used / reads * 1e6);
    kc_storage_free(s);
    return 0;
}
