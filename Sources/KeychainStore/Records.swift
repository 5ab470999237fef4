/// One row of `wrapping_keys`: the sealed key pair that wraps a service's items
/// for one protection level.
public struct WrappingKeyRecord: Sendable, Equatable, Hashable {
    public var service: String
    public var protection: String
    public var publicKey: [UInt8]
    public var sealedPublic: [UInt8]
    public var sealedPrivate: [UInt8]
    /// The encoded TPM policy the private key was sealed under (opaque to the store).
    public var policy: [UInt8]
    /// Milliseconds since the Unix epoch.
    public var created: Int64

    public init(
        service: String, protection: String, publicKey: [UInt8],
        sealedPublic: [UInt8], sealedPrivate: [UInt8], policy: [UInt8] = [], created: Int64
    ) {
        self.service = service
        self.protection = protection
        self.publicKey = publicKey
        self.sealedPublic = sealedPublic
        self.sealedPrivate = sealedPrivate
        self.policy = policy
        self.created = created
    }
}

/// One row of `items`: an encrypted secret and what is needed to open it.
public struct ItemRecord: Sendable, Equatable, Hashable {
    public var service: String
    public var key: String
    public var protection: String
    public var label: String?
    /// Milliseconds since the Unix epoch.
    public var created: Int64
    /// Milliseconds since the Unix epoch.
    public var modified: Int64
    public var writerPublic: [UInt8]
    public var salt: [UInt8]
    public var nonce: [UInt8]
    public var ciphertext: [UInt8]

    public init(
        service: String, key: String, protection: String, label: String? = nil,
        created: Int64, modified: Int64,
        writerPublic: [UInt8], salt: [UInt8], nonce: [UInt8], ciphertext: [UInt8]
    ) {
        self.service = service
        self.key = key
        self.protection = protection
        self.label = label
        self.created = created
        self.modified = modified
        self.writerPublic = writerPublic
        self.salt = salt
        self.nonce = nonce
        self.ciphertext = ciphertext
    }
}
