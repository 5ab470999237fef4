/* libkeychain: the seed's API over keychaind's protocol, version 2 (docs/daemon.md; Sources/KeychainWire is
 * the definition, bindings/python the other client that follows it). See keychain.h and docs/c.md. */
#define _GNU_SOURCE
#include "keychain.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------------------
 * The protocol's numbers (WireOp, WireKind, WireTag, WirePromptAnswer.Kind). */

enum { VERSION = 2 };
#define MAX_MESSAGE (16u * 1024 * 1024 + 64 * 1024)
enum { OP_SET = 1, OP_GET, OP_HAS, OP_REMOVE, OP_CLEAR, OP_ALL_KEYS, OP_ITEM_INFO, OP_STORAGE_CAN_USE,
       OP_DEVICE_CAN_USE = 25 };
enum { K_FIELDS = 0, K_OK = 0x80, K_ERROR = 0x81, K_PROMPT = 0x82, K_ANSWER = 0x83 };
enum { T_OPTIONS = 1, T_KEY, T_VALUE, T_ACCESSIBLE, T_ACCESS_CONTROL, T_AUTH_VALIDITY, T_LABEL, T_SYNCHRONIZABLE,
       T_PROMPT, T_ATTEMPTS, T_RESULT_BYTES = 20, T_RESULT_BOOL, T_RESULT_JSON, T_ERROR_CODE = 30, T_ERROR_MESSAGE,
       T_CAUSE_KIND, T_CAUSE_NUMBER, T_CAUSE_TEXT, T_PROMPT_TEXTS = 40, T_METHODS, T_SERVICE, T_PROMPT_KEY, T_ATTEMPT,
       T_PREVIOUS_FAILURE, T_ANSWER_KIND = 50, T_ANSWER_FINGER, T_ANSWER_PASSCODE, T_ANSWER_REASON };
enum { A_FINGER = 0, A_PASSCODE, A_CANCEL, A_FALLBACK, A_INTERRUPTED, A_UNAVAILABLE };

#define SYSTEM_SOCKET "/run/keychain/keychaind.sock"
#define SERVICE_USER "keychaind"
/* How long a reply may take (keychaind bounds its own TPM commands), and a started frame may stall. */
enum { REPLY_TIMEOUT = 120, STALL_TIMEOUT = 10, MAX_IDLE = 16, MAX_ATTEMPTS = 10 };
enum { MAX_SERVICE = 256, MAX_ACCESS_GROUP = 256, MAX_KEY = 1024, MAX_LABEL = 4096 };
#define MAX_VALUE (16u << 20)
/* Foundation's JSONEncoder writes a Date as seconds since 2001-01-01 UTC. */
#define REFERENCE_DATE 978307200.0

static const char *const code_names[] = {
    "OK", "INVALID_ARGUMENT", "USER_CANCELED", "USER_FALLBACK", "SYSTEM_CANCELED", "AUTHENTICATION_FAILED", "LOCKOUT",
    "LOCKOUT_PERMANENT", "KEY_INVALIDATED", "BIOMETRY_NOT_AVAILABLE", "BIOMETRY_NOT_ENROLLED", "PASSCODE_NOT_SET",
    "UNSUPPORTED", "MISSING_USAGE_DESCRIPTION", "INTERACTION_NOT_ALLOWED", "DEVICE_STATE_CHANGED", "DATA_CORRUPTED",
    "HARDWARE_UNAVAILABLE", "STORAGE_ERROR", "INTERNAL"};
enum { CODE_COUNT = sizeof code_names / sizeof code_names[0] };

static const char *const accessible_names[] = {
    NULL, "whenUnlocked", "afterFirstUnlock", "always", "whenPasscodeSetThisDeviceOnly", "whenUnlockedThisDeviceOnly",
    "afterFirstUnlockThisDeviceOnly", "alwaysThisDeviceOnly"};
static const char *const access_control_names[] = {
    NULL, "none", "biometryAny", "biometryCurrentSet", "biometryAnyOrPasscode", "biometryCurrentSetOrPasscode",
    "passcode"};
static const char *const key_storage_names[] = {NULL, "tee", "strongbox"};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

KC_API const char *kc_code_name(kc_code code) {
    return (unsigned)code < CODE_COUNT ? code_names[code] : "UNKNOWN";
}
KC_API const char *kc_accessible_name(kc_accessible value) {
    return value > 0 && (int)value < COUNT(accessible_names) ? accessible_names[value] : NULL;
}
KC_API const char *kc_access_control_name(kc_access_control value) {
    return value > 0 && (int)value < COUNT(access_control_names) ? access_control_names[value] : NULL;
}

static void wipe_free(void *p, size_t n) {
    if (!p) return;
    explicit_bzero(p, n);
    free(p);
}

/* ---------------------------------------------------------------------------------------------------------
 * Errors. */

struct kc_error {
    kc_code code;
    char *message;
    char *cause;
};

static char *vformat(const char *format, va_list args) {
    char *text = NULL;
    if (vasprintf(&text, format, args) < 0) return NULL;
    return text;
}

/* A failure in *error (when the caller asked for one); returns its code. */
static kc_code fail_with(kc_error **error, kc_code code, char *cause, const char *format, ...)
    __attribute__((format(printf, 4, 5)));
static kc_code fail_with(kc_error **error, kc_code code, char *cause, const char *format, ...) {
    if (!error) {
        free(cause);
        return code;
    }
    kc_error *made = calloc(1, sizeof *made);
    if (!made) {
        free(cause);
        *error = NULL;
        return code;
    }
    va_list args;
    va_start(args, format);
    made->code = code;
    made->message = vformat(format, args);
    va_end(args);
    made->cause = cause;
    *error = made;
    return code;
}
#define fail(error, code, ...) fail_with(error, code, NULL, __VA_ARGS__)

static char *format(const char *format, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *format, ...) {
    va_list args;
    va_start(args, format);
    char *text = vformat(format, args);
    va_end(args);
    return text;
}

KC_API kc_code kc_error_code(const kc_error *error) { return error ? error->code : KC_OK; }
KC_API const char *kc_error_message(const kc_error *error) {
    return error && error->message ? error->message : "";
}
KC_API const char *kc_error_cause(const kc_error *error) { return error ? error->cause : NULL; }
KC_API void kc_error_free(kc_error *error) {
    if (!error) return;
    free(error->message);
    free(error->cause);
    free(error);
}

static kc_code out_of_memory(kc_error **error) {
    return fail(error, KC_INTERNAL, "Out of memory");
}

/* ---------------------------------------------------------------------------------------------------------
 * Encoding: a buffer that wipes what it leaves behind when it grows (frames carry secrets). */

typedef struct buffer {
    uint8_t *bytes;
    size_t length, capacity;
    bool failed;
    int last_tag;
} buffer;

static void buffer_free(buffer *b) {
    wipe_free(b->bytes, b->capacity);
    *b = (buffer){0};
}

static void append(buffer *b, const void *bytes, size_t n) {
    if (b->failed) return;
    if (b->length + n > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 256;
        while (capacity < b->length + n) capacity *= 2;
        uint8_t *grown = malloc(capacity);
        if (!grown) {
            b->failed = true;
            return;
        }
        if (b->length) memcpy(grown, b->bytes, b->length);
        wipe_free(b->bytes, b->capacity);
        b->bytes = grown;
        b->capacity = capacity;
    }
    if (n) memcpy(b->bytes + b->length, bytes, n);
    b->length += n;
}

static void put_u32(uint8_t *at, uint32_t v) {
    at[0] = (uint8_t)(v >> 24), at[1] = (uint8_t)(v >> 16), at[2] = (uint8_t)(v >> 8), at[3] = (uint8_t)v;
}
static uint32_t get_u32(const uint8_t *at) {
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3];
}

/* A message's header; `framed` leaves room for the frame's length (set by `finish`). */
static void begin(buffer *b, uint8_t kind, bool framed) {
    uint8_t head[6] = {0, 0, 0, 0, VERSION, kind};
    append(b, framed ? head : head + 4, framed ? 6 : 2);
    b->last_tag = -1;
}
static void field(buffer *b, uint8_t tag, const void *bytes, size_t n) {
    uint8_t head[5] = {tag};
    put_u32(head + 1, (uint32_t)n);
    b->last_tag = tag;
    append(b, head, 5);
    append(b, bytes, n);
}
static void field_text(buffer *b, uint8_t tag, const char *text) {
    if (text) field(b, tag, text, strlen(text));
}
static void field_uint(buffer *b, uint8_t tag, uint64_t v) {
    uint8_t bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = (uint8_t)(v >> (56 - 8 * i));
    field(b, tag, bytes, 8);
}
static void field_bool(buffer *b, uint8_t tag, bool v) {
    uint8_t byte = v ? 1 : 0;
    field(b, tag, &byte, 1);
}
static void finish(buffer *b) {
    if (!b->failed) put_u32(b->bytes, (uint32_t)(b->length - 4));
}

/* A prompt as the nested message a field carries (WirePrompt). */
static void field_prompt(buffer *b, uint8_t tag, const kc_prompt *p) {
    if (!p) return;
    buffer nested = {0};
    begin(&nested, K_FIELDS, false);
    field_text(&nested, 1, p->title);
    field_text(&nested, 2, p->subtitle);
    field_text(&nested, 3, p->description);
    field_text(&nested, 4, p->cancel);
    if (nested.failed) b->failed = true;
    else field(b, tag, nested.bytes, nested.length);
    buffer_free(&nested);
}

/* ---------------------------------------------------------------------------------------------------------
 * Decoding: a message's fields by tag, pointing into the frame (which the caller wipes). */

typedef struct message {
    uint8_t kind;
    const uint8_t *at[256];
    uint32_t length[256];
    bool has[256];
} message;

