import KeychainWire

/// One storage's calls: its scope, its service and its options, checked once, where it is made.
package struct StorageRef: Sendable {
    package let scope: ItemScope
    /// The service as the caller names it (the options' service, or the application identifier).
    package let service: String
    /// The options, validated (their service as given: nil for the default one).
    package let options: KeychainOptions
    /// The service's name in the store (`ItemScope.storeName`).
    package let storeName: String
    /// The options as keychaind's requests carry them, encoded once (empty when no daemon is asked).
    package let wireOptions: [UInt8]

    /// - Parameter defaultService: the service when the options name none (the application identifier).
    /// - Throws: `INVALID_ARGUMENT` with the seed's message for options that break a rule, or for no
    ///   service at all.
    package init(scope: ItemScope, options: KeychainOptions, defaultService: String?, forWire: Bool = false) throws(KeychainError) {
        self.options = try options.validated()
        guard let service = options.service ?? defaultService else { throw ApplicationIdentity.missing }
        if options.service == nil { _ = try KeychainOptions(service: service).validated() }  // a bad KEYCHAIN_APP_ID
        self.scope = scope
        self.service = service
        storeName = try scope.storeName(service)
        var resolved = self.options
        resolved.service = service
        var wire = resolved.wire
        if options.service == nil { wire.serviceIsDefault = true }
        wireOptions = forWire ? wire.encoded() : []
    }
}
