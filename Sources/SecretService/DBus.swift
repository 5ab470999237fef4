// The bus, its values and the session crypto live in the DBus module, which the keychain's own
// desktop prompt (gcr's system prompter) shares; the provider's code and its clients see them here.
@_exported import DBus