static bool decode(const uint8_t *data, size_t n, message *m, char **why) {
    memset(m->has, 0, sizeof m->has);
    if (n < 2) return *why = format("message shorter than its header"), false;
    if (data[0] != VERSION) return *why = format("protocol version %u, this side speaks %u", data[0], VERSION), false;
    m->kind = data[1];
    size_t at = 2;
    int last = -1;
    while (at < n) {
        if (n - at < 5) return *why = format("field header cut at byte %zu", at), false;
        uint8_t tag = data[at];
        uint32_t length = get_u32(data + at + 1);
        at += 5;
        if (length > n - at) return *why = format("field %u runs past the message", tag), false;
        if (tag <= last) return *why = format("field %u out of order or repeated", tag), false;
        m->at[tag] = data + at, m->length[tag] = length, m->has[tag] = true;
        last = tag;
        at += length;
    }
    return true;
}

/* A field's text, copied (NULL when absent); false when it is not UTF-8 or memory ran out. */
static bool valid_utf8(const uint8_t *s, size_t n);
static bool copy_text(const message *m, uint8_t tag, char **out) {
    *out = NULL;
    if (!m->has[tag]) return true;
    if (!valid_utf8(m->at[tag], m->length[tag]) || memchr(m->at[tag], 0, m->length[tag])) return false;
    *out = strndup((const char *)m->at[tag], m->length[tag]);
    return *out != NULL;
}
static bool read_uint(const message *m, uint8_t tag, uint64_t *out) {
    if (!m->has[tag] || m->length[tag] != 8) return false;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | m->at[tag][i];
    *out = v;
    return true;
}

/* ---------------------------------------------------------------------------------------------------------
 * Text rules (the seed's counts). */

static bool valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t extra;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) extra = 1, cp = c & 0x1F;
        else if ((c & 0xF0) == 0xE0) extra = 2, cp = c & 0x0F;
        else if ((c & 0xF8) == 0xF0) extra = 3, cp = c & 0x07;
        else return false;
        if (i + extra >= n) return false;
        for (size_t k = 1; k <= extra; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if ((extra == 1 && cp < 0x80) || (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp < 0xE000))
            return false;
        i += extra + 1;
    }
    return true;
}

/* Characters as the seed's JavaScript counts them (UTF-16 code units) of valid UTF-8. */
static size_t utf16_length(const char *text) {
    size_t units = 0;
    for (const uint8_t *p = (const uint8_t *)text; *p; p++) {
        if ((*p & 0xC0) != 0x80) units += (*p >= 0xF0) ? 2 : 1;
    }
    return units;
}

static kc_code check_service(const char *service, kc_error **error) {
    const char *expected = "a non-empty string of up to 256 characters";
    if (!valid_utf8((const uint8_t *)service, strlen(service)))
        return fail(error, KC_INVALID_ARGUMENT, "Invalid service: expected %s, got a string that is not UTF-8", expected);
    size_t length = utf16_length(service);
    if (length == 0) return fail(error, KC_INVALID_ARGUMENT, "Invalid service: expected %s, got an empty string", expected);
    if (length > MAX_SERVICE)
        return fail(error, KC_INVALID_ARGUMENT, "Invalid service: expected %s, got %zu characters", expected, length);
    return KC_OK;
}

static kc_code check_access_group(const char *group, kc_error **error) {
    if (!valid_utf8((const uint8_t *)group, strlen(group)))
        return fail(error, KC_INVALID_ARGUMENT, "Invalid accessGroup: expected a non-empty string, got a string that is not UTF-8");
    size_t length = utf16_length(group);
    if (length == 0)
        return fail(error, KC_INVALID_ARGUMENT,
                    "Invalid accessGroup: expected a non-empty string, got an empty string; leave it out for the default group");
    if (length > MAX_ACCESS_GROUP)
        return fail(error, KC_INVALID_ARGUMENT,
                    "Invalid accessGroup: expected a non-empty string of up to %d characters, got %zu characters",
                    MAX_ACCESS_GROUP, length);
    return KC_OK;
}

static kc_code check_key(const char *key, kc_error **error) {
    const char *expected = "a non-empty string of up to 1024 bytes";
    if (!key) return fail(error, KC_INVALID_ARGUMENT, "Invalid key: expected %s, got null", expected);
    size_t n = strlen(key);
    if (!valid_utf8((const uint8_t *)key, n))
        return fail(error, KC_INVALID_ARGUMENT, "Invalid key: expected %s, got a string that is not UTF-8", expected);
    if (n == 0) return fail(error, KC_INVALID_ARGUMENT, "Invalid key: expected %s, got an empty string", expected);
    if (n > MAX_KEY) return fail(error, KC_INVALID_ARGUMENT, "Invalid key: expected %s, got %zu bytes", expected, n);
    return KC_OK;
}

static kc_code check_text(const char *text, const char *name, kc_error **error) {
    if (text && !valid_utf8((const uint8_t *)text, strlen(text)))
        return fail(error, KC_INVALID_ARGUMENT, "Invalid %s: expected a string, got a string that is not UTF-8", name);
    return KC_OK;
}

static kc_code check_prompt(const kc_prompt *p, const char *name, kc_error **error) {
    if (!p) return KC_OK;
    char field_name[64];
    const char *names[] = {"title", "subtitle", "description", "cancel"};
    const char *texts[] = {p->title, p->subtitle, p->description, p->cancel};
    for (int i = 0; i < 4; i++) {
        snprintf(field_name, sizeof field_name, "%s.%s", name, names[i]);
        kc_code code = check_text(texts[i], field_name, error);
        if (code) return code;
    }
    return KC_OK;
}

/* An enum's value, or INVALID_ARGUMENT naming the seed's strings. */
static kc_code check_choice(int value, const char *const *names, int count, const char *name, kc_error **error) {
    if (value >= 0 && value < count) return KC_OK;
    char listed[512] = "";
    for (int i = 1; i < count; i++) {
        size_t used = strlen(listed);
        snprintf(listed + used, sizeof listed - used, "%s'%s'", i > 1 ? ", " : "", names[i]);
    }
    return fail(error, KC_INVALID_ARGUMENT, "Invalid %s: expected one of %s, got %d", name, listed, value);
}

static kc_code check_flag(kc_flag value, const char *name, kc_error **error) {
    if (value == KC_FLAG_DEFAULT || value == KC_FLAG_FALSE || value == KC_FLAG_TRUE) return KC_OK;
    return fail(error, KC_INVALID_ARGUMENT, "Invalid %s: expected true or false, got %d", name, (int)value);
}

static kc_code check_auth_validity(int64_t value, kc_error **error) {
    if (value >= 0) return KC_OK;
    return fail(error, KC_INVALID_ARGUMENT, "Invalid authValidity: expected a whole number of seconds, 0 or more, got %lld",
                (long long)value);
}

static bool this_device_only(kc_accessible a) { return a >= KC_ACCESSIBLE_WHEN_PASSCODE_SET_THIS_DEVICE_ONLY; }

/* The seed's rules of one write's protection (Swift's ItemProtection), in the same order and words. */
static kc_code check_protection(kc_accessible accessible, kc_access_control control, int64_t validity, bool sync,
                                kc_error **error) {
    if (validity > 0 && (control == KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET ||
                         control == KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET_OR_PASSCODE)) {
        kc_access_control other = control == KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET ? KC_ACCESS_CONTROL_BIOMETRY_ANY
                                                                                     : KC_ACCESS_CONTROL_BIOMETRY_ANY_OR_PASSCODE;
        return fail(error, KC_INVALID_ARGUMENT,
                    "accessControl '%s' can't be used with authValidity > 0 (got %lld): set authValidity to 0, or use '%s' "
                    "to allow a window", access_control_names[control], (long long)validity, access_control_names[other]);
    }
    if (sync && this_device_only(accessible)) {
        const char *movable = accessible == KC_ACCESSIBLE_WHEN_UNLOCKED_THIS_DEVICE_ONLY ? "whenUnlocked"
                              : accessible == KC_ACCESSIBLE_AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY ? "afterFirstUnlock"
                              : accessible == KC_ACCESSIBLE_ALWAYS_THIS_DEVICE_ONLY ? "always" : NULL;
        if (movable)
            return fail(error, KC_INVALID_ARGUMENT,
                        "synchronizable can't be used with accessible '%s': a ThisDeviceOnly item never leaves this device; "
                        "set synchronizable to false, or use accessible '%s'", accessible_names[accessible], movable);
        return fail(error, KC_INVALID_ARGUMENT,
                    "synchronizable can't be used with accessible '%s': a ThisDeviceOnly item never leaves this device; "
                    "set synchronizable to false", accessible_names[accessible]);
    }
    if (sync && control != KC_ACCESS_CONTROL_NONE)
        return fail(error, KC_INVALID_ARGUMENT,
                    "synchronizable can't be used with accessControl '%s': an item behind authentication never leaves "
                    "this device; set synchronizable to false, or use accessControl 'none'", access_control_names[control]);
    return KC_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * The application's identifier, the seed's default service (ApplicationIdentity.swift; bindings/python/_appid.py):
 * KEYCHAIN_APP_ID; else the systemd unit the process runs in; else GIO_LAUNCHED_DESKTOP_FILE. */

static char *unescaped(const char *text, size_t n) {
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\\' && i + 4 <= n && text[i + 1] == 'x' && isxdigit((unsigned char)text[i + 2]) &&
            isxdigit((unsigned char)text[i + 3])) {
            char digits[3] = {text[i + 2], text[i + 3], 0};
            out[o++] = (char)strtoul(digits, NULL, 16);
            i += 3;
        } else {
            out[o++] = text[i];
        }
    }
    out[o] = 0;
    if (o == 0) return free(out), NULL;
    return out;
}

static bool ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

static char *unit_application(const char *unit, size_t n) {
    bool scope = ends_with(unit, n, ".scope");
    size_t length = n - (scope ? strlen(".scope") : strlen(".service"));
    const char *name = unit;
    if (length >= 4 && memcmp(name, "app-", 4) == 0) {
        name += 4, length -= 4;
        if (scope) {
            const char *dash = memrchr(name, '-', length);
            if (!dash) return NULL;
            length = (size_t)(dash - name);
        } else {
            const char *at = memchr(name, '@', length);
            if (at) length = (size_t)(at - name);
        }
        const char *dash = memchr(name, '-', length);
        if (dash) length -= (size_t)(dash + 1 - name), name = dash + 1;
        return unescaped(name, length);
    }
    if (scope || (length >= 5 && memcmp(name, "user@", 5) == 0) ||
        (length >= 17 && memcmp(name, "user-runtime-dir@", 17) == 0))
        return NULL;
    return unescaped(name, length);
}

