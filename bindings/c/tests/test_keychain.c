/* libkeychain against a real keychaind (KEYCHAIN_SOCKET, a device passcode PASSCODE set) on a private swtpm:
 * started by bindings/c/tests/test_c.py. Usage: test_keychain [test name ...] */
#define _GNU_SOURCE
#include "keychain.h"
#include "check.h"

#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PASSCODE "482916"

static char service_name[64];

/* A service of its own per test, so tests do not see each other's items. */
static kc_storage *storage_with(kc_options options) {
    static int made;
    snprintf(service_name, sizeof service_name, "c-test-%d-%d", (int)getpid(), ++made);
    if (!options.service) options.service = service_name;
    kc_storage *s = NULL;
    OK(kc_storage_new(&options, &s, ERR));
    return s;
}

/* A prompter answering from a list, recording what it was asked. */
typedef struct script {
    const char *answers[8]; /* "passcode:…", "finger:…", "cancel", "fallback", "interrupted", "unavailable:…" */
    int count, asked;
    char titles[8][64], cancels[8][64], failures[8][64], methods[8][64], keys[8][64], services[8][64];
    unsigned attempts[8];
} script;

static void scripted(void *context, const kc_prompt_request *r, kc_answer *a) {
    script *s = context;
    int i = s->asked++;
    if (i >= 8) return kc_answer_cancel(a);
    snprintf(s->titles[i], 64, "%s", r->prompt.title ? r->prompt.title : "(null)");
    snprintf(s->cancels[i], 64, "%s", r->prompt.cancel ? r->prompt.cancel : "(null)");
    snprintf(s->failures[i], 64, "%s", r->previous_failure ? r->previous_failure : "(null)");
    snprintf(s->keys[i], 64, "%s", r->key);
    snprintf(s->services[i], 64, "%s", r->service);
    s->methods[i][0] = 0;
    for (const char *const *m = r->methods; *m; m++)
        snprintf(s->methods[i] + strlen(s->methods[i]), 64 - strlen(s->methods[i]), "%s%s", m == r->methods ? "" : ",", *m);
    s->attempts[i] = r->attempt;
    const char *answer = i < s->count ? s->answers[i] : "cancel";
    if (!strncmp(answer, "passcode:", 9)) kc_answer_passcode(a, answer + 9, strlen(answer + 9));
    else if (!strncmp(answer, "finger:", 7)) kc_answer_finger(a, answer + 7);
    else if (!strcmp(answer, "fallback")) kc_answer_fallback(a);
    else if (!strcmp(answer, "interrupted")) kc_answer_interrupted(a);
    else if (!strncmp(answer, "unavailable:", 12)) kc_answer_unavailable(a, answer + 12);
    else if (strcmp(answer, "none")) kc_answer_cancel(a);
    /* "none": no kc_answer_* call, which is a cancel. */
}

static kc_storage *prompted(script *s, kc_access_control control) {
    kc_options o = {.access_control = control, .prompting = KC_PROMPT_CALLBACK, .prompter = scripted, .prompter_context = s};
    return storage_with(o);
}

static int secret_is(const kc_secret *secret, const void *bytes, size_t n) {
    return secret && kc_secret_size(secret) == n && memcmp(kc_secret_data(secret), bytes, n) == 0;
}

static kc_code code_of_get(kc_storage *s, const char *key, char *message, size_t size) {
    kc_secret *value = NULL;
    kc_error *e = NULL;
    kc_code code = kc_get_item(s, key, NULL, &value, &e);
    if (message) snprintf(message, size, "%s", kc_error_message(e));
    CHECK(code == KC_OK || (e && kc_error_code(e) == code));
    kc_error_free(e);
    kc_secret_free(value);
    return code;
}

