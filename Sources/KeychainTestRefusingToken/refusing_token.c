// A PKCS#11 module for the project's token tests: every call goes to SoftHSM2's module, except that a
// key generation whose template carries an attribute named in KEYCHAIN_TEST_TOKEN_REFUSES is refused,
// as tokens refuse what they do not support (tpm2-pkcs11's "attr mismatch", CKR_GENERAL_ERROR; a
// smart card's CKR_ATTRIBUTE_TYPE_INVALID), and one named in KEYCHAIN_TEST_TOKEN_IGNORES is taken out
// of the template before SoftHSM2 sees it (a token that makes the key without it, saying nothing).
//
//   KEYCHAIN_TEST_TOKEN_REFUSES       attribute names, comma-separated ("CKA_WRAP,CKA_SENSITIVE")
//   KEYCHAIN_TEST_TOKEN_REFUSES_WITH  the return value: CKR_ATTRIBUTE_TYPE_INVALID (default),
//                                     CKR_TEMPLATE_INCONSISTENT, CKR_ATTRIBUTE_VALUE_INVALID, CKR_GENERAL_ERROR
//   KEYCHAIN_TEST_TOKEN_IGNORES       attribute names, comma-separated
//   KEYCHAIN_TEST_TOKEN_MODULE        the module forwarded to (default /usr/lib/softhsm/libsofthsm2.so)
//
// The environment is read in C_GetFunctionList: each keychainctl a test runs is configured by its own.
#include <dlfcn.h>
#include <p11-kit/pkcs11.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LISTED 16

static const struct { const char *name; CK_ATTRIBUTE_TYPE type; } attribute_names[] = {
    {"CKA_CLASS", CKA_CLASS}, {"CKA_TOKEN", CKA_TOKEN}, {"CKA_PRIVATE", CKA_PRIVATE}, {"CKA_LABEL", CKA_LABEL},
    {"CKA_KEY_TYPE", CKA_KEY_TYPE}, {"CKA_ID", CKA_ID}, {"CKA_SENSITIVE", CKA_SENSITIVE}, {"CKA_ENCRYPT", CKA_ENCRYPT},
    {"CKA_DECRYPT", CKA_DECRYPT}, {"CKA_WRAP", CKA_WRAP}, {"CKA_UNWRAP", CKA_UNWRAP}, {"CKA_SIGN", CKA_SIGN},
    {"CKA_VERIFY", CKA_VERIFY}, {"CKA_DERIVE", CKA_DERIVE}, {"CKA_MODULUS_BITS", CKA_MODULUS_BITS},
    {"CKA_PUBLIC_EXPONENT", CKA_PUBLIC_EXPONENT}, {"CKA_VALUE_LEN", CKA_VALUE_LEN}, {"CKA_EXTRACTABLE", CKA_EXTRACTABLE},
    {"CKA_MODIFIABLE", CKA_MODIFIABLE}, {"CKA_EC_PARAMS", CKA_EC_PARAMS},
};

static const struct { const char *name; CK_RV rv; } return_values[] = {
    {"CKR_ATTRIBUTE_TYPE_INVALID", CKR_ATTRIBUTE_TYPE_INVALID}, {"CKR_TEMPLATE_INCONSISTENT", CKR_TEMPLATE_INCONSISTENT},
    {"CKR_ATTRIBUTE_VALUE_INVALID", CKR_ATTRIBUTE_VALUE_INVALID}, {"CKR_GENERAL_ERROR", CKR_GENERAL_ERROR},
};

static CK_FUNCTION_LIST forwarded, offered;
static CK_ATTRIBUTE_TYPE refused[MAX_LISTED], ignored[MAX_LISTED];
static size_t refused_count, ignored_count;
static CK_RV refusal = CKR_ATTRIBUTE_TYPE_INVALID;

// The attribute types named in `variable` into `types`; an unknown name fails the module's load.
static int read_list(const char *variable, CK_ATTRIBUTE_TYPE *types, size_t *count) {
    const char *value = getenv(variable);
    *count = 0;
    if (value == NULL) return 1;
    char *copy = strdup(value), *rest = copy, *name;
    int ok = copy != NULL;
    while (ok && (name = strsep(&rest, ",")) != NULL) {
        if (*name == '\0') continue;
        size_t i = 0;
        while (i < sizeof attribute_names / sizeof *attribute_names && strcmp(attribute_names[i].name, name) != 0) i++;
        ok = i < sizeof attribute_names / sizeof *attribute_names && *count < MAX_LISTED;
        if (ok) types[(*count)++] = attribute_names[i].type;
    }
    free(copy);
    return ok;
}