static char *application_identifier(void) {
    const char *given = getenv("KEYCHAIN_APP_ID");
    if (given && *given) return strdup(given);
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f) {
        char *line = NULL;
        size_t size = 0;
        char *found = NULL;
        bool decided = false;
        while (!decided && getline(&line, &size, f) > 0) {
            line[strcspn(line, "\n")] = 0;
            char *first = strchr(line, ':');
            char *second = first ? strchr(first + 1, ':') : NULL;
            if (!second) continue;
            bool unified = first == line + 1 && line[0] == '0' && second == first + 1;
            bool named = (size_t)(second - first - 1) == strlen("name=systemd") && memcmp(first + 1, "name=systemd", 12) == 0;
            if (!unified && !named) continue;
            const char *path = second + 1, *last = NULL;
            size_t last_length = 0;
            for (const char *p = path; *p;) {
                const char *slash = strchr(p, '/');
                size_t n = slash ? (size_t)(slash - p) : strlen(p);
                if (ends_with(p, n, ".service") || ends_with(p, n, ".scope")) last = p, last_length = n;
                p += n + (slash ? 1 : 0);
            }
            if (last) {
                found = unit_application(last, last_length);
                decided = true;
            }
        }
        free(line);
        fclose(f);
        if (found) return found;
    }
    const char *desktop = getenv("GIO_LAUNCHED_DESKTOP_FILE");
    if (desktop && *desktop) {
        const char *base = strrchr(desktop, '/');
        base = base ? base + 1 : desktop;
        size_t n = strlen(base);
        if (ends_with(base, n, ".desktop") && n > strlen(".desktop")) return strndup(base, n - strlen(".desktop"));
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------------
 * The storage. */

struct kc_storage {
    char *service;
    kc_accessible accessible;
    kc_access_control access_control;
    int64_t auth_validity;
    bool synchronizable;
    kc_prompting prompting;
    kc_prompter prompter;
    void *prompter_context;
    unsigned attempts;
    char *socket;
    buffer options;  /* the nested options message every request carries (WireStorageOptions) */
};

KC_API void kc_storage_free(kc_storage *storage) {
    if (!storage) return;
    free(storage->service);
    free(storage->socket);
    buffer_free(&storage->options);
    free(storage);
}

KC_API const char *kc_storage_service(const kc_storage *storage) { return storage ? storage->service : NULL; }

KC_API kc_code kc_storage_new(const kc_options *options, kc_storage **out, kc_error **error) {
    if (error) *error = NULL;
    if (!out) return fail(error, KC_INVALID_ARGUMENT, "Invalid storage: expected a place for the storage, got null");
    *out = NULL;
    kc_options o = options ? *options : (kc_options){0};
    kc_code code;
    if (o.service && (code = check_service(o.service, error))) return code;
    if (o.access_group && (code = check_access_group(o.access_group, error))) return code;
    if ((code = check_choice((int)o.accessible, accessible_names, COUNT(accessible_names), "accessible", error)) ||
        (code = check_choice((int)o.access_control, access_control_names, COUNT(access_control_names), "accessControl", error)) ||
        (code = check_auth_validity(o.auth_validity, error)) || (code = check_flag(o.synchronizable, "synchronizable", error)) ||
        (code = check_prompt(o.prompt, "prompt", error)) ||
        (code = check_choice((int)o.key_storage, key_storage_names, COUNT(key_storage_names), "android.keyStorage", error)))
        return code;
    kc_accessible accessible = o.accessible ? o.accessible : KC_ACCESSIBLE_AFTER_FIRST_UNLOCK;
    kc_access_control control = o.access_control ? o.access_control : KC_ACCESS_CONTROL_NONE;
    bool sync = o.synchronizable == KC_FLAG_TRUE;
    if ((code = check_protection(accessible, control, o.auth_validity, sync, error))) return code;
    if (o.prompting != KC_PROMPT_TERMINAL && o.prompting != KC_PROMPT_CALLBACK && o.prompting != KC_PROMPT_NONE)
        return fail(error, KC_INVALID_ARGUMENT, "Invalid prompting: expected terminal, callback or none, got %d", (int)o.prompting);
    if (o.prompting == KC_PROMPT_CALLBACK && !o.prompter)
        return fail(error, KC_INVALID_ARGUMENT, "Invalid prompter: KC_PROMPT_CALLBACK needs a prompter, got null");

    kc_storage *s = calloc(1, sizeof *s);
    if (!s) return out_of_memory(error);
    s->service = o.service ? strdup(o.service) : application_identifier();
    if (!s->service) {
        kc_storage_free(s);
        return fail(error, KC_INVALID_ARGUMENT,
                    "No application identifier for the default service: set KEYCHAIN_APP_ID, run the program as its "
                    "systemd unit or from its desktop file, or give the storage a service (kc_options.service)");
    }
    if (!o.service && (code = check_service(s->service, error))) return kc_storage_free(s), code;
    s->accessible = accessible, s->access_control = control, s->auth_validity = o.auth_validity, s->synchronizable = sync;
    s->prompting = o.prompting, s->prompter = o.prompter, s->prompter_context = o.prompter_context;
    s->attempts = o.attempts_per_read == 0 ? 3 : o.attempts_per_read > MAX_ATTEMPTS ? MAX_ATTEMPTS : o.attempts_per_read;
    if (o.socket && !(s->socket = strdup(o.socket))) return kc_storage_free(s), out_of_memory(error);
    buffer *b = &s->options;
    begin(b, K_FIELDS, false);
    field_text(b, 1, s->service);
    field_text(b, 2, accessible_names[accessible]);
    field_text(b, 3, access_control_names[control]);
    field_uint(b, 4, (uint64_t)o.auth_validity);
    field_bool(b, 5, sync);
    field_text(b, 6, o.access_group);
    field_prompt(b, 7, o.prompt);
    field_text(b, 8, key_storage_names[o.key_storage ? o.key_storage : KC_KEY_STORAGE_TEE]);
    /* No service named: keychaind gives a confined caller (a unit, a Flatpak app) its application id instead. */
    if (!o.service) field_bool(b, 9, true);
    if (b->failed) return kc_storage_free(s), out_of_memory(error);
    *out = s;
    return KC_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Where keychaind is, and who may serve it (DaemonSocket.resolve, WireSocket.connect). */

static kc_code resolve_socket(const char *explicit, const char **path, kc_error **error) {
    if (explicit && *explicit) return *path = explicit, KC_OK;
    const char *variable = getenv("KEYCHAIN_SOCKET");
    if (variable && *variable) return *path = variable, KC_OK;
    const char *store = getenv("KEYCHAIN_STORE");
    if (store && *store)
        return fail(error, KC_HARDWARE_UNAVAILABLE,
                    "KEYCHAIN_STORE names a store in the process, which this library cannot open: it speaks to keychaind "
                    "only; set KEYCHAIN_SOCKET to keychaind's socket");
    *path = SYSTEM_SOCKET;
    return KC_OK;
}

static bool service_uid(uid_t *uid) {
    struct passwd entry, *found = NULL;
    char text[4096];
    if (getpwnam_r(SERVICE_USER, &entry, text, sizeof text, &found) != 0 || !found) return false;
    *uid = entry.pw_uid;
    return true;
}

/* A connected socket to `path` whose listener may serve the keychain (root, this user, keychaind's user):
 * anyone else listening there would receive the values written and the passcodes answered. */
static kc_code open_socket(const char *path, int *out, kc_error **error) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    size_t n = strlen(path);
    if (n >= sizeof address.sun_path)
        return fail_with(error, KC_HARDWARE_UNAVAILABLE, format("errno %d", ENAMETOOLONG),
                         "The keychain service is not running: nothing answers on %s (start keychaind or its socket unit; "
                         "keychainctl --direct uses a store without the service)", path);
    memcpy(address.sun_path, path, n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail_with(error, KC_HARDWARE_UNAVAILABLE, format("errno %d", errno), "socket failed");
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        int code = errno;
        close(fd);
        return fail_with(error, KC_HARDWARE_UNAVAILABLE, format("errno %d", code),
                         "The keychain service is not running: nothing answers on %s (start keychaind or its socket unit; "
                         "keychainctl --direct uses a store without the service)", path);
    }
    struct ucred peer;
    socklen_t length = sizeof peer;
    bool known = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && length == sizeof peer;
    uid_t service = 0;
    bool has_service = service_uid(&service);
    if (!known || !(peer.uid == 0 || peer.uid == geteuid() || (has_service && peer.uid == service))) {
        close(fd);
        char owner[32] = "an unknown uid", who[64] = "the user " SERVICE_USER;
        if (known) snprintf(owner, sizeof owner, "uid %u", (unsigned)peer.uid);
        if (has_service) snprintf(who, sizeof who, "the user %s (uid %u)", SERVICE_USER, (unsigned)service);
        return fail(error, KC_HARDWARE_UNAVAILABLE,
                    "The keychain service at %s is not trusted: its socket belongs to %s, and only root, this user (uid %u) "
                    "or %s may serve the keychain; nothing was sent (point KEYCHAIN_SOCKET at keychaind's socket)",
                    path, owner, (unsigned)geteuid(), who);
    }
    /* The wait for a reply's first byte is the recv itself; a send that cannot proceed is a stalled peer. */
    struct timeval reply = {.tv_sec = REPLY_TIMEOUT}, stall = {.tv_sec = STALL_TIMEOUT};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &reply, sizeof reply);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof stall);
    *out = fd;
    return KC_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Kept connections: idle ones per socket path and identity, at most MAX_IDLE each, under one mutex.
 * keychaind knows a connection by its credentials at connect, so a process that changed its uid or gid
 * does not reuse another identity's connection. */