static void item_calls_store_read_list_describe_and_remove(void) {
    kc_storage *s = storage_with((kc_options){0});
    const uint8_t value[] = {'t', 0, 'k', 0xff, '\n'};  /* bytes, a NUL among them */
    OK(kc_set_item(s, "token", value, sizeof value, NULL, ERR));
    kc_set_options labelled = {.label = "Refresh token", .accessible = KC_ACCESSIBLE_WHEN_UNLOCKED_THIS_DEVICE_ONLY};
    OK(kc_set_item(s, "b", "2", 1, &labelled, ERR));
    OK(kc_set_item(s, "a", "", 0, NULL, ERR));
    kc_secret *got = NULL;
    OK(kc_get_item(s, "token", NULL, &got, ERR));
    CHECK(secret_is(got, value, sizeof value));
    kc_secret_free(got);
    OK(kc_get_item(s, "a", NULL, &got, ERR));
    CHECK(got && kc_secret_size(got) == 0);  /* an empty value is a value, not an absent item */
    kc_secret_free(got);
    got = (kc_secret *)1;
    OK(kc_get_item(s, "absent", NULL, &got, ERR));
    CHECK(got == NULL);
    int found = -1;
    OK(kc_has_item(s, "b", &found, ERR));
    CHECK(found == 1);
    OK(kc_has_item(s, "absent", &found, ERR));
    CHECK(found == 0);
    char **keys = NULL;
    size_t count = 0;
    OK(kc_get_all_keys(s, &keys, &count, ERR));
    CHECK(count == 3 && keys && !strcmp(keys[0], "a") && !strcmp(keys[1], "b") && !strcmp(keys[2], "token") && !keys[3]);
    kc_strings_free(keys);
    kc_item_info *info = NULL;
    OK(kc_get_item_info(s, "b", &info, ERR));
    CHECK(info != NULL);
    if (info) {
        CHECK_STR(info->key, "b");
        CHECK_STR(info->service, kc_storage_service(s));
        CHECK(info->accessible == KC_ACCESSIBLE_WHEN_UNLOCKED_THIS_DEVICE_ONLY);
        CHECK(info->access_control == KC_ACCESS_CONTROL_NONE);
        CHECK_STR(info->label, "Refresh token");
        CHECK_STR(info->security_level, "softwareTPM");
        time_t now = time(NULL);
        CHECK(info->created > now - 3600 && info->created < now + 3600 && info->modified >= info->created);
    }
    kc_item_info_free(info);
    OK(kc_get_item_info(s, "absent", &info, ERR));
    CHECK(info == NULL);
    OK(kc_remove_item(s, "b", ERR));
    OK(kc_remove_item(s, "b", ERR));  /* absent: not an error */
    OK(kc_has_item(s, "b", &found, ERR));
    CHECK(found == 0);
    OK(kc_clear(s, ERR));
    OK(kc_get_all_keys(s, &keys, &count, ERR));
    CHECK(count == 0 && keys && !keys[0]);
    kc_strings_free(keys);
    kc_storage_free(s);
}

static void a_passcode_prompt_is_answered_by_the_callback(void) {
    script answers = {.answers = {"passcode:" PASSCODE}, .count = 1};
    kc_prompt texts = {.title = "Unlock", .cancel = "Use password"};
    kc_options o = {.access_control = KC_ACCESS_CONTROL_PASSCODE, .prompt = &texts, .prompting = KC_PROMPT_CALLBACK,
                    .prompter = scripted, .prompter_context = &answers};
    kc_storage *s = storage_with(o);
    OK(kc_set_item(s, "refreshToken", "r1", 2, NULL, ERR));
    CHECK(answers.asked == 0);  /* a write never prompts */
    kc_secret *got = NULL;
    kc_prompt call = {.title = "Confirm the payment"};
    OK(kc_get_item(s, "refreshToken", &call, &got, ERR));
    CHECK(secret_is(got, "r1", 2));
    kc_secret_free(got);
    CHECK(answers.asked == 1);
    CHECK_STR(answers.titles[0], "Confirm the payment");
    CHECK_STR(answers.cancels[0], "Use password");
    CHECK_STR(answers.methods[0], "passcode");
    CHECK_STR(answers.services[0], kc_storage_service(s));
    CHECK_STR(answers.keys[0], "refreshToken");
    CHECK(answers.attempts[0] == 1);
    CHECK_STR(answers.failures[0], "(null)");
    int found = 0;
    OK(kc_has_item(s, "refreshToken", &found, ERR));
    CHECK(found && answers.asked == 1);  /* has_item never prompts */
    kc_storage_free(s);
}

