// The token tests' PKCS#11 module exports only C_GetFunctionList (refusing_token.c); nothing here for Swift.