typedef struct connection {
    int fd;
    uid_t uid;
    gid_t gid;
    char *path;
    bool reused;
    struct connection *next;
} connection;

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static connection *idle_connections;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void connection_close(connection *c) {
    if (!c) return;
    close(c->fd);
    free(c->path);
    free(c);
}

/* A forked child must not share its parent's kept connections (two processes' exchanges on one stream
 * would interleave): it starts with none, closing only its own copies of the descriptors. */
static void child_after_fork(void) {
    pthread_mutex_init(&pool_lock, NULL);
    connection *c = idle_connections;
    idle_connections = NULL;
    while (c) {
        connection *next = c->next;
        connection_close(c);
        c = next;
    }
}
static void register_fork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

/* An idle kept connection, else a new one; `fresh`: a new one (the kept ones may all have been closed). */
static kc_code take_connection(const char *path, bool fresh, connection **out, kc_error **error) {
    pthread_once(&fork_once, register_fork);
    uid_t uid = geteuid();
    gid_t gid = getegid();
    pthread_mutex_lock(&pool_lock);
    for (connection **at = &idle_connections; *at && !fresh; at = &(*at)->next) {
        connection *c = *at;
        if (c->uid == uid && c->gid == gid && strcmp(c->path, path) == 0) {
            *at = c->next;
            pthread_mutex_unlock(&pool_lock);
            c->next = NULL;
            c->reused = true;
            *out = c;
            return KC_OK;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    connection *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) return free(c), out_of_memory(error);
    kc_code code = open_socket(path, &c->fd, error);
    if (code) {
        free(c->path);
        free(c);
        return code;
    }
    c->uid = uid, c->gid = gid;
    *out = c;
    return KC_OK;
}

/* Kept after a complete exchange; closed otherwise (the stream may be out of step). */
static void release_connection(connection *c, bool complete) {
    if (!c) return;
    if (!complete) return connection_close(c);
    c->reused = false;
    pthread_mutex_lock(&pool_lock);
    int same = 0;
    for (connection *k = idle_connections; k; k = k->next)
        if (k->uid == c->uid && k->gid == c->gid && strcmp(k->path, c->path) == 0) same++;
    if (same < MAX_IDLE) {
        c->next = idle_connections;
        idle_connections = c;
        c = NULL;
    }
    pthread_mutex_unlock(&pool_lock);
    connection_close(c);
}

/* ---------------------------------------------------------------------------------------------------------
 * Frames on a connection. */

typedef enum wire_failure { W_NONE = 0, W_UNREAD, W_CLOSED, W_TRUNCATED, W_TIMED_OUT, W_IO, W_MALFORMED } wire_failure;

/* A received frame's message: bytes[0..length), zeroed when freed. */
typedef struct frame {
    uint8_t *bytes;
    size_t length;
} frame;

static void frame_free(frame *f) {
    wipe_free(f->bytes, f->length);
    *f = (frame){0};
}

static wire_failure send_all(connection *c, const uint8_t *bytes, size_t n) {
    size_t at = 0;
    while (at < n) {
        ssize_t sent = send(c->fd, bytes + at, n - at, MSG_NOSIGNAL);
        if (sent > 0) { at += (size_t)sent; continue; }
        if (sent < 0 && errno == EINTR) continue;
        /* On a kept connection, EPIPE or ECONNRESET is keychaind having closed it unread. */
        if (sent < 0 && (errno == EPIPE || errno == ECONNRESET) && c->reused && at == 0) return W_UNREAD;
        return sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? W_TIMED_OUT : W_IO;
    }
    return W_NONE;
}

/* One recv: the first waits under SO_RCVTIMEO (the reply's timeout), later ones poll the stall timeout. */
static wire_failure receive_some(connection *c, uint8_t *into, size_t n, bool first, size_t *got) {
    for (;;) {
        if (!first) {
            struct pollfd entry = {.fd = c->fd, .events = POLLIN};
            int ready = poll(&entry, 1, STALL_TIMEOUT * 1000);
            if (ready == 0) return W_TIMED_OUT;
            if (ready < 0 && errno == EINTR) continue;
            if (ready < 0) return W_IO;
        }
        ssize_t r = recv(c->fd, into, n, 0);
        if (r > 0) return *got = (size_t)r, W_NONE;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return W_TIMED_OUT;
        /* The peer closed (or reset) before the reply on a kept connection: it never read the request. */
        if (first && c->reused && (r == 0 || errno == ECONNRESET)) return W_UNREAD;
        if (r == 0) return first ? W_CLOSED : W_TRUNCATED;
        return W_IO;
    }
}

/* Sends a frame and reads keychaind's next message; a short reply's length and body come in one recv. */
static wire_failure exchange(connection *c, const buffer *request, frame *reply, char **detail) {
    wire_failure failed = send_all(c, request->bytes, request->length);
    if (failed == W_IO) *detail = format("write failed: errno %d", errno);
    if (failed) return failed;
    uint8_t head[4096];
    size_t got = 0, n = 0;
    bool first = true;
    while (got < 4) {
        if ((failed = receive_some(c, head + got, sizeof head - got, first, &n))) {
            if (failed == W_IO) *detail = format("read failed: errno %d", errno);
            goto done;
        }
        got += n, first = false;
    }
    uint32_t length = get_u32(head);
    if (length < 2 || length > MAX_MESSAGE) {
        *detail = format("frame length %u", length);
        failed = W_MALFORMED;
        goto done;
    }
    if (got > 4 + (size_t)length) {
        *detail = format("bytes past the reply");
        failed = W_MALFORMED;
        goto done;
    }
    reply->bytes = malloc(length);
    if (!reply->bytes) {
        *detail = format("no memory for a reply of %u bytes", length);
        failed = W_IO;
        goto done;
    }
    reply->length = length;
    size_t kept = got - 4;
    memcpy(reply->bytes, head + 4, kept);
    while (kept < length) {
        if ((failed = receive_some(c, reply->bytes + kept, length - kept, false, &n))) {
            if (failed == W_IO) *detail = format("read failed: errno %d", errno);
            frame_free(reply);
            goto done;
        }
        kept += n;
    }
done:
    explicit_bzero(head, sizeof head);
    return failed;
}

/* An exchange on a connected socket failed (WireFailure(exchanging:)). */
static kc_code exchange_failure(wire_failure failed, char *detail, const char *path, kc_error **error) {
    switch (failed) {
    case W_CLOSED: case W_TRUNCATED: case W_UNREAD:
        free(detail);
        return fail_with(error, KC_HARDWARE_UNAVAILABLE, format("the peer closed the connection"),
                         "The keychain service stopped during the call (%s): the call may or may not have taken effect; "
                         "check and retry", path);
    case W_TIMED_OUT:
        free(detail);
        return fail_with(error, KC_HARDWARE_UNAVAILABLE, format("no message within the timeout"),
                         "The keychain service did not answer within %d s (%s)", REPLY_TIMEOUT, path);
    case W_IO:
        return fail_with(error, KC_HARDWARE_UNAVAILABLE, detail,
                         "The keychain service closed the connection (%s): it may be at its connection limit or stopping; "
                         "the call may or may not have taken effect; check and retry", path);
    default: {
        kc_code code = fail(error, KC_INTERNAL, "The keychain service's reply does not decode: %s", detail ? detail : "");
        free(detail);
        return code;
    }
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * JSON, as keychaind's results hold it: an array of strings, or a flat object of strings, numbers, booleans. */

typedef struct json {
    const char *at, *end;
} json;

static void json_space(json *j) {
    while (j->at < j->end && (*j->at == ' ' || *j->at == '\n' || *j->at == '\r' || *j->at == '\t')) j->at++;
}

static bool json_hex4(json *j, uint32_t *v) {
    if (j->end - j->at < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->at++;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        *v = *v << 4 | (uint32_t)d;
    }
    return true;
}

/* A string, decoded into a new C string (NUL inside: refused). */
static char *json_string(json *j) {
    json_space(j);
    if (j->at >= j->end || *j->at != '"') return NULL;
    j->at++;
    buffer out = {0};
    while (j->at < j->end) {
        unsigned char c = (unsigned char)*j->at++;
        if (c == '"') {
            append(&out, "", 1);
            if (out.failed) return buffer_free(&out), NULL;
            return (char *)out.bytes;
        }
        if (c < 0x20) break;
        if (c != '\\') { append(&out, &c, 1); continue; }
        if (j->at >= j->end) break;
        char e = *j->at++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            const char map[] = "\"\\/\b\f\n\r\t";
            append(&out, &map[simple - "\"\\/bfnrt"], 1);
            continue;
        }
        uint32_t v, low;
        if (e != 'u' || !json_hex4(j, &v)) break;
        if (v >= 0xD800 && v < 0xDC00) {
            if (j->end - j->at < 2 || j->at[0] != '\\' || j->at[1] != 'u') break;
            j->at += 2;
            if (!json_hex4(j, &low) || low < 0xDC00 || low >= 0xE000) break;
            v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
        } else if (v >= 0xDC00 && v < 0xE000) break;
        if (v == 0) break;
        uint8_t u[4];
        size_t n = v < 0x80 ? 1 : v < 0x800 ? 2 : v < 0x10000 ? 3 : 4;
        if (n == 1) u[0] = (uint8_t)v;
        else if (n == 2) u[0] = (uint8_t)(0xC0 | v >> 6), u[1] = (uint8_t)(0x80 | (v & 0x3F));
        else if (n == 3) u[0] = (uint8_t)(0xE0 | v >> 12), u[1] = (uint8_t)(0x80 | (v >> 6 & 0x3F)), u[2] = (uint8_t)(0x80 | (v & 0x3F));
        else u[0] = (uint8_t)(0xF0 | v >> 18), u[1] = (uint8_t)(0x80 | (v >> 12 & 0x3F)), u[2] = (uint8_t)(0x80 | (v >> 6 & 0x3F)),
             u[3] = (uint8_t)(0x80 | (v & 0x3F));
        append(&out, u, n);
    }
    buffer_free(&out);
    return NULL;
}

static bool json_literal(json *j, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(j->end - j->at) < n || memcmp(j->at, word, n) != 0) return false;
    j->at += n;
    return true;
}

static bool json_number(json *j, double *v) {
    char text[64];
    size_t n = 0;
    while (j->at + n < j->end && n < sizeof text - 1 && strchr("+-0123456789.eE", j->at[n]) && j->at[n]) n++;
    if (n == 0) return false;
    memcpy(text, j->at, n);
    text[n] = 0;
    char *stop;
    *v = strtod(text, &stop);
    if (stop != text + n) return false;
    j->at += n;
    return true;
}

/* ---------------------------------------------------------------------------------------------------------
 * Prompts. */

struct kc_answer {
    int kind;
    uint8_t *passcode;
    size_t passcode_length;
    char *text;  /* the finger, or the reason */
};

static void answer_reset(kc_answer *a) {
    wipe_free(a->passcode, a->passcode_length);
    free(a->text);
    *a = (kc_answer){.kind = A_CANCEL};
}

KC_API void kc_answer_passcode(kc_answer *a, const void *passcode, size_t length) {
    if (!a) return;
    answer_reset(a);
    a->passcode = malloc(length ? length : 1);
    if (!a->passcode) return;
    if (length) memcpy(a->passcode, passcode, length);
    a->passcode_length = length;
    a->kind = A_PASSCODE;
}
KC_API void kc_answer_finger(kc_answer *a, const char *finger) {
    if (!a) return;
    answer_reset(a);
    a->kind = A_FINGER;
    a->text = strdup(finger ? finger : "");
}
KC_API void kc_answer_cancel(kc_answer *a) { if (a) answer_reset(a); }
KC_API void kc_answer_fallback(kc_answer *a) { if (a) answer_reset(a), a->kind = A_FALLBACK; }
KC_API void kc_answer_interrupted(kc_answer *a) { if (a) answer_reset(a), a->kind = A_INTERRUPTED; }
KC_API void kc_answer_unavailable(kc_answer *a, const char *reason) {
    if (!a) return;
    answer_reset(a);
    a->kind = A_UNAVAILABLE;
    a->text = strdup(reason ? reason : "");
}

/* The answer frame (WirePromptAnswer). */
static void answer_frame(const kc_answer *a, buffer *b) {
    begin(b, K_ANSWER, true);
    field_uint(b, T_ANSWER_KIND, (uint64_t)a->kind);
    if (a->kind == A_FINGER) field_text(b, T_ANSWER_FINGER, a->text ? a->text : "");
    else if (a->kind == A_PASSCODE) field(b, T_ANSWER_PASSCODE, a->passcode, a->passcode_length);
    else if (a->kind == A_UNAVAILABLE) field_text(b, T_ANSWER_REASON, a->text ? a->text : "");
    finish(b);
}

/* The controlling terminal (/dev/tty, as getpass and sudo ask) in the foreground, or why not. */
static int open_terminal(char *why, size_t size) {
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, size, "terminal: no controlling terminal (/dev/tty: %s)", strerror(errno));
        return -1;
    }
    if (!isatty(fd) || tcgetpgrp(fd) != getpgrp()) {
        close(fd);
        snprintf(why, size, "terminal: this process is not in the foreground of /dev/tty");
        return -1;
    }
    return fd;
}