static void a_wrong_passcode_is_asked_again_then_fails_with_authentication_failed(void) {
    script wrong = {.answers = {"passcode:000000", "passcode:111111", "passcode:222222"}, .count = 3};
    kc_storage *s = prompted(&wrong, KC_ACCESS_CONTROL_PASSCODE);
    OK(kc_set_item(s, "k", "v", 1, NULL, ERR));
    char message[256];
    CHECK(code_of_get(s, "k", message, sizeof message) == KC_AUTHENTICATION_FAILED);
    CHECK_STR(message, "Not recognised (wrong passcode)");
    CHECK(wrong.asked == 3);
    CHECK(wrong.attempts[0] == 1 && wrong.attempts[1] == 2 && wrong.attempts[2] == 3);
    CHECK_STR(wrong.failures[0], "(null)");
    CHECK_STR(wrong.failures[1], "wrong passcode");
    CHECK_STR(wrong.failures[2], "wrong passcode");
    /* The right one still opens it (the wrong ones did not lock the passcode out). */
    script right = {.answers = {"passcode:" PASSCODE}, .count = 1};
    kc_options o = {.service = kc_storage_service(s), .prompting = KC_PROMPT_CALLBACK, .prompter = scripted,
                    .prompter_context = &right};
    kc_storage *again = storage_with(o);
    kc_secret *got = NULL;
    OK(kc_get_item(again, "k", NULL, &got, ERR));
    CHECK(secret_is(got, "v", 1));
    kc_secret_free(got);
    kc_storage_free(again);
    kc_storage_free(s);
}

static void a_prompt_ended_without_an_answer_gives_the_seeds_code_and_keeps_the_item(void) {
    const char *answers[] = {"cancel", "none", "fallback", "interrupted", "unavailable:no one here"};
    kc_code codes[] = {KC_USER_CANCELED, KC_USER_CANCELED, KC_USER_FALLBACK, KC_SYSTEM_CANCELED, KC_INTERACTION_NOT_ALLOWED};
    for (int i = 0; i < 5; i++) {
        script one = {.answers = {answers[i]}, .count = 1};
        kc_storage *s = prompted(&one, KC_ACCESS_CONTROL_PASSCODE);
        OK(kc_set_item(s, "k", "v", 1, NULL, ERR));
        kc_code code = code_of_get(s, "k", NULL, 0);
        if (code != codes[i]) fprintf(stderr, "answer %s: %s\n", answers[i], kc_code_name(code));
        CHECK(code == codes[i]);
        int found = 0;
        OK(kc_has_item(s, "k", &found, ERR));
        CHECK(found);
        kc_storage_free(s);
    }
}

static void without_a_prompt_a_guarded_read_is_interaction_not_allowed_and_a_plain_one_works(void) {
    kc_storage *s = storage_with((kc_options){.prompting = KC_PROMPT_NONE});
    kc_set_options guarded = {.access_control = KC_ACCESS_CONTROL_PASSCODE};
    OK(kc_set_item(s, "guarded", "v", 1, &guarded, ERR));
    OK(kc_set_item(s, "plain", "p", 1, NULL, ERR));
    CHECK(code_of_get(s, "guarded", NULL, 0) == KC_INTERACTION_NOT_ALLOWED);
    kc_secret *got = NULL;
    OK(kc_get_item(s, "plain", NULL, &got, ERR));
    CHECK(secret_is(got, "p", 1));
    kc_secret_free(got);
    kc_storage_free(s);
}

