import KeychainctlFull

await KeychainctlFull.main()