static void write_printable(int fd, const char *text) {
    char out[8];
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p < 0x20 || *p == 0x7F) snprintf(out, sizeof out, "\\x%02x", *p);
        else out[0] = (char)*p, out[1] = 0;
        if (write(fd, out, strlen(out)) < 0) return;
    }
}

/* The terminal's prompt: the passcode read with echo off into a buffer wiped once sent; `fd` is the terminal. */
static void terminal_prompter(int fd, const kc_prompt_request *r, kc_answer *a) {
    bool passcode = false;
    for (const char *const *m = r->methods; m && *m; m++) passcode = passcode || strcmp(*m, "passcode") == 0;
    write_printable(fd, "\n");
    if (r->prompt.title) write_printable(fd, r->prompt.title);
    else {
        char *title = format("Unlock '%s' of %s", r->key, r->service);
        if (title) write_printable(fd, title);
        free(title);
    }
    const char *more[] = {r->prompt.subtitle, r->prompt.description};
    for (int i = 0; i < 2; i++)
        if (more[i] && *more[i]) write_printable(fd, "\n"), write_printable(fd, more[i]);
    if (r->previous_failure) {
        char *line = format("Attempt %u: %s", r->attempt, r->previous_failure);
        if (line) write_printable(fd, "\n"), write_printable(fd, line);
        free(line);
    }
    write_printable(fd, passcode ? "\nPasscode (enter alone: " : "\nFinger (simulated reader) (enter alone: ");
    write_printable(fd, r->prompt.cancel ? r->prompt.cancel : "cancel");
    write_printable(fd, "): ");
    struct termios saved, silent;
    bool restore = false;
    if (passcode && tcgetattr(fd, &saved) == 0) {
        silent = saved;
        silent.c_lflag = (silent.c_lflag & ~(tcflag_t)ECHO) | ECHONL;
        restore = tcsetattr(fd, TCSANOW, &silent) == 0;
    }
    uint8_t line[1024];
    size_t length = 0;
    bool interrupted = false;
    while (length < sizeof line) {
        uint8_t c;
        ssize_t r_ = read(fd, &c, 1);
        if (r_ < 0) { interrupted = true; break; }
        if (r_ == 0 || c == '\n') break;
        line[length++] = c;
    }
    if (restore) tcsetattr(fd, TCSANOW, &saved);
    close(fd);
    if (interrupted) kc_answer_interrupted(a);
    else if (length == 0) kc_answer_cancel(a);
    else if (passcode) kc_answer_passcode(a, line, length);
    else {
        char finger[sizeof line + 1];
        memcpy(finger, line, length);
        finger[length] = 0;
        kc_answer_finger(a, finger);
    }
    explicit_bzero(line, sizeof line);
}


/* ---------------------------------------------------------------------------------------------------------
 * systemd's password agents (https://systemd.io/PASSWORD_AGENTS/), as AskPasswordAuthenticator.swift asks. */

enum { AGENT_TIMEOUT_SECONDS = 90 };  /* PromptTimeout.default: systemd-ask-password's own */
enum { LINE_TEXT, LINE_CANCEL, LINE_INTERRUPTED, LINE_UNAVAILABLE };

static bool is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The agents' directory (AskPasswordAuthenticator.systemDirectory): root's /run/systemd/ask-password on a system
 * booted with systemd, else $XDG_RUNTIME_DIR/systemd/ask-password when it exists; false when neither. */
static bool agents_directory(char *out, size_t size) {
    if (geteuid() == 0 && is_directory("/run/systemd/system") && is_directory("/run/systemd/ask-password")) {
        snprintf(out, size, "/run/systemd/ask-password");
        return true;
    }
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    if (!runtime || runtime[0] != '/') return false;
    int n = snprintf(out, size, "%s/systemd/ask-password", runtime);
    return n > 0 && (size_t)n < size && is_directory(out);
}

static bool agents_reachable(const char *directory, char *why, size_t size) {
    if (access(directory, W_OK | X_OK) == 0) return true;
    snprintf(why, size, "password agents: cannot write to %.300s (%s)", directory, strerror(errno));
    return false;
}

/* `text` with control characters as spaces (the file's one-line fields), appended to `b`. */
static void one_line(buffer *b, const char *text) {
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        uint8_t c = *p < 0x20 || *p == 0x7F ? ' ' : *p;
        append(b, &c, 1);
    }
}

static uint64_t monotonic_microseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* One answer on `fd`, received only from root or this user (SCM_CREDENTIALS) straight into `line` (`size` bytes):
 * `+` and the line (the first of NUL-separated ones), or `-`; -1 for none or a sender not allowed. */
static int agent_receive(int fd, uint8_t *line, size_t size, size_t *length) {
    uint8_t datagram[4097];
    union { struct cmsghdr align; uint8_t bytes[CMSG_SPACE(sizeof(struct ucred))]; } control;
    struct iovec vector = {.iov_base = datagram, .iov_len = sizeof datagram};
    struct msghdr header = {.msg_iov = &vector, .msg_iovlen = 1, .msg_control = control.bytes,
                            .msg_controllen = sizeof control.bytes};
    ssize_t got = recvmsg(fd, &header, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    int kind = -1;
    struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&header) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
        c->cmsg_len == CMSG_LEN(sizeof(struct ucred))) {
        struct ucred sender;
        memcpy(&sender, CMSG_DATA(c), sizeof sender);
        if (sender.uid == 0 || sender.uid == geteuid()) {
            if (datagram[0] == '+') {
                const uint8_t *end = memchr(datagram + 1, 0, (size_t)got - 1);
                size_t n = (end ? (size_t)(end - datagram) : (size_t)got) - 1;
                if (n <= size) memcpy(line, datagram + 1, n), *length = n, kind = LINE_TEXT;
            } else if (datagram[0] == '-') kind = LINE_CANCEL;
        }
    }
    explicit_bzero(datagram, sizeof datagram);
    return kind;
}

/* One question to the agents: an ask.* file naming a datagram socket, the answer read into `line`; the file and the
 * socket removed when the question ends (answered, timed out, failed). */