/* Run in a new session (test_c.py): no controlling terminal. */
static void the_terminal_prompter_without_a_terminal_is_interaction_not_allowed(void) {
    kc_storage *s = storage_with((kc_options){0});
    kc_set_options guarded = {.access_control = KC_ACCESS_CONTROL_PASSCODE};
    OK(kc_set_item(s, "k", "v", 1, &guarded, ERR));
    char message[256];
    CHECK(code_of_get(s, "k", message, sizeof message) == KC_INTERACTION_NOT_ALLOWED);
    CHECK(strstr(message, "no controlling terminal") != NULL);
    kc_access_control_check check;
    OK(kc_storage_can_use_access_control(s, KC_ACCESS_CONTROL_PASSCODE, &check, ERR));
    CHECK(!check.available);
    CHECK_STR(check.reason, "noPrompt");
    kc_storage_free(s);
}

static void can_use_access_control_answers_for_the_device_and_the_storage(void) {
    script none = {0};
    kc_storage *s = prompted(&none, KC_ACCESS_CONTROL_DEFAULT);
    kc_access_control_check check;
    OK(kc_storage_can_use_access_control(s, KC_ACCESS_CONTROL_PASSCODE, &check, ERR));
    CHECK(check.available);
    CHECK_STR(check.reason, "");
    OK(kc_storage_can_use_access_control(s, KC_ACCESS_CONTROL_NONE, &check, ERR));
    CHECK(check.available);
    /* keychaind runs with no fingerprint reader (--reader none). */
    OK(kc_storage_can_use_access_control(s, KC_ACCESS_CONTROL_BIOMETRY_ANY, &check, ERR));
    CHECK(!check.available);
    CHECK_STR(check.reason, "notAvailable");
    OK(kc_can_use_access_control(NULL, KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET, &check, ERR));
    CHECK_STR(check.reason, "notAvailable");
    kc_set_options biometric = {.access_control = KC_ACCESS_CONTROL_BIOMETRY_ANY};
    kc_error *e = NULL;
    CHECK(kc_set_item(s, "k", "v", 1, &biometric, &e) == KC_BIOMETRY_NOT_AVAILABLE);
    CHECK(kc_error_code(e) == KC_BIOMETRY_NOT_AVAILABLE);
    kc_error_free(e);
    CHECK(none.asked == 0);
    kc_storage_free(s);
}

static void expect_invalid(kc_options o, const char *message) {
    kc_storage *s = (kc_storage *)1;
    kc_error *e = NULL;
    if (!o.service) o.service = "svc";
    o.socket = "/nonexistent/never-reached.sock";
    CHECK(kc_storage_new(&o, &s, &e) == KC_INVALID_ARGUMENT);
    CHECK(s == NULL);
    CHECK(kc_error_code(e) == KC_INVALID_ARGUMENT);
    CHECK_STR(kc_error_message(e), message);
    kc_error_free(e);
}

