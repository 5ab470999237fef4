import KeychainctlFront

keychainctlMain()