static int agent_ask(const char *directory, const char *question, const char *id, bool echo, uint8_t *line, size_t size,
                     size_t *length, char *why, size_t why_size) {
    uint8_t random[8];
    if (getrandom(random, sizeof random, 0) != (ssize_t)sizeof random) {
        snprintf(why, why_size, "password agents: no random name (%s)", strerror(errno));
        return LINE_UNAVAILABLE;
    }
    char name[17];
    for (int i = 0; i < 8; i++) snprintf(name + 2 * i, 3, "%02x", random[i]);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    char ask_path[PATH_MAX], temporary[PATH_MAX];
    int n = snprintf(address.sun_path, sizeof address.sun_path, "%s/sck.%s", directory, name);
    if (n < 0 || (size_t)n >= sizeof address.sun_path) {
        snprintf(why, why_size, "password agents: the socket path in %.300s is too long", directory);
        return LINE_UNAVAILABLE;
    }
    snprintf(ask_path, sizeof ask_path, "%s/ask.%s", directory, name);
    snprintf(temporary, sizeof temporary, "%s/.tmp.%s", directory, name);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_size, "password agents: no socket (%s)", strerror(errno));
        return LINE_UNAVAILABLE;
    }
    if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        snprintf(why, why_size, "password agents: cannot bind %.300s (%s)", address.sun_path, strerror(errno));
        close(fd);
        return LINE_UNAVAILABLE;
    }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
    /* NotAfter= is CLOCK_MONOTONIC in microseconds, as the agents compare it. */
    uint64_t deadline = monotonic_microseconds() + (uint64_t)AGENT_TIMEOUT_SECONDS * 1000000u;
    buffer file = {0};
    char *head = format("[Ask]\nPID=%d\nSocket=%s\nAcceptCached=0\nEcho=%d\nNotAfter=%llu\nId=", (int)getpid(),
                        address.sun_path, echo ? 1 : 0, (unsigned long long)deadline);
    if (head) append(&file, head, strlen(head));
    free(head);
    one_line(&file, id);
    append(&file, "\nMessage=", 9);
    one_line(&file, question);
    append(&file, "\n", 1);
    /* Written beside, then renamed: agents watch IN_MOVED_TO and never read half a file. */
    int kind = LINE_UNAVAILABLE;
    int out = file.failed ? -1 : open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool written = out >= 0 && write(out, file.bytes, file.length) == (ssize_t)file.length;
    if (out >= 0) close(out);
    buffer_free(&file);
    if (!written || rename(temporary, ask_path) != 0) {
        snprintf(why, why_size, "password agents: cannot write %.300s (%s)", ask_path, strerror(errno));
        unlink(temporary);
        unlink(address.sun_path);
        close(fd);
        return LINE_UNAVAILABLE;
    }
    for (;;) {
        uint64_t now = monotonic_microseconds();
        if (now >= deadline) { kind = LINE_INTERRUPTED; break; }
        struct pollfd ready = {.fd = fd, .events = POLLIN};
        int polled = poll(&ready, 1, (int)((deadline - now + 999) / 1000));
        if (polled < 0 && errno == EINTR) continue;
        if (polled < 0 || (polled > 0 && !(ready.revents & POLLIN))) { kind = LINE_INTERRUPTED; break; }
        if (polled == 0) continue;
        kind = agent_receive(fd, line, size, length);
        if (kind >= 0) break;  /* else a datagram from someone else: keep waiting */
    }
    unlink(ask_path);
    unlink(address.sun_path);
    close(fd);
    return kind;
}

/* The request's questions through the agents, as Swift's LinePrompter asks them: a finger first (empty: the passcode
 * instead, when it is allowed), then the passcode; an empty answer is a cancel. */
static void agents_prompter(const char *directory, const kc_prompt_request *r, kc_answer *a) {
    bool finger = false, passcode = false;
    for (const char *const *m = r->methods; m && *m; m++) {
        finger = finger || strcmp(*m, "fingerprint") == 0;
        passcode = passcode || strcmp(*m, "passcode") == 0;
    }
    const char *cancel = r->prompt.cancel ? r->prompt.cancel : "Cancel";
    char *title = r->prompt.title ? format("%s", r->prompt.title)
                  : r->key && *r->key ? format("Authenticate to read '%s'", r->key) : format("Authenticate");
    char *failure = r->previous_failure ? format(" — %s, try again", r->previous_failure) : format("%s", "");
    char *id = r->service && *r->service ? format("keychain:%s/%s", r->service, r->key ? r->key : "") : format("keychain");
    char *details = format("%s%s%s%s%s", r->prompt.subtitle ? " — " : "", r->prompt.subtitle ? r->prompt.subtitle : "",
                           r->prompt.description ? " — " : "", r->prompt.description ? r->prompt.description : "",
                           failure ? failure : "");
    uint8_t line[4096];
    size_t length = 0;
    char why[512];
    int kind = LINE_CANCEL;
    if (!title || !failure || !id || !details) {
        kc_answer_unavailable(a, "password agents: out of memory");
        goto done;
    }
    if (finger) {
        char *question = format("%s%s — Finger to touch the reader (empty: %s)", title, details,
                               passcode ? "use the passcode" : cancel);
        kind = question ? agent_ask(directory, question, id, true, line, sizeof line - 1, &length, why, sizeof why)
                       : LINE_INTERRUPTED;
        free(question);
        if (kind == LINE_TEXT && length > 0) {
            line[length] = 0;
            kc_answer_finger(a, (const char *)line);
            goto done;
        }
        if (kind != LINE_TEXT || !passcode) goto answer;
    }
    if (!passcode) goto answer;
    char *question = format("%s%s — Passcode (empty: %s)", title, details, cancel);
    kind = question ? agent_ask(directory, question, id, false, line, sizeof line, &length, why, sizeof why)
                   : LINE_INTERRUPTED;
    free(question);
    if (kind == LINE_TEXT && length > 0) {
        kc_answer_passcode(a, line, length);
        goto done;
    }
answer:
    if (kind == LINE_INTERRUPTED) kc_answer_interrupted(a);
    else if (kind == LINE_UNAVAILABLE) kc_answer_unavailable(a, why);
    else kc_answer_cancel(a);
done:
    explicit_bzero(line, sizeof line);
    free(title), free(failure), free(id), free(details);
}

/* The default prompter (SystemAuthenticator's order): the terminal in the foreground, else the password agents; when
 * neither reaches anyone, unavailable naming why each could not (the read fails with INTERACTION_NOT_ALLOWED). */
static void system_prompter(const kc_prompt_request *r, kc_answer *a) {
    char terminal_why[256], agents_why[512] = "", directory[PATH_MAX];
    int fd = open_terminal(terminal_why, sizeof terminal_why);
    if (fd >= 0) return terminal_prompter(fd, r, a);
    if (agents_directory(directory, sizeof directory) && agents_reachable(directory, agents_why, sizeof agents_why))
        return agents_prompter(directory, r, a);
    char *why = format("%s%s%s", terminal_why, *agents_why ? "; " : "", agents_why);
    kc_answer_unavailable(a, why ? why : terminal_why);
    free(why);
}

static bool system_reachable(void) {
    char why[512], directory[PATH_MAX];
    int fd = open_terminal(why, sizeof why);
    if (fd >= 0) return close(fd), true;
    return agents_directory(directory, sizeof directory) && agents_reachable(directory, why, sizeof why);
}

/* keychaind's question decoded (WirePromptQuestion), its strings owned here. */
typedef struct question {
    kc_prompt_request request;
    char *texts[4];
    char **methods;
    char *service, *key, *previous_failure;
} question;

static void question_free(question *q) {
    for (int i = 0; i < 4; i++) free(q->texts[i]);
    kc_strings_free(q->methods);
    free(q->service), free(q->key), free(q->previous_failure);
    *q = (question){0};
}

static bool parse_string_array(const uint8_t *bytes, size_t n, char ***out, size_t *count);

static bool question_decode(const message *m, question *q) {
    *q = (question){0};
    if (m->has[T_PROMPT_TEXTS]) {
        message nested;
        char *why = NULL;
        if (!decode(m->at[T_PROMPT_TEXTS], m->length[T_PROMPT_TEXTS], &nested, &why) || nested.kind != K_FIELDS) {
            free(why);
            return false;
        }
        for (int i = 0; i < 4; i++)
            if (!copy_text(&nested, (uint8_t)(i + 1), &q->texts[i])) return false;
    }
    size_t count = 0;
    if (m->has[T_METHODS]) {
        if (!parse_string_array(m->at[T_METHODS], m->length[T_METHODS], &q->methods, &count)) return false;
    } else if (!(q->methods = calloc(1, sizeof(char *)))) return false;
    if (!copy_text(m, T_SERVICE, &q->service) || !copy_text(m, T_PROMPT_KEY, &q->key) ||
        !copy_text(m, T_PREVIOUS_FAILURE, &q->previous_failure))
        return false;
    uint64_t attempt = 1;
    if (m->has[T_ATTEMPT] && !read_uint(m, T_ATTEMPT, &attempt)) return false;
    q->request = (kc_prompt_request){
        .prompt = {q->texts[0], q->texts[1], q->texts[2], q->texts[3]},
        .methods = (const char *const *)q->methods,
        .service = q->service ? q->service : "",
        .key = q->key ? q->key : "",
        .attempt = (unsigned)attempt,
        .previous_failure = q->previous_failure,
    };
    return true;
}

/* ---------------------------------------------------------------------------------------------------------
 * One call: the request on a kept connection (sent again once on a new one when keychaind had closed the
 * kept one unread), the prompts answered, keychaind's reply handed to `reader` or its error returned. */

typedef kc_code (*reply_reader)(const message *reply, void *result, kc_error **error);

static kc_code error_from(const message *m, kc_error **error) {
    char *code_text = NULL, *text = NULL, *detail = NULL;
    if (!copy_text(m, T_ERROR_CODE, &code_text) || !code_text || !copy_text(m, T_ERROR_MESSAGE, &text) ||
        !copy_text(m, T_CAUSE_TEXT, &detail)) {
        free(code_text), free(text), free(detail);
        return fail(error, KC_INTERNAL, "The keychain service's reply does not decode: error without a code");
    }
    kc_code code = KC_INTERNAL;
    for (int i = 1; i < CODE_COUNT; i++)
        if (strcmp(code_names[i], code_text) == 0) code = (kc_code)i;
    uint64_t number = 0, kind = 0;
    read_uint(m, T_CAUSE_NUMBER, &number);
    char *cause = NULL;
    const char *d = detail ? detail : "";
    if (read_uint(m, T_CAUSE_KIND, &kind)) {
        if (kind == 0) cause = format("TPM %s (0x%08X)", d, (unsigned)(number & 0xFFFFFFFF));
        else if (kind == 1) cause = format("SQLite %d: %s", (int32_t)(uint32_t)number, d);
        else if (kind == 2) cause = format("errno %d", (int32_t)(uint32_t)number);
        else if (kind == 3) cause = format("PKCS#11 %s (0x%08llX)", d, (unsigned long long)number);
        else cause = strdup(d);
    }
    /* A code this library does not know keeps its word in the message. */
    kc_code result = code == KC_INTERNAL && strcmp(code_text, "INTERNAL") != 0
                         ? fail_with(error, code, cause, "%s: %s", code_text, text ? text : "")
                         : fail_with(error, code, cause, "%s", text ? text : "");
    free(code_text), free(text), free(detail);
    return result;
}