static void options_that_break_a_seed_rule_fail_at_once_with_its_message(void) {
    expect_invalid((kc_options){.access_control = KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET, .auth_validity = 30},
                   "accessControl 'biometryCurrentSet' can't be used with authValidity > 0 (got 30): set authValidity to 0, "
                   "or use 'biometryAny' to allow a window");
    expect_invalid((kc_options){.synchronizable = KC_FLAG_TRUE, .accessible = KC_ACCESSIBLE_AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY},
                   "synchronizable can't be used with accessible 'afterFirstUnlockThisDeviceOnly': a ThisDeviceOnly item "
                   "never leaves this device; set synchronizable to false, or use accessible 'afterFirstUnlock'");
    expect_invalid((kc_options){.synchronizable = KC_FLAG_TRUE, .access_control = KC_ACCESS_CONTROL_PASSCODE},
                   "synchronizable can't be used with accessControl 'passcode': an item behind authentication never leaves "
                   "this device; set synchronizable to false, or use accessControl 'none'");
    expect_invalid((kc_options){.service = ""},
                   "Invalid service: expected a non-empty string of up to 256 characters, got an empty string");
    char long_service[258];
    memset(long_service, 'x', 257);
    long_service[257] = 0;
    expect_invalid((kc_options){.service = long_service},
                   "Invalid service: expected a non-empty string of up to 256 characters, got 257 characters");
    expect_invalid((kc_options){.accessible = 42},
                   "Invalid accessible: expected one of 'whenUnlocked', 'afterFirstUnlock', 'always', "
                   "'whenPasscodeSetThisDeviceOnly', 'whenUnlockedThisDeviceOnly', 'afterFirstUnlockThisDeviceOnly', "
                   "'alwaysThisDeviceOnly', got 42");
    expect_invalid((kc_options){.auth_validity = -1},
                   "Invalid authValidity: expected a whole number of seconds, 0 or more, got -1");
    expect_invalid((kc_options){.access_group = ""},
                   "Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group");
    expect_invalid((kc_options){.key_storage = 7}, "Invalid android.keyStorage: expected one of 'tee', 'strongbox', got 7");
    expect_invalid((kc_options){.synchronizable = 3}, "Invalid synchronizable: expected true or false, got 3");
    expect_invalid((kc_options){.prompting = KC_PROMPT_CALLBACK},
                   "Invalid prompter: KC_PROMPT_CALLBACK needs a prompter, got null");
}

static void bad_call_arguments_fail_before_anything_is_sent(void) {
    /* The socket does not exist: a call that reached it would be HARDWARE_UNAVAILABLE, not INVALID_ARGUMENT. */
    kc_storage *s = storage_with((kc_options){.socket = "/nonexistent/never-reached.sock"});
    kc_error *e = NULL;
    char long_key[1026];
    memset(long_key, 'k', 1025);
    long_key[1025] = 0;
    const char *keys[] = {"", long_key, "\xff\xfe", NULL};
    const char *messages[] = {"Invalid key: expected a non-empty string of up to 1024 bytes, got an empty string",
                              "Invalid key: expected a non-empty string of up to 1024 bytes, got 1025 bytes",
                              "Invalid key: expected a non-empty string of up to 1024 bytes, got a string that is not UTF-8",
                              "Invalid key: expected a non-empty string of up to 1024 bytes, got null"};
    for (int i = 0; i < 4; i++) {
        CHECK(kc_set_item(s, keys[i], "v", 1, NULL, &e) == KC_INVALID_ARGUMENT);
        CHECK_STR(kc_error_message(e), messages[i]);
        kc_error_free(e);
    }
    kc_set_options bad = {.access_control = KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET, .has_auth_validity = 1, .auth_validity = 5};
    CHECK(kc_set_item(s, "k", "v", 1, &bad, &e) == KC_INVALID_ARGUMENT);
    CHECK(strstr(kc_error_message(e), "can't be used with authValidity > 0 (got 5)") != NULL);
    kc_error_free(e);
    char label[4098];
    memset(label, 'l', 4097);
    label[4097] = 0;
    kc_set_options labelled = {.label = label};
    CHECK(kc_set_item(s, "k", "v", 1, &labelled, &e) == KC_INVALID_ARGUMENT);
    CHECK_STR(kc_error_message(e), "Invalid label: expected a string of up to 4096 bytes, got 4097 bytes");
    kc_error_free(e);
    CHECK(kc_set_item(s, "k", "v", (16u << 20) + 1, NULL, &e) == KC_INVALID_ARGUMENT);
    CHECK_STR(kc_error_message(e), "Invalid value: at most 16777216 bytes, got 16777217");
    kc_error_free(e);
    kc_access_control_check check;
    CHECK(kc_storage_can_use_access_control(s, 99, &check, &e) == KC_INVALID_ARGUMENT);
    kc_error_free(e);
    /* The same storage reaches the absent socket: HARDWARE_UNAVAILABLE in the words of Swift's client. */
    int found;
    CHECK(kc_has_item(s, "k", &found, &e) == KC_HARDWARE_UNAVAILABLE);
    CHECK_STR(kc_error_message(e), "The keychain service is not running: nothing answers on /nonexistent/never-reached.sock "
                                   "(start keychaind or its socket unit; keychainctl --direct uses a store without the service)");
    CHECK_STR(kc_error_cause(e), "errno 2");
    kc_error_free(e);
    kc_storage_free(s);
}

