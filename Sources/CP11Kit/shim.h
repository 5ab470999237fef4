#ifndef KEYCHAIN_CP11KIT_SHIM_H
#define KEYCHAIN_CP11KIT_SHIM_H
#include <p11-kit/p11-kit.h>
#include <p11-kit/uri.h>
#include <p11-kit/pkcs11.h>
#endif