static kc_code run(const char *explicit_socket, buffer *request, const kc_storage *storage, reply_reader reader,
                   void *result, kc_error **error) {
    if (error) *error = NULL;
    const char *path = NULL;
    kc_code code = resolve_socket(explicit_socket, &path, error);
    if (code) return buffer_free(request), code;
    if (request->failed) return buffer_free(request), out_of_memory(error);
    connection *c = NULL;
    if ((code = take_connection(path, false, &c, error))) return buffer_free(request), code;
    bool complete = false;
    buffer answer = {0};
    const buffer *sending = request;
    frame reply = {0};
    for (;;) {
        char *detail = NULL;
        wire_failure failed = exchange(c, sending, &reply, &detail);
        if (failed == W_UNREAD && sending == request) {
            connection_close(c);
            c = NULL;
            if ((code = take_connection(path, true, &c, error))) break;
            failed = exchange(c, sending, &reply, &detail);
        }
        buffer_free(&answer);
        if (failed) {
            code = exchange_failure(failed, detail, path, error);
            break;
        }
        message m;
        if (!decode(reply.bytes, reply.length, &m, &detail)) {
            code = exchange_failure(W_MALFORMED, detail, path, error);
            break;
        }
        if (m.kind == K_OK) {
            complete = true;
            code = reader(&m, result, error);
            break;
        }
        if (m.kind == K_ERROR) {
            complete = true;
            code = error_from(&m, error);
            break;
        }
        if (m.kind != K_PROMPT) {
            code = fail(error, KC_INTERNAL, "The keychain service sent a reply of unknown kind %u", m.kind);
            break;
        }
        question q;
        if (!question_decode(&m, &q)) {
            question_free(&q);
            code = fail(error, KC_INTERNAL, "The keychain service's reply does not decode: a prompt that is not one");
            break;
        }
        frame_free(&reply);
        kc_answer a = {.kind = A_CANCEL};
        if (!storage || storage->prompting == KC_PROMPT_NONE) a.kind = A_INTERRUPTED;
        else if (storage->prompting == KC_PROMPT_CALLBACK) storage->prompter(storage->prompter_context, &q.request, &a);
        else system_prompter(&q.request, &a);
        question_free(&q);
        answer_frame(&a, &answer);
        answer_reset(&a);
        if (answer.failed) {
            code = out_of_memory(error);
            break;
        }
        sending = &answer;
    }
    frame_free(&reply);
    buffer_free(&answer);
    buffer_free(request);
    release_connection(c, complete);
    return code;
}

/* A storage's request: its options, then the key when the call has one. */
static kc_code request_for(const kc_storage *s, uint8_t op, const char *key, buffer *b, kc_error **error) {
    if (error) *error = NULL;
    if (!s) return fail(error, KC_INVALID_ARGUMENT, "Invalid storage: expected a storage, got null");
    if (key) {
        kc_code code = check_key(key, error);
        if (code) return code;
    }
    *b = (buffer){0};
    begin(b, op, true);
    field(b, T_OPTIONS, s->options.bytes, s->options.length);
    if (key) field_text(b, T_KEY, key);
    return KC_OK;
}

