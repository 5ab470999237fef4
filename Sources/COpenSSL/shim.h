#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/bn.h>
#include <openssl/obj_mac.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <openssl/crypto.h>
#include <openssl/provider.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/pem.h>
#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>
#include <openssl/err.h>

// Macros Swift cannot import (expressions of other macros).
static const int KC_EVP_PKEY_PUBLIC_KEY = EVP_PKEY_PUBLIC_KEY;

// The builder keeps each name's pointer until OSSL_PARAM_BLD_to_param: a Swift string literal passed
// as `const char *` is a temporary, so the names are pushed from here.
static inline int KC_OSSL_PARAM_BLD_push_rsa_public(OSSL_PARAM_BLD *builder, const BIGNUM *n, const BIGNUM *e) {
    return OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_N, n) == 1
        && OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_E, e) == 1;
}
