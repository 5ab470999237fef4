/* keychain.h: the seed's keychain API in C, over keychaind (Keychain for Linux, docs/c.md).
 *
 * A program links libkeychain.so.1 (pkg-config --cflags --libs keychain); the library speaks
 * keychaind's protocol (docs/daemon.md, "The protocol (version 2)") on its Unix socket. No TPM,
 * SQLite or Swift runtime is in the calling process: keychaind keeps the TPM-backed store.
 *
 * Conventions:
 * - Every call returns a kc_code: KC_OK, or the seed's error code. When `error` is not NULL and the
 *   call fails, *error is set to a kc_error (code, message, cause) the caller frees with kc_error_free.
 * - Values travel as pointer + length, never as C strings. A value read comes back in a kc_secret,
 *   whose bytes kc_secret_free zeroes (explicit_bzero) before freeing: the library keeps no other copy
 *   (its send and receive buffers are zeroed before they are freed or reused).
 * - Thread-safe: a storage may be used from several threads at once; each call takes a kept connection
 *   of its own (a mutex guards the list of idle ones), so calls run side by side. A forked child
 *   starts with no kept connection.
 * - A read behind an access control makes keychaind ask the program: the storage's prompter callback,
 *   or by default the controlling terminal (/dev/tty, the passcode read with echo off), else systemd's password
 *   agents (ask-password); with neither the read fails with KC_INTERACTION_NOT_ALLOWED.
 */
#ifndef KEYCHAIN_H
#define KEYCHAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KC_API __attribute__((visibility("default")))

/* The seed's KeychainErrorCode, plus Linux's own; kc_code_name gives the seed's string. */
typedef enum kc_code {
    KC_OK = 0,
    KC_INVALID_ARGUMENT,
    KC_USER_CANCELED,
    KC_USER_FALLBACK,
    KC_SYSTEM_CANCELED,
    KC_AUTHENTICATION_FAILED,
    KC_LOCKOUT,
    KC_LOCKOUT_PERMANENT,
    KC_KEY_INVALIDATED,
    KC_BIOMETRY_NOT_AVAILABLE,
    KC_BIOMETRY_NOT_ENROLLED,
    KC_PASSCODE_NOT_SET,
    KC_UNSUPPORTED,
    KC_MISSING_USAGE_DESCRIPTION,
    KC_INTERACTION_NOT_ALLOWED,
    KC_DEVICE_STATE_CHANGED,
    KC_DATA_CORRUPTED,
    KC_HARDWARE_UNAVAILABLE,
    KC_STORAGE_ERROR,
    KC_INTERNAL
} kc_code;

/* When an item can be read. KC_ACCESSIBLE_DEFAULT (0): the storage's (in kc_options: the seed's
 * default, afterFirstUnlock). The names' seed strings: kc_accessible_name. */
typedef enum kc_accessible {
    KC_ACCESSIBLE_DEFAULT = 0,
    KC_ACCESSIBLE_WHEN_UNLOCKED,
    KC_ACCESSIBLE_AFTER_FIRST_UNLOCK,
    KC_ACCESSIBLE_ALWAYS,
    KC_ACCESSIBLE_WHEN_PASSCODE_SET_THIS_DEVICE_ONLY,
    KC_ACCESSIBLE_WHEN_UNLOCKED_THIS_DEVICE_ONLY,
    KC_ACCESSIBLE_AFTER_FIRST_UNLOCK_THIS_DEVICE_ONLY,
    KC_ACCESSIBLE_ALWAYS_THIS_DEVICE_ONLY
} kc_accessible;

/* What unlocks an item. KC_ACCESS_CONTROL_DEFAULT (0): the storage's (in kc_options: none). */
typedef enum kc_access_control {
    KC_ACCESS_CONTROL_DEFAULT = 0,
    KC_ACCESS_CONTROL_NONE,
    KC_ACCESS_CONTROL_BIOMETRY_ANY,
    KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET,
    KC_ACCESS_CONTROL_BIOMETRY_ANY_OR_PASSCODE,
    KC_ACCESS_CONTROL_BIOMETRY_CURRENT_SET_OR_PASSCODE,
    KC_ACCESS_CONTROL_PASSCODE
} kc_access_control;