static kc_code read_nothing(const message *m, void *result, kc_error **error) {
    (void)m, (void)result, (void)error;
    return KC_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * The item calls. */

KC_API kc_code kc_set_item(kc_storage *s, const char *key, const void *value, size_t length, const kc_set_options *set,
                           kc_error **error) {
    if (error) *error = NULL;
    if (!s) return fail(error, KC_INVALID_ARGUMENT, "Invalid storage: expected a storage, got null");
    kc_code code = check_key(key, error);
    if (code) return code;
    if (!value && length) return fail(error, KC_INVALID_ARGUMENT, "Invalid value: expected bytes, got null");
    if (length > MAX_VALUE) return fail(error, KC_INVALID_ARGUMENT, "Invalid value: at most %u bytes, got %zu", MAX_VALUE, length);
    kc_set_options o = set ? *set : (kc_set_options){0};
    if ((code = check_choice((int)o.accessible, accessible_names, COUNT(accessible_names), "accessible", error)) ||
        (code = check_choice((int)o.access_control, access_control_names, COUNT(access_control_names), "accessControl", error)) ||
        (o.has_auth_validity && (code = check_auth_validity(o.auth_validity, error))) ||
        (code = check_flag(o.synchronizable, "synchronizable", error)))
        return code;
    if (o.label) {
        size_t n = strlen(o.label);
        if (!valid_utf8((const uint8_t *)o.label, n))
            return fail(error, KC_INVALID_ARGUMENT, "Invalid label: expected a string of up to %d bytes, got a string that is not UTF-8", MAX_LABEL);
        if (n > MAX_LABEL)
            return fail(error, KC_INVALID_ARGUMENT, "Invalid label: expected a string of up to %d bytes, got %zu bytes", MAX_LABEL, n);
    }
    if ((code = check_protection(o.accessible ? o.accessible : s->accessible,
                                 o.access_control ? o.access_control : s->access_control,
                                 o.has_auth_validity ? o.auth_validity : s->auth_validity,
                                 o.synchronizable ? o.synchronizable == KC_FLAG_TRUE : s->synchronizable, error)))
        return code;
    buffer b;
    if ((code = request_for(s, OP_SET, key, &b, error))) return code;
    field(&b, T_VALUE, value, length);
    if (o.accessible) field_text(&b, T_ACCESSIBLE, accessible_names[o.accessible]);
    if (o.access_control) field_text(&b, T_ACCESS_CONTROL, access_control_names[o.access_control]);
    if (o.has_auth_validity) field_uint(&b, T_AUTH_VALIDITY, (uint64_t)o.auth_validity);
    if (o.label) field_text(&b, T_LABEL, o.label);
    if (o.synchronizable) field_bool(&b, T_SYNCHRONIZABLE, o.synchronizable == KC_FLAG_TRUE);
    finish(&b);
    return run(s->socket, &b, s, read_nothing, NULL, error);
}

struct kc_secret {
    uint8_t *bytes;
    size_t length;
};

KC_API const uint8_t *kc_secret_data(const kc_secret *secret) { return secret ? secret->bytes : NULL; }
KC_API size_t kc_secret_size(const kc_secret *secret) { return secret ? secret->length : 0; }
KC_API void kc_secret_free(kc_secret *secret) {
    if (!secret) return;
    wipe_free(secret->bytes, secret->length ? secret->length : 1);
    free(secret);
}

static kc_code read_value(const message *m, void *result, kc_error **error) {
    kc_secret **out = result;
    if (!m->has[T_RESULT_BYTES]) return KC_OK;
    kc_secret *secret = calloc(1, sizeof *secret);
    size_t n = m->length[T_RESULT_BYTES];
    if (!secret || !(secret->bytes = malloc(n ? n : 1))) return free(secret), out_of_memory(error);
    memcpy(secret->bytes, m->at[T_RESULT_BYTES], n);
    secret->length = n;
    *out = secret;
    return KC_OK;
}

KC_API kc_code kc_get_item(kc_storage *s, const char *key, const kc_prompt *prompt, kc_secret **value, kc_error **error) {
    if (value) *value = NULL;
    if (!value) return fail(error, KC_INVALID_ARGUMENT, "Invalid value: expected a place for the value, got null");
    kc_code code = check_prompt(prompt, "prompt", error);
    if (code) return code;
    buffer b;
    if ((code = request_for(s, OP_GET, key, &b, error))) return code;
    field_prompt(&b, T_PROMPT, prompt);
    if (s->prompting != KC_PROMPT_NONE) field_uint(&b, T_ATTEMPTS, s->attempts);
    finish(&b);
    return run(s->socket, &b, s, read_value, value, error);
}

static kc_code read_bool(const message *m, void *result, kc_error **error) {
    if (!m->has[T_RESULT_BOOL] || m->length[T_RESULT_BOOL] != 1 || m->at[T_RESULT_BOOL][0] > 1)
        return fail(error, KC_INTERNAL, "The keychain service's reply has no boolean result");
    *(int *)result = m->at[T_RESULT_BOOL][0];
    return KC_OK;
}

KC_API kc_code kc_has_item(kc_storage *s, const char *key, int *found, kc_error **error) {
    if (!found) return fail(error, KC_INVALID_ARGUMENT, "Invalid found: expected a place for the answer, got null");
    *found = 0;
    buffer b;
    kc_code code = request_for(s, OP_HAS, key, &b, error);
    if (code) return code;
    finish(&b);
    return run(s->socket, &b, s, read_bool, found, error);
}

KC_API kc_code kc_remove_item(kc_storage *s, const char *key, kc_error **error) {
    buffer b;
    kc_code code = request_for(s, OP_REMOVE, key, &b, error);
    if (code) return code;
    finish(&b);
    return run(s->socket, &b, s, read_nothing, NULL, error);
}

KC_API kc_code kc_clear(kc_storage *s, kc_error **error) {
    buffer b;
    kc_code code = request_for(s, OP_CLEAR, NULL, &b, error);
    if (code) return code;
    finish(&b);
    return run(s->socket, &b, s, read_nothing, NULL, error);
}

KC_API void kc_strings_free(char **strings) {
    if (!strings) return;
    for (char **p = strings; *p; p++) free(*p);
    free(strings);
}

static bool parse_string_array(const uint8_t *bytes, size_t n, char ***out, size_t *count) {
    json j = {(const char *)bytes, (const char *)bytes + n};
    size_t used = 0, capacity = 8;
    char **list = calloc(capacity + 1, sizeof *list);
    if (!list) return false;
    json_space(&j);
    if (j.at >= j.end || *j.at++ != '[') goto bad;
    json_space(&j);
    if (j.at < j.end && *j.at == ']') j.at++;
    else
        for (;;) {
            char *item = json_string(&j);
            if (!item) goto bad;
            if (used == capacity) {
                char **grown = realloc(list, (capacity * 2 + 1) * sizeof *list);
                if (!grown) { free(item); goto bad; }
                list = grown, capacity *= 2;
            }
            list[used++] = item;
            list[used] = NULL;
            json_space(&j);
            if (j.at >= j.end) goto bad;
            char next = *j.at++;
            if (next == ']') break;
            if (next != ',') goto bad;
        }
    json_space(&j);
    if (j.at != j.end) goto bad;
    *out = list, *count = used;
    return true;
bad:
    kc_strings_free(list);
    return false;
}

typedef struct keys_result {
    char ***keys;
    size_t *count;
} keys_result;

static kc_code read_keys(const message *m, void *result, kc_error **error) {
    keys_result *r = result;
    if (!m->has[T_RESULT_JSON] || !parse_string_array(m->at[T_RESULT_JSON], m->length[T_RESULT_JSON], r->keys, r->count))
        return fail(error, KC_INTERNAL, "The keychain service's reply has no list of keys");
    return KC_OK;
}

KC_API kc_code kc_get_all_keys(kc_storage *s, char ***keys, size_t *count, kc_error **error) {
    size_t ignored;
    if (!keys) return fail(error, KC_INVALID_ARGUMENT, "Invalid keys: expected a place for the keys, got null");
    *keys = NULL;
    if (count) *count = 0;
    buffer b;
    kc_code code = request_for(s, OP_ALL_KEYS, NULL, &b, error);
    if (code) return code;
    finish(&b);
    keys_result r = {keys, count ? count : &ignored};
    return run(s->socket, &b, s, read_keys, &r, error);
}

KC_API void kc_item_info_free(kc_item_info *info) {
    if (!info) return;
    free(info->key), free(info->service), free(info->label), free(info->security_level), free(info->token);
    free(info);
}

static int name_index(const char *word, const char *const *names, int count) {
    for (int i = 1; i < count; i++)
        if (word && strcmp(word, names[i]) == 0) return i;
    return 0;
}

/* A flat JSON object, each member handed to `member` (which consumes its value); false when it does not parse. */
typedef bool (*json_member)(json *j, const char *name, void *into);

static bool json_object(const uint8_t *bytes, size_t n, json_member member, void *into, bool *null) {
    json j = {(const char *)bytes, (const char *)bytes + n};
    json_space(&j);
    if (null) *null = false;
    if (null && json_literal(&j, "null")) {
        json_space(&j);
        return *null = true, j.at == j.end;
    }
    if (j.at >= j.end || *j.at++ != '{') return false;
    json_space(&j);
    if (j.at < j.end && *j.at == '}') j.at++;
    else
        for (;;) {
            char *name = json_string(&j);
            if (!name) return false;
            json_space(&j);
            bool ok = j.at < j.end && *j.at++ == ':';
            if (ok) json_space(&j), ok = member(&j, name, into);
            free(name);
            if (!ok) return false;
            json_space(&j);
            if (j.at >= j.end) return false;
            char next = *j.at++;
            if (next == '}') break;
            if (next != ',') return false;
        }
    json_space(&j);
    return j.at == j.end;
}

/* A scalar value: a string (into *text when given), a number, a boolean or null. */
static bool json_scalar(json *j, char **text, double *number, int *boolean) {
    if (j->at < j->end && *j->at == '"') {
        char *s = json_string(j);
        if (!s) return false;
        if (text) free(*text), *text = s;
        else free(s);
        return true;
    }
    int found = json_literal(j, "true") ? 1 : json_literal(j, "false") ? 0 : -1;
    if (found >= 0) {
        if (boolean) *boolean = found;
        return true;
    }
    if (json_literal(j, "null")) return true;
    double v;
    if (!json_number(j, &v)) return false;
    if (number) *number = v;
    return true;
}

typedef struct info_parse {
    kc_item_info *info;
    char *accessible, *access_control;
    int seen;
} info_parse;

static bool info_member(json *j, const char *name, void *into) {
    info_parse *p = into;
    kc_item_info *i = p->info;
    if (!strcmp(name, "key")) return p->seen |= 1, json_scalar(j, &i->key, NULL, NULL);
    if (!strcmp(name, "service")) return p->seen |= 2, json_scalar(j, &i->service, NULL, NULL);
    if (!strcmp(name, "accessible")) return json_scalar(j, &p->accessible, NULL, NULL);
    if (!strcmp(name, "accessControl")) return json_scalar(j, &p->access_control, NULL, NULL);
    if (!strcmp(name, "label")) return json_scalar(j, &i->label, NULL, NULL);
    if (!strcmp(name, "created")) return p->seen |= 4, json_scalar(j, NULL, &i->created, NULL);
    if (!strcmp(name, "modified")) return p->seen |= 8, json_scalar(j, NULL, &i->modified, NULL);
    if (!strcmp(name, "securityLevel")) return json_scalar(j, &i->security_level, NULL, NULL);
    if (!strcmp(name, "token")) return json_scalar(j, &i->token, NULL, NULL);
    return json_scalar(j, NULL, NULL, NULL);
}

static kc_code read_info(const message *m, void *result, kc_error **error) {
    kc_item_info **out = result;
    if (!m->has[T_RESULT_JSON]) return KC_OK;
    info_parse p = {.info = calloc(1, sizeof(kc_item_info))};
    if (!p.info) return out_of_memory(error);
    bool null = false;
    bool ok = json_object(m->at[T_RESULT_JSON], m->length[T_RESULT_JSON], info_member, &p, &null);
    p.info->accessible = (kc_accessible)name_index(p.accessible, accessible_names, COUNT(accessible_names));
    p.info->access_control = (kc_access_control)name_index(p.access_control, access_control_names, COUNT(access_control_names));
    free(p.accessible), free(p.access_control);
    if (ok && null) return kc_item_info_free(p.info), KC_OK;
    if (!ok || p.seen != 15 || !p.info->accessible || !p.info->access_control || !p.info->security_level) {
        kc_item_info_free(p.info);
        return fail(error, KC_INTERNAL, "The keychain service's reply does not decode: an item's description that is not one");
    }
    p.info->created += REFERENCE_DATE;
    p.info->modified += REFERENCE_DATE;
    *out = p.info;
    return KC_OK;
}

KC_API kc_code kc_get_item_info(kc_storage *s, const char *key, kc_item_info **info, kc_error **error) {
    if (!info) return fail(error, KC_INVALID_ARGUMENT, "Invalid info: expected a place for the description, got null");
    *info = NULL;
    buffer b;
    kc_code code = request_for(s, OP_ITEM_INFO, key, &b, error);
    if (code) return code;
    finish(&b);
    return run(s->socket, &b, s, read_info, info, error);
}

typedef struct check_parse {
    kc_access_control_check *check;
    int available;
    char *reason;
} check_parse;

static bool check_member(json *j, const char *name, void *into) {
    check_parse *p = into;
    if (!strcmp(name, "available")) return json_scalar(j, NULL, NULL, &p->available);
    if (!strcmp(name, "reason")) return json_scalar(j, &p->reason, NULL, NULL);
    return json_scalar(j, NULL, NULL, NULL);
}

static kc_code read_check(const message *m, void *result, kc_error **error) {
    check_parse p = {.check = result, .available = -1};
    bool ok = m->has[T_RESULT_JSON] && json_object(m->at[T_RESULT_JSON], m->length[T_RESULT_JSON], check_member, &p, NULL);
    if (!ok || p.available < 0) {
        free(p.reason);
        return fail(error, KC_INTERNAL, "The keychain service's reply has no result");
    }
    p.check->available = p.available;
    snprintf(p.check->reason, sizeof p.check->reason, "%s", p.reason ? p.reason : "");
    free(p.reason);
    return KC_OK;
}

/* `noPrompt` when the device can give `value` but neither the terminal nor the password agents reach anyone (the Swift library's rule). */
static void reach(kc_prompting prompting, kc_access_control value, kc_access_control_check *check) {
    if (check->available && value != KC_ACCESS_CONTROL_NONE && prompting == KC_PROMPT_TERMINAL && !system_reachable()) {
        check->available = 0;
        snprintf(check->reason, sizeof check->reason, "noPrompt");
    }
}

/* One canUseAccessControl: the storage's (its options sent, its prompting) or the device's (`s` NULL, the terminal). */
static kc_code can_use(kc_storage *s, const char *socket, kc_access_control value, kc_access_control_check *check,
                       kc_error **error) {
    if (error) *error = NULL;
    if (!check) return fail(error, KC_INVALID_ARGUMENT, "Invalid check: expected a place for the answer, got null");
    *check = (kc_access_control_check){0};
    kc_code code = check_choice((int)value, access_control_names, COUNT(access_control_names), "accessControl", error);
    if (code) return code;
    if (value == KC_ACCESS_CONTROL_DEFAULT)
        return fail(error, KC_INVALID_ARGUMENT, "Invalid accessControl: expected an access control, got the default");
    buffer b = {0};
    if (s) {
        if ((code = request_for(s, OP_STORAGE_CAN_USE, NULL, &b, error))) return code;
    } else {
        begin(&b, OP_DEVICE_CAN_USE, true);
    }
    field_text(&b, T_ACCESS_CONTROL, access_control_names[value]);
    finish(&b);
    if ((code = run(s ? s->socket : socket, &b, s, read_check, check, error))) return code;
    reach(s ? s->prompting : KC_PROMPT_TERMINAL, value, check);
    return KC_OK;
}

KC_API kc_code kc_storage_can_use_access_control(kc_storage *s, kc_access_control value, kc_access_control_check *check,
                                                 kc_error **error) {
    if (!s) return fail(error, KC_INVALID_ARGUMENT, "Invalid storage: expected a storage, got null");
    return can_use(s, NULL, value, check, error);
}

KC_API kc_code kc_can_use_access_control(const char *socket, kc_access_control value, kc_access_control_check *check,
                                         kc_error **error) {
    return can_use(NULL, socket, value, check, error);
}