static void without_a_service_the_application_identifier_is_the_default(void) {
    unsetenv("KEYCHAIN_APP_ID");
    setenv("KEYCHAIN_APP_ID", "org.example.c-test", 1);
    kc_storage *s = NULL;
    kc_options o = {0};
    OK(kc_storage_new(&o, &s, ERR));
    CHECK_STR(kc_storage_service(s), "org.example.c-test");
    kc_storage_free(s);
    unsetenv("KEYCHAIN_APP_ID");
}

/* KEYCHAIN_STORE names a store in the process (the Swift library's): without KEYCHAIN_SOCKET it is refused, not
 * served by another store. */
static void keychain_store_without_keychain_socket_is_refused(void) {
    char *socket = getenv("KEYCHAIN_SOCKET") ? strdup(getenv("KEYCHAIN_SOCKET")) : NULL;
    unsetenv("KEYCHAIN_SOCKET");
    setenv("KEYCHAIN_STORE", "/tmp/some-store", 1);
    kc_storage *s = storage_with((kc_options){0});
    kc_error *e = NULL;
    int found;
    CHECK(kc_has_item(s, "k", &found, &e) == KC_HARDWARE_UNAVAILABLE);
    CHECK_STR(kc_error_message(e), "KEYCHAIN_STORE names a store in the process, which this library cannot open: it speaks "
                                   "to keychaind only; set KEYCHAIN_SOCKET to keychaind's socket");
    kc_error_free(e);
    unsetenv("KEYCHAIN_STORE");
    if (socket) setenv("KEYCHAIN_SOCKET", socket, 1);
    free(socket);
    kc_storage_free(s);
}

/* Several threads reading at once through one storage: every read gets its own item's value. */
enum { THREADS = 8, READS = 200 };
static kc_storage *shared;
static void *reader(void *arg) {
    long id = (long)arg;
    char key[16], want[32];
    snprintf(key, sizeof key, "k%ld", id);
    snprintf(want, sizeof want, "value of thread %ld", id);
    long good = 0;
    for (int i = 0; i < READS; i++) {
        kc_secret *got = NULL;
        if (kc_get_item(shared, key, NULL, &got, NULL) == KC_OK && secret_is(got, want, strlen(want))) good++;
        kc_secret_free(got);
    }
    return (void *)good;
}

static void threads_read_at_once_through_one_storage(void) {
    shared = storage_with((kc_options){0});
    for (long t = 0; t < THREADS; t++) {
        char key[16], value[32];
        snprintf(key, sizeof key, "k%ld", t);
        snprintf(value, sizeof value, "value of thread %ld", t);
        OK(kc_set_item(shared, key, value, strlen(value), NULL, ERR));
    }
    pthread_t threads[THREADS];
    for (long t = 0; t < THREADS; t++) CHECK(pthread_create(&threads[t], NULL, reader, (void *)t) == 0);
    for (long t = 0; t < THREADS; t++) {
        void *good = NULL;
        pthread_join(threads[t], &good);
        CHECK((long)good == READS);
    }
    kc_storage_free(shared);
}

