/* A secret kept behind the device passcode: stored, then read back after the passcode is typed on the terminal.
 *
 *   cc example.c $(pkg-config --cflags --libs keychain) -o example
 *   printf 'r-123' | ./example          (KEYCHAIN_SOCKET: keychaind's socket, when not the system's)
 *
 * The value comes on stdin, never in argv (where ps shows it). */
#include <keychain.h>

#include <stdio.h>
#include <string.h>

static int failed(const char *what, kc_error *error) {
    fprintf(stderr, "%s: %s: %s\n", what, kc_code_name(kc_error_code(error)), kc_error_message(error));
    if (kc_error_cause(error)) fprintf(stderr, "  cause: %s\n", kc_error_cause(error));
    kc_error_free(error);
    return 1;
}

int main(void) {
    char value[4096];
    size_t length = fread(value, 1, sizeof value, stdin);

    kc_prompt texts = {.title = "Unlock the example's refresh token", .cancel = "Leave it locked"};
    kc_options options = {
        .service = "org.example.vault",
        .accessible = KC_ACCESSIBLE_WHEN_UNLOCKED_THIS_DEVICE_ONLY,
        .access_control = KC_ACCESS_CONTROL_PASSCODE,
        .prompt = &texts,  /* prompting: the terminal (the default) */
    };
    kc_storage *vault = NULL;
    kc_error *error = NULL;
    if (kc_storage_new(&options, &vault, &error)) return failed("createKeychain", error);

    kc_code code = kc_set_item(vault, "refreshToken", value, length, NULL, &error);  /* never prompts */
    memset(value, 0, sizeof value);
    if (code) return kc_storage_free(vault), failed("setItem", error);

    kc_secret *secret = NULL;
    if (kc_get_item(vault, "refreshToken", NULL, &secret, &error)) return kc_storage_free(vault), failed("getItem", error);
    if (secret) printf("%.*s\n", (int)kc_secret_size(secret), (const char *)kc_secret_data(secret));
    kc_secret_free(secret);  /* zeroed, then freed */

    kc_item_info *info = NULL;
    if (kc_get_item_info(vault, "refreshToken", &info, &error)) return kc_storage_free(vault), failed("getItemInfo", error);
    if (info) printf("%s %s %s\n", kc_accessible_name(info->accessible), kc_access_control_name(info->access_control),
                     info->security_level);
    kc_item_info_free(info);
    kc_storage_free(vault);
    return 0;
}