static int listed(CK_ATTRIBUTE_TYPE type, const CK_ATTRIBUTE_TYPE *types, size_t count) {
    for (size_t i = 0; i < count; i++) if (types[i] == type) return 1;
    return 0;
}

static int carries_refused(const CK_ATTRIBUTE *template, CK_ULONG count) {
    for (CK_ULONG i = 0; i < count; i++) if (listed(template[i].type, refused, refused_count)) return 1;
    return 0;
}

// `template` without the ignored attributes, in `kept` (at most `count` entries); their number.
static CK_ULONG without_ignored(const CK_ATTRIBUTE *template, CK_ULONG count, CK_ATTRIBUTE *kept) {
    CK_ULONG n = 0;
    for (CK_ULONG i = 0; i < count; i++) if (!listed(template[i].type, ignored, ignored_count)) kept[n++] = template[i];
    return n;
}

static CK_RV generate_key(CK_SESSION_HANDLE session, CK_MECHANISM_PTR mechanism, CK_ATTRIBUTE_PTR template,
                          CK_ULONG count, CK_OBJECT_HANDLE_PTR key) {
    if (carries_refused(template, count)) return refusal;
    CK_ATTRIBUTE kept[count + 1];
    return forwarded.C_GenerateKey(session, mechanism, kept, without_ignored(template, count, kept), key);
}

static CK_RV generate_key_pair(CK_SESSION_HANDLE session, CK_MECHANISM_PTR mechanism, CK_ATTRIBUTE_PTR public_template,
                               CK_ULONG public_count, CK_ATTRIBUTE_PTR private_template, CK_ULONG private_count,
                               CK_OBJECT_HANDLE_PTR public_key, CK_OBJECT_HANDLE_PTR private_key) {
    if (carries_refused(public_template, public_count) || carries_refused(private_template, private_count)) return refusal;
    CK_ATTRIBUTE public_kept[public_count + 1], private_kept[private_count + 1];
    return forwarded.C_GenerateKeyPair(session, mechanism, public_kept, without_ignored(public_template, public_count, public_kept),
                                       private_kept, without_ignored(private_template, private_count, private_kept),
                                       public_key, private_key);
}

CK_RV C_GetFunctionList(CK_FUNCTION_LIST_PTR_PTR list) {
    if (list == NULL) return CKR_ARGUMENTS_BAD;
    if (!read_list("KEYCHAIN_TEST_TOKEN_REFUSES", refused, &refused_count)
        || !read_list("KEYCHAIN_TEST_TOKEN_IGNORES", ignored, &ignored_count)) return CKR_ARGUMENTS_BAD;
    const char *with = getenv("KEYCHAIN_TEST_TOKEN_REFUSES_WITH");
    if (with != NULL) {
        size_t i = 0;
        while (i < sizeof return_values / sizeof *return_values && strcmp(return_values[i].name, with) != 0) i++;
        if (i == sizeof return_values / sizeof *return_values) return CKR_ARGUMENTS_BAD;
        refusal = return_values[i].rv;
    }
    const char *path = getenv("KEYCHAIN_TEST_TOKEN_MODULE");
    void *module = dlopen(path != NULL ? path : "/usr/lib/softhsm/libsofthsm2.so", RTLD_NOW | RTLD_LOCAL);
    if (module == NULL) return CKR_GENERAL_ERROR;
    CK_C_GetFunctionList get = (CK_C_GetFunctionList)dlsym(module, "C_GetFunctionList");
    CK_FUNCTION_LIST_PTR functions = NULL;
    if (get == NULL || get(&functions) != CKR_OK || functions == NULL) return CKR_GENERAL_ERROR;
    forwarded = *functions;
    offered = forwarded;
    offered.C_GetFunctionList = C_GetFunctionList;
    offered.C_GenerateKey = generate_key;
    offered.C_GenerateKeyPair = generate_key_pair;
    *list = &offered;
    return CKR_OK;
}