/* A listener of another uid (nobody) at the socket gets nothing: the peer check refuses it before sending. */
static void a_listener_of_another_uid_gets_nothing(void) {
    if (geteuid() != 0) {
        printf("# skipped: needs root to listen as nobody\n");
        CHECK(1);
        return;
    }
    char folder[] = "/tmp/kc-c-peer-XXXXXX";
    CHECK(mkdtemp(folder) != NULL);
    chmod(folder, 0777);
    char path[100];
    snprintf(path, sizeof path, "%s/planted.sock", folder);
    int ready[2], got[2];
    CHECK(pipe(ready) == 0 && pipe(got) == 0);
    pid_t child = fork();
    if (child == 0) {
        if (setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)) _exit(2);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 4)) _exit(3);
        if (write(ready[1], "r", 1) != 1) _exit(4);
        int conn = accept(fd, NULL, NULL);
        char buffer[4096];
        ssize_t n = conn >= 0 ? read(conn, buffer, sizeof buffer) : -1;
        /* What the client sent before closing: nothing. */
        if (write(got[1], &n, sizeof n) != sizeof n) _exit(5);
        _exit(0);
    }
    char byte;
    CHECK(read(ready[0], &byte, 1) == 1);
    kc_storage *s = storage_with((kc_options){.socket = path});
    kc_error *e = NULL;
    const char *secret = "planted-socket-secret";
    CHECK(kc_set_item(s, "k", secret, strlen(secret), NULL, &e) == KC_HARDWARE_UNAVAILABLE);
    CHECK(strstr(kc_error_message(e), "is not trusted: its socket belongs to uid 65534") != NULL);
    CHECK(strstr(kc_error_message(e), "nothing was sent") != NULL);
    kc_error_free(e);
    ssize_t sent = -1;
    CHECK(read(got[0], &sent, sizeof sent) == sizeof sent);
    CHECK(sent == 0);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kc_storage_free(s);
    unlink(path);
    rmdir(folder);
}

/* A forked child starts with no kept connection: its call opens its own, and the parent's still serves it. */
static void a_forked_child_and_its_parent_each_keep_their_own_connection(void) {
    kc_storage *s = storage_with((kc_options){0});
    OK(kc_set_item(s, "k", "v", 1, NULL, ERR));
    pid_t child = fork();
    if (child == 0) {
        int ok = 1;
        for (int i = 0; i < 50; i++) {
            kc_secret *got = NULL;
            ok &= kc_get_item(s, "k", NULL, &got, NULL) == KC_OK && secret_is(got, "v", 1);
            kc_secret_free(got);
        }
        _exit(ok ? 0 : 1);
    }
    int good = 0;
    for (int i = 0; i < 50; i++) {
        kc_secret *got = NULL;
        good += kc_get_item(s, "k", NULL, &got, NULL) == KC_OK && secret_is(got, "v", 1);
        kc_secret_free(got);
    }
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(good == 50);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    kc_storage_free(s);
}

/* The process's connected sockets whose peer listens at `path`. */
static int connections_to(const char *path, int *fds, int most) {
    int found = 0;
    for (int fd = 3; fd < 1024 && found < most; fd++) {
        struct sockaddr_un peer;
        socklen_t length = sizeof peer;
        if (getpeername(fd, (struct sockaddr *)&peer, &length) == 0 && peer.sun_family == AF_UNIX &&
            strcmp(peer.sun_path, path) == 0)
            fds[found++] = fd;
    }
    return found;
}

/* A prompter that makes a call of its own while the read's connection is busy (so the process keeps two), then
 * answers the passcode. */
static kc_storage *inner;
static void calling_prompter(void *context, const kc_prompt_request *r, kc_answer *a) {
    (void)context, (void)r;
    int found = 0;
    OK(kc_has_item(inner, "k", &found, ERR));
    CHECK(found);
    kc_answer_passcode(a, PASSCODE, strlen(PASSCODE));
}

/* keychaind (--idle-timeout 1, started by test_c.py) ends both kept connections while idle: the next call's request
 * goes once more, on a new connection (not on the other dead one), and is served. */