/* Android's keyStorage: the TPM (tee, the default) or a PKCS#11 token (strongbox). */
typedef enum kc_key_storage {
    KC_KEY_STORAGE_DEFAULT = 0,
    KC_KEY_STORAGE_TEE,
    KC_KEY_STORAGE_STRONGBOX
} kc_key_storage;

/* A tri-state for booleans that may be left to the storage. */
typedef enum kc_flag { KC_FLAG_DEFAULT = 0, KC_FLAG_FALSE, KC_FLAG_TRUE } kc_flag;

/* A prompt's texts; a NULL field keeps the storage's (or the system's). */
typedef struct kc_prompt {
    const char *title;
    const char *subtitle;
    const char *description;
    const char *cancel;
} kc_prompt;

/* What keychaind asks the program during a read: the merged texts, the ways to answer (NULL-terminated
 * words: "passcode", "fingerprint"), the item, the attempt (1, 2, ...) and why the last one failed. */
typedef struct kc_prompt_request {
    kc_prompt prompt;
    const char *const *methods;
    const char *service;
    const char *key;
    unsigned attempt;
    const char *previous_failure;
} kc_prompt_request;

/* The answer a prompter gives, by one of the kc_answer_* calls below (none called: cancel). */
typedef struct kc_answer kc_answer;

/* A prompt callback, called on the thread of the read, once per question. */
typedef void (*kc_prompter)(void *context, const kc_prompt_request *request, kc_answer *answer);

/* The passcode (bytes copied into a buffer the library zeroes once sent; wipe yours). */
KC_API void kc_answer_passcode(kc_answer *answer, const void *passcode, size_t length);
/* A finger on the simulated reader: a match when it is enrolled. */
KC_API void kc_answer_finger(kc_answer *answer, const char *finger);
/* The user cancelled (USER_CANCELED), chose the fallback (USER_FALLBACK), the prompt was interrupted
 * (SYSTEM_CANCELED), or the prompt reaches no one (INTERACTION_NOT_ALLOWED, with the reason). */
KC_API void kc_answer_cancel(kc_answer *answer);
KC_API void kc_answer_fallback(kc_answer *answer);
KC_API void kc_answer_interrupted(kc_answer *answer);
KC_API void kc_answer_unavailable(kc_answer *answer, const char *reason);

/* How a storage's reads are prompted. */
typedef enum kc_prompting {
    KC_PROMPT_TERMINAL = 0, /* the controlling terminal, else the password agents (the default) */
    KC_PROMPT_CALLBACK,     /* kc_options.prompter */
    KC_PROMPT_NONE          /* no prompt: a guarded read is INTERACTION_NOT_ALLOWED */
} kc_prompting;

/* A storage's options (the seed's createKeychain); zero-initialise, then set what you need:
 * kc_options options = {0}; options.service = "vault"; ... Strings are copied by kc_storage_new. */
typedef struct kc_options {
    const char *service;              /* NULL: the application identifier (KEYCHAIN_APP_ID, the systemd unit) */
    kc_accessible accessible;         /* default afterFirstUnlock */
    kc_access_control access_control; /* default none */
    int64_t auth_validity;            /* seconds, 0 or more */
    kc_flag synchronizable;           /* default false */
    const char *access_group;         /* NULL: the default group */
    const kc_prompt *prompt;          /* NULL: the system's texts */
    kc_key_storage key_storage;       /* default tee */
    kc_prompting prompting;
    kc_prompter prompter;             /* with KC_PROMPT_CALLBACK */
    void *prompter_context;
    unsigned attempts_per_read;       /* 0: 3; at most 10 are asked */
    const char *socket;               /* NULL: KEYCHAIN_SOCKET, else /run/keychain/keychaind.sock */
} kc_options;

/* A write's own protection; zero-initialised fields keep the storage's. */
typedef struct kc_set_options {
    kc_accessible accessible;
    kc_access_control access_control;
    int64_t auth_validity;  /* used when has_auth_validity is not 0 */
    int has_auth_validity;
    const char *label;      /* NULL: none */
    kc_flag synchronizable;
} kc_set_options;

typedef struct kc_error kc_error;
typedef struct kc_storage kc_storage;
typedef struct kc_secret kc_secret;

