/* The library's requests and prompt answers, sent to a recording socket (test_c.py's Recorder, which refuses each
 * with INTERNAL "recorded"): test_c.py compares the frames with the bytes WireGoldenTests.swift pins.
 * Usage: golden SOCKET requests | golden SOCKET answers | golden SOCKET default */
#include "keychain.h"

#include <stdio.h>
#include <string.h>

static const char *socket_path;

static void report(const char *name, kc_code code, kc_error *e) {
    printf("%s %s %s\n", name, kc_code_name(code), kc_error_message(e));
    kc_error_free(e);
}

/* The call first, then its error (a function's arguments have no order). */
#define CALL(name, call)                   \
    do {                                   \
        kc_code code_ = (call);            \
        report(name, code_, e);            \
        e = NULL;                          \
    } while (0)

static void requests(void) {
    kc_prompt texts = {.title = "Mail"};
    kc_options o = {.service = "mail", .access_group = "team", .prompt = &texts, .prompting = KC_PROMPT_NONE,
                    .socket = socket_path};
    kc_storage *s = NULL;
    kc_error *e = NULL;
    if (kc_storage_new(&o, &s, &e)) return report("storage", kc_error_code(e), e);
    kc_set_options set = {.accessible = KC_ACCESSIBLE_ALWAYS, .access_control = KC_ACCESS_CONTROL_PASSCODE,
                          .has_auth_validity = 1, .auth_validity = 5, .label = "L", .synchronizable = KC_FLAG_FALSE};
    CALL("setItem", kc_set_item(s, "token", "v", 1, &set, &e));
    CALL("setItemPlain", kc_set_item(s, "token", "v", 1, NULL, &e));
    kc_prompt subtitle = {.subtitle = "for the mail"};
    kc_secret *value = NULL;
    CALL("getItem", kc_get_item(s, "token", &subtitle, &value, &e));
    int found;
    CALL("hasItem", kc_has_item(s, "token", &found, &e));
    CALL("removeItem", kc_remove_item(s, "token", &e));
    CALL("clear", kc_clear(s, &e));
    char **keys;
    CALL("allKeys", kc_get_all_keys(s, &keys, NULL, &e));
    kc_item_info *info;
    CALL("itemInfo", kc_get_item_info(s, "token", &info, &e));
    kc_access_control_check check;
    CALL("storageCanUse", kc_storage_can_use_access_control(s, KC_ACCESS_CONTROL_BIOMETRY_ANY, &check, &e));
    CALL("deviceCanUse", kc_can_use_access_control(socket_path, KC_ACCESS_CONTROL_PASSCODE, &check, &e));
    kc_storage_free(s);
}

static void answering(void *context, const kc_prompt_request *r, kc_answer *a) {
    const char *name = context;
    printf("asked %s|%s|", r->prompt.title ? r->prompt.title : "", r->prompt.cancel ? r->prompt.cancel : "");
    for (const char *const *m = r->methods; *m; m++) printf("%s%s", m == r->methods ? "" : ",", *m);
    printf("|%s|%s|%u|%s\n", r->service, r->key, r->attempt, r->previous_failure ? r->previous_failure : "");
    if (!strcmp(name, "finger")) kc_answer_finger(a, "thumb");
    else if (!strcmp(name, "passcode")) kc_answer_passcode(a, "1234", 4);
    else if (!strcmp(name, "cancel")) kc_answer_cancel(a);
    else if (!strcmp(name, "fallback")) kc_answer_fallback(a);
    else if (!strcmp(name, "interrupted")) kc_answer_interrupted(a);
    else if (!strcmp(name, "unavailable")) kc_answer_unavailable(a, "no terminal");
}

static void answers(void) {
    const char *names[] = {"cancel", "fallback", "finger", "interrupted", "passcode", "unavailable"};
    for (int i = 0; i < 6; i++) {
        kc_options o = {.service = "mail", .prompting = KC_PROMPT_CALLBACK, .prompter = answering,
                        .prompter_context = (void *)names[i], .attempts_per_read = 2, .socket = socket_path};
        kc_storage *s = NULL;
        kc_error *e = NULL;
        if (kc_storage_new(&o, &s, &e)) return report("storage", kc_error_code(e), e);
        kc_secret *value = NULL;
        CALL(names[i], kc_get_item(s, "token", NULL, &value, &e));
        kc_storage_free(s);
        fflush(stdout);
    }
}

/* A storage that names no service (the application identifier from KEYCHAIN_APP_ID), then one that does: a hasItem each. */
static void default_service(void) {
    const char *services[] = {NULL, "mail"};
    for (int i = 0; i < 2; i++) {
        kc_options o = {.service = services[i], .prompting = KC_PROMPT_NONE, .socket = socket_path};
        kc_storage *s = NULL;
        kc_error *e = NULL;
        if (kc_storage_new(&o, &s, &e)) return report("storage", kc_error_code(e), e);
        int found;
        CALL(services[i] ? "named" : "default", kc_has_item(s, "token", &found, &e));
        kc_storage_free(s);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return fprintf(stderr, "usage: golden SOCKET requests|answers|default\n"), 2;
    socket_path = argv[1];
    if (!strcmp(argv[2], "requests")) requests();
    else if (!strcmp(argv[2], "default")) default_service();
    else answers();
    return 0;
}
