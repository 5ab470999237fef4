import Synchronization

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
    /// Which backend holds the secret half: the engine reads it this way, never from a name.
    public enum Backend: String, Sendable, Hashable {
        case tpm, token
        /// Written by a newer version: never opened as something else.
        case unknown
    }
    public var backend: Backend
    /// The token envelope's format (0 for a TPM key); its meaning is the token backend's.
    public var tokenFormat: Int64
    /// The label of the token that holds the key, as it was when the key was made.
    public var token: String?
    /// The token's part of the secret, sealed by the token; `sealedPublic`/`sealedPrivate`/`policy`
    /// hold the TPM's part, when there is one.
    public var tokenSealed: [UInt8]

    public init(
        service: String, protection: String, publicKey: [UInt8],
        sealedPublic: [UInt8], sealedPrivate: [UInt8], policy: [UInt8] = [], created: Int64,
        backend: Backend = .tpm, tokenFormat: Int64 = 0, token: String? = nil, tokenSealed: [UInt8] = []
    ) {
        self.backend = backend
        self.tokenFormat = tokenFormat
        self.token = token
        self.tokenSealed = tokenSealed
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

/// What a namespace holds in the store (`Store.usage(servicePrefixes:)`): its items, and the bytes of
/// their stored fields and of its wrapping keys (SQLite's own page overhead not counted).
public struct StoreUsage: Sendable, Equatable {
    public var items: Int
    public var bytes: Int

    #if DEBUG
    /// The namespace scans (`usage`) this process made: keychaind's quota costs one per write
    /// (`QuotaScanTests` counts them).
    package static let scans = Atomic<Int>(0)
    #endif

    public init(items: Int, bytes: Int) {
        self.items = items
        self.bytes = bytes
    }

    /// The bytes one item record takes in `usage`: the same fields, measured before it is written.
    public static func bytes(of record: ItemRecord) -> Int {
        record.service.utf8.count + record.key.utf8.count + (record.label?.utf8.count ?? 0) + record.writerPublic.count
            + record.salt.count + record.nonce.count + record.ciphertext.count
    }

    /// The bytes one wrapping key takes in `usage`.
    public static func bytes(of record: WrappingKeyRecord) -> Int {
        record.service.utf8.count + record.protection.utf8.count + record.publicKey.count + record.sealedPublic.count
            + record.sealedPrivate.count + record.policy.count + record.tokenSealed.count
    }
}