/* The seed's string of a code ("INVALID_ARGUMENT"); "UNKNOWN" for a number that is none. */
KC_API const char *kc_code_name(kc_code code);
KC_API const char *kc_accessible_name(kc_accessible value);
KC_API const char *kc_access_control_name(kc_access_control value);

KC_API kc_code kc_error_code(const kc_error *error);
/* The library's words (UTF-8), never a secret. */
KC_API const char *kc_error_message(const kc_error *error);
/* What failed below the keychain (a TPM or SQLite code, an errno), or NULL. */
KC_API const char *kc_error_cause(const kc_error *error);
KC_API void kc_error_free(kc_error *error);

/* A storage: the options checked at once (INVALID_ARGUMENT with the seed's message); keychaind is not
 * touched. Free it with kc_storage_free once no call uses it. */
KC_API kc_code kc_storage_new(const kc_options *options, kc_storage **storage, kc_error **error);
KC_API void kc_storage_free(kc_storage *storage);
/* The storage's service (the application identifier when options.service was NULL). */
KC_API const char *kc_storage_service(const kc_storage *storage);

/* Stores value[0..length) under key (UTF-8, 1 to 1024 bytes), replacing any value; never prompts.
 * `set` may be NULL. Values up to 16 MiB. */
KC_API kc_code kc_set_item(kc_storage *storage, const char *key, const void *value, size_t length,
                           const kc_set_options *set, kc_error **error);
/* The value in a new kc_secret, or *value = NULL when there is no such item. A read behind an access
 * control prompts; `prompt` (may be NULL) is merged over the storage's texts. */
KC_API kc_code kc_get_item(kc_storage *storage, const char *key, const kc_prompt *prompt, kc_secret **value,
                           kc_error **error);
/* *found: 1 when the item exists, else 0; never prompts. */
KC_API kc_code kc_has_item(kc_storage *storage, const char *key, int *found, kc_error **error);
/* Removing an absent item is not an error. */
KC_API kc_code kc_remove_item(kc_storage *storage, const char *key, kc_error **error);
/* Removes every item of the storage's service. */
KC_API kc_code kc_clear(kc_storage *storage, kc_error **error);

KC_API const uint8_t *kc_secret_data(const kc_secret *secret);
KC_API size_t kc_secret_size(const kc_secret *secret);
/* Zeroes the bytes, then frees them. */
KC_API void kc_secret_free(kc_secret *secret);

/* The storage's keys, sorted: *keys is a NULL-terminated array, *count its length; kc_strings_free. */
KC_API kc_code kc_get_all_keys(kc_storage *storage, char ***keys, size_t *count, kc_error **error);
KC_API void kc_strings_free(char **strings);

/* What is known of an item without reading its value. */
typedef struct kc_item_info {
    char *key;
    char *service;
    kc_accessible accessible;
    kc_access_control access_control;
    char *label;           /* NULL: none */
    double created;        /* seconds since 1970-01-01 UTC */
    double modified;
    char *security_level;  /* "hardwareTPM", "softwareTPM" or "pkcs11Token" */
    char *token;           /* NULL unless on a token */
} kc_item_info;

/* *info = NULL when there is no such item; kc_item_info_free. */
KC_API kc_code kc_get_item_info(kc_storage *storage, const char *key, kc_item_info **info, kc_error **error);
KC_API void kc_item_info_free(kc_item_info *info);

/* Whether the device can protect an item with an access control now, and why not: "notAvailable",
 * "notEnrolled", "passcodeNotSet", "unsupported", or "noPrompt" (the device can, the storage's prompt
 * reaches no one); reason is "" when available. */
typedef struct kc_access_control_check {
    int available;
    char reason[64];
} kc_access_control_check;

/* The storage's device, for this storage's prompting; never prompts, never writes. */
KC_API kc_code kc_storage_can_use_access_control(kc_storage *storage, kc_access_control value,
                                                 kc_access_control_check *check, kc_error **error);
/* The device's answer without a storage (socket NULL: as kc_options.socket), the terminal as prompter. */
KC_API kc_code kc_can_use_access_control(const char *socket, kc_access_control value, kc_access_control_check *check,
                                         kc_error **error);

#ifdef __cplusplus
}
#endif

#endif
