/* The tests' checks: each failure printed with its line, counted; a test is its own function. */
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>
#include <string.h>

static int failures, checks;

#define CHECK(condition)                                                                             \
    do {                                                                                             \
        checks++;                                                                                    \
        if (!(condition)) {                                                                          \
            failures++;                                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #condition);             \
        }                                                                                            \
    } while (0)

#define CHECK_STR(got, want)                                                                         \
    do {                                                                                             \
        const char *got_ = (got), *want_ = (want);                                                   \
        checks++;                                                                                    \
        if (!got_ || !want_ ? got_ != want_ : strcmp(got_, want_) != 0) {                            \
            failures++;                                                                              \
            fprintf(stderr, "%s:%d: %s is \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #got,       \
                    got_ ? got_ : "(null)", want_ ? want_ : "(null)");                               \
        }                                                                                            \
    } while (0)

/* A call that must succeed (it names its error ERR): its error printed otherwise. */
#define ERR (&e_)
#define OK(call)                                                                                     \
    do {                                                                                             \
        kc_error *e_ = NULL;                                                                         \
        kc_code c_ = (call);                                                                         \
        checks++;                                                                                    \
        if (c_ != KC_OK) {                                                                           \
            failures++;                                                                              \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, kc_code_name(c_), \
                    kc_error_message(e_));                                                           \
        }                                                                                            \
        kc_error_free(e_);                                                                           \
    } while (0)

/* Runs the tests named on the command line (all but the `alone` ones without one), printing ok/not ok per test. */
/* An `alone` test runs only when named (it needs a keychaind of its own). */
typedef struct test { const char *name; void (*run)(void); int alone; } test;

static int run_tests(const test *tests, int count, int argc, char **argv) {
    int failed_tests = 0;
    for (int i = 0; i < count; i++) {
        int chosen = argc < 2 && !tests[i].alone;
        for (int a = 1; a < argc; a++) chosen |= strcmp(argv[a], tests[i].name) == 0;
        if (!chosen) continue;
        int before = failures, before_checks = checks;
        tests[i].run();
        int passed = failures == before && checks > before_checks;
        if (!passed) failed_tests++;
        printf("%s %s (%d checks)\n", passed ? "ok" : "not ok", tests[i].name, checks - before_checks);
        fflush(stdout);
    }
    return failed_tests ? 1 : 0;
}
#endif
