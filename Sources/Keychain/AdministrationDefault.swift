import KeychainCore
import KeychainEngine

extension KeychainAdministration {
    /// The store of `configuration`, opened in this process.
    /// - Throws: `UNSUPPORTED` for a configuration that reaches the store through keychaind (its store
    ///   is the service's: run where it is, as the service's user); the configuration's refusal of the
    ///   store's engine (another setting than the engine's in this process) as a storage would.
    public init(configuration: KeychainConfiguration = .default) throws(KeychainError) {
        try self.init(opening: configuration)
    }
}