static void a_kept_connection_keychaind_closed_while_idle_is_replaced_and_the_call_served(void) {
    const char *path = getenv("KEYCHAIN_SOCKET");
    inner = storage_with((kc_options){0});
    OK(kc_set_item(inner, "k", "v", 1, NULL, ERR));
    kc_storage *s = storage_with((kc_options){.prompting = KC_PROMPT_CALLBACK, .prompter = calling_prompter});
    kc_set_options guarded = {.access_control = KC_ACCESS_CONTROL_PASSCODE};
    OK(kc_set_item(s, "g", "w", 1, &guarded, ERR));
    kc_secret *got = NULL;
    OK(kc_get_item(s, "g", NULL, &got, ERR));
    CHECK(secret_is(got, "w", 1));
    kc_secret_free(got);
    int kept[4];
    CHECK(connections_to(path, kept, 4) == 2);
    /* Until keychaind has closed both (readable at their end of stream), however long the machine takes. */
    for (int i = 0; i < 2; i++) {
        struct pollfd entry = {.fd = kept[i], .events = POLLIN};
        CHECK(poll(&entry, 1, 60000) == 1);
        char byte;
        CHECK(recv(kept[i], &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
    }
    OK(kc_get_item(inner, "k", NULL, &got, ERR));
    CHECK(secret_is(got, "v", 1));
    kc_secret_free(got);
    CHECK(connections_to(path, kept, 4) == 2);  /* the dead one closed here too, the other dead one kept until used */
    kc_storage_free(s);
    kc_storage_free(inner);
}

static void the_codes_have_the_seeds_names(void) {
    CHECK_STR(kc_code_name(KC_OK), "OK");
    CHECK_STR(kc_code_name(KC_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    CHECK_STR(kc_code_name(KC_INTERACTION_NOT_ALLOWED), "INTERACTION_NOT_ALLOWED");
    CHECK_STR(kc_code_name(KC_INTERNAL), "INTERNAL");
    CHECK_STR(kc_code_name(999), "UNKNOWN");
    CHECK_STR(kc_accessible_name(KC_ACCESSIBLE_ALWAYS_THIS_DEVICE_ONLY), "alwaysThisDeviceOnly");
    CHECK_STR(kc_access_control_name(KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET_OR_PASSCODE), "biometryCurrentSetOrPasscode");
    CHECK(kc_accessible_name(KC_ACCESSIBLE_DEFAULT) == NULL);
}

int main(int argc, char **argv) {
    static const test tests[] = {
        {"item_calls", item_calls_store_read_list_describe_and_remove, 0},
        {"passcode_prompt", a_passcode_prompt_is_answered_by_the_callback, 0},
        {"wrong_passcode", a_wrong_passcode_is_asked_again_then_fails_with_authentication_failed, 0},
        {"ended_prompts", a_prompt_ended_without_an_answer_gives_the_seeds_code_and_keeps_the_item, 0},
        {"no_prompt", without_a_prompt_a_guarded_read_is_interaction_not_allowed_and_a_plain_one_works, 0},
        {"no_terminal", the_terminal_prompter_without_a_terminal_is_interaction_not_allowed, 0},
        {"can_use", can_use_access_control_answers_for_the_device_and_the_storage, 0},
        {"bad_options", options_that_break_a_seed_rule_fail_at_once_with_its_message, 0},
        {"bad_arguments", bad_call_arguments_fail_before_anything_is_sent, 0},
        {"application_identifier", without_a_service_the_application_identifier_is_the_default, 0},
        {"keychain_store", keychain_store_without_keychain_socket_is_refused, 0},
        {"threads", threads_read_at_once_through_one_storage, 0},
        {"untrusted_peer", a_listener_of_another_uid_gets_nothing, 0},
        {"fork", a_forked_child_and_its_parent_each_keep_their_own_connection, 0},
        {"codes", the_codes_have_the_seeds_names, 0},
        {"idle_closed", a_kept_connection_keychaind_closed_while_idle_is_replaced_and_the_call_served, 1},
    };
    return run_tests(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
