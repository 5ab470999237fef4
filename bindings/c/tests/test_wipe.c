/* No freed memory holds a secret: this program's free() replaces libc's for the library too (the executable's
 * symbol comes first), and looks into every block before it goes back to malloc. A value written and read, and a
 * passcode answered, must never be in a block freed by the library, the kc_secret included.
 * Usage: test_wipe (KEYCHAIN_SOCKET: a keychaind with the device passcode PASSCODE). */
#define _GNU_SOURCE
#include "keychain.h"
#include "check.h"

#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#define PASSCODE "482916"
static const char value_mark[] = "wipe-me-7f3a9c-value-bytes";

extern void __libc_free(void *);

static int watching, value_seen, passcode_seen, secret_block_zero = -1;
static const void *secret_block;

static int holds(const unsigned char *block, size_t n, const char *mark) {
    size_t k = strlen(mark);
    return n >= k && memmem(block, n, mark, k) != NULL;
}

void free(void *p) {
    if (p && watching) {
        size_t n = malloc_usable_size(p);
        value_seen += holds(p, n, value_mark);
        passcode_seen += holds(p, n, PASSCODE);
        if (p == secret_block) {
            secret_block_zero = 1;
            for (size_t i = 0; i < strlen(value_mark); i++) secret_block_zero &= ((unsigned char *)p)[i] == 0;
        }
    }
    __libc_free(p);
}

static void passcode_prompter(void *context, const kc_prompt_request *r, kc_answer *a) {
    (void)context, (void)r;
    char passcode[] = PASSCODE;
    kc_answer_passcode(a, passcode, strlen(passcode));
    explicit_bzero(passcode, sizeof passcode);
}

static void the_check_sees_a_secret_left_in_a_freed_block(void) {
    watching = 1;
    /* Through volatile pointers: the compiler may not drop the pair as dead stores. */
    void (*volatile release)(void *) = free;
    char *volatile left = malloc(64);
    memcpy(left, value_mark, sizeof value_mark);
    release(left);
    watching = 0;
    CHECK(value_seen == 1);
    value_seen = 0;
}

static void a_value_written_and_read_is_in_no_freed_block(void) {
    char service[64];
    snprintf(service, sizeof service, "c-wipe-%d", (int)getpid());
    kc_options o = {.service = service, .prompting = KC_PROMPT_CALLBACK, .prompter = passcode_prompter};
    kc_storage *s = NULL;
    OK(kc_storage_new(&o, &s, ERR));
    watching = 1;
    kc_set_options guarded = {.access_control = KC_ACCESS_CONTROL_PASSCODE};
    OK(kc_set_item(s, "plain", value_mark, strlen(value_mark), NULL, ERR));
    OK(kc_set_item(s, "guarded", value_mark, strlen(value_mark), &guarded, ERR));
    const char *keys[] = {"plain", "guarded"};
    for (int i = 0; i < 2; i++) {
        kc_secret *got = NULL;
        OK(kc_get_item(s, keys[i], NULL, &got, ERR));
        CHECK(got && kc_secret_size(got) == strlen(value_mark) && !memcmp(kc_secret_data(got), value_mark, strlen(value_mark)));
        secret_block = kc_secret_data(got);
        secret_block_zero = -1;
        kc_secret_free(got);
        CHECK(secret_block_zero == 1);  /* the value's own block, zero when freed */
    }
    OK(kc_clear(s, ERR));
    watching = 0;
    CHECK(value_seen == 0);
    CHECK(passcode_seen == 0);
    if (value_seen || passcode_seen) fprintf(stderr, "freed blocks holding the value: %d, the passcode: %d\n", value_seen, passcode_seen);
    kc_storage_free(s);
}

int main(int argc, char **argv) {
    static const test tests[] = {
        {"check_sees_a_secret", the_check_sees_a_secret_left_in_a_freed_block, 0},
        {"secrets_wiped", a_value_written_and_read_is_in_no_freed_block, 0},
    };
    return run_tests(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
