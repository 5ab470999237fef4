import KeychainBasics
/// The changes of one `Store.write` body. Valid only inside that body and on
/// its thread; using it afterwards throws instead of touching the database.
public final class Transaction {
    private var connection: Connection?

    init(_ connection: Connection) {
        self.connection = connection
    }

    func close() {
        connection = nil
    }

    @inline(__always)
    private func open() throws(StoreError) -> Connection {
        guard let connection else {
            throw StoreError(
                kind: .sqlite, path: "",
                message: "a store Transaction was used after its write block ended")
        }
        return connection
    }

    // MARK: Reads (they see this transaction's own changes)

    public func meta(_ name: String) throws(StoreError) -> [UInt8]? {
        try open().meta(name)
    }

    public func item(service: String, key: String) throws(StoreError) -> ItemRecord? {
        try open().item(service: service, key: key)
    }

    public func hasItem(service: String, key: String) throws(StoreError) -> Bool {
        try open().hasItem(service: service, key: key)
    }

    public func keys(service: String) throws(StoreError) -> [String] {
        try open().keys(service: service)
    }

    public func services() throws(StoreError) -> [String] {
        try open().services()
    }

    public func itemCount(service: String, protection: String) throws(StoreError) -> Int {
        try open().itemCount(service: service, protection: protection)
    }

    public func items(protection: String) throws(StoreError) -> [ItemRecord] {
        try open().items(protection: protection)
    }

    public func wrappingKey(service: String, protection: String) throws(StoreError) -> WrappingKeyRecord? {
        try open().wrappingKey(service: service, protection: protection)
    }

    public func wrappingKeys(service: String) throws(StoreError) -> [WrappingKeyRecord] {
        try open().wrappingKeys(service: service)
    }

    public func wrappingKeys(whereProtectionHasPrefix prefix: String) throws(StoreError) -> [WrappingKeyRecord] {
        try open().wrappingKeys(protectionPrefix: prefix)
    }

    /// What the services that start with any of `prefixes` hold, this transaction's changes included.
    public func usage(servicePrefixes prefixes: [String]) throws(StoreError) -> StoreUsage {
        try open().usage(servicePrefixes: prefixes)
    }

    // MARK: Writes

    /// Inserts the item, or replaces the one with the same service and key.
    /// - Throws: `invalidName` for a name out of `ItemNames`' bounds (a backup could not carry it).
    public func putItem(_ record: ItemRecord) throws(StoreError) {
        if let problem = ItemNames.problem(service: record.service, key: record.key, label: record.label) {
            throw StoreError(kind: .invalidName, path: "", message: problem)
        }
        try open().putItem(record)
    }

    /// True if an item was deleted.
    @discardableResult
    public func deleteItem(service: String, key: String) throws(StoreError) -> Bool {
        try open().deleteItem(service: service, key: key)
    }

    /// How many items were deleted.
    @discardableResult
    public func deleteItems(service: String) throws(StoreError) -> Int {
        try open().deleteItems(service: service)
    }

    /// How many items were deleted, across all services.
    @discardableResult
    public func deleteItems(protection: String) throws(StoreError) -> Int {
        try open().deleteItems(protection: protection)
    }

    /// Inserts the wrapping key, or replaces the one with the same service and protection.
    public func putWrappingKey(_ record: WrappingKeyRecord) throws(StoreError) {
        try open().putWrappingKey(record)
    }

    @discardableResult
    public func deleteWrappingKey(service: String, protection: String) throws(StoreError) -> Bool {
        try open().deleteWrappingKey(service: service, protection: protection)
    }

    @discardableResult
    public func deleteWrappingKeys(service: String) throws(StoreError) -> Int {
        try open().deleteWrappingKeys(service: service)
    }

    @discardableResult
    public func deleteWrappingKeys(protection: String) throws(StoreError) -> Int {
        try open().deleteWrappingKeys(protection: protection)
    }

    public func setMeta(_ name: String, _ value: [UInt8]) throws(StoreError) {
        try open().setMeta(name, value)
    }

    @discardableResult
    public func deleteMeta(_ name: String) throws(StoreError) -> Bool {
        try open().deleteMeta(name)
    }
}
