import KeychainCore
import Glibc
import KeychainBasics
import SecureMemory
import TPM2

/// One item as a backup carries it: everything `setItem` needs to write it again, and its dates.
struct BackupItem {
    var service: String
    var key: String
    var accessible: Accessible
    var accessControl: AccessControl
    var authValidity: Int
    var label: String?
    /// Milliseconds since the Unix epoch, as the store keeps them.
    var created: Int64
    var modified: Int64
    var value: SecureBytes
}

/// The passphrase backup file, format 1 (docs/formats.md). A 96-byte header in clear, then
/// `crypto_secretstream_xchacha20poly1305` chunks, each `[u32 length][chunk]`: a start chunk whose
/// associated data is the header (so every header byte is authenticated), one chunk per item, and
/// an end chunk (tag FINAL) holding the item count. The stream's chained nonces make any reordered,
/// dropped, repeated or truncated chunk fail; nothing may follow the final one.
///
/// The key: Argon2id(passphrase, salt, opslimit, memlimit) → 32-byte master; the stream key and the
/// key check are keyed BLAKE2b of it over two labels. The check tells a wrong passphrase
/// (`AUTHENTICATION_FAILED`) from a changed file (`DATA_CORRUPTED`).
enum BackupFile {
    static let magic = Array("KCBACKUP".utf8)
    static let version: UInt16 = 1
    static let kindPassphrase: UInt8 = 1
    /// The master key sealed to one device's TPM as a provisioning bundle (`backup --to IDENTITY`).
    static let kindSealed: UInt8 = 2
    /// libsodium's `crypto_pwhash_ALG_ARGON2ID13`.
    static let argon2id13: UInt8 = 2
    static let headerLength = 96
    static let checkLength = 32

    /// The largest chunk a reader accepts: a 16 MiB value with its fields, sealed.
    static let maxChunk = Engine.maxValueLength + 3 * 65_536 + 64
    /// What a reader accepts from a file before it spends memory and time on Argon2id.
    static let maxMemLimit: UInt64 = 4 << 30
    static let maxOpsLimit: UInt64 = 64

    enum ChunkType: UInt8 { case start = 1, item = 2, end = 3 }

    struct Header {
        var opsLimit: UInt64 = 0
        var memLimit: UInt64 = 0
        var salt: [UInt8] = []
        /// Kind 2: the provisioning bundle (JSON) that carries the master key.
        var sealedKey: [UInt8]?
        var check: [UInt8]
        var streamHeader: [UInt8]

        var bytes: [UInt8] {
            if let sealedKey {
                return magic + version.bigEndianBytes + [kindSealed, 0] + UInt32(sealedKey.count).bigEndianBytes + sealedKey
                    + check + streamHeader
            }
            var out = magic + version.bigEndianBytes + [kindPassphrase, argon2id13]
            out += UInt32(opsLimit).bigEndianBytes + memLimit.bigEndianBytes + salt + check + streamHeader
            return out
        }

        static let maxSealedKey = 1 << 16

        /// How many bytes the header has, from its first 16 (kind 2 carries the bundle's length).
        static func length(prefix bytes: [UInt8]) throws(KeychainError) -> Int {
            guard bytes.count == 16, Array(bytes[0..<8]) == magic else {
                throw KeychainError(.dataCorrupted, "This is not a keychain backup (no KCBACKUP header)")
            }
            guard bytes[10] == kindSealed else { return headerLength }
            let n = Int(bytes[12..<16].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
            guard n <= maxSealedKey else { throw KeychainError(.dataCorrupted, "This backup's sealed key is \(n) bytes long") }
            return 16 + n + checkLength + Sodium.secretStreamHeaderLength
        }

        static func parse(_ bytes: [UInt8]) throws(KeychainError) -> Header {
            guard bytes.count >= 16, Array(bytes[0..<8]) == magic else {
                throw KeychainError(.dataCorrupted, "This is not a keychain backup (no KCBACKUP header)")
            }
            let version = UInt16(bytes[8]) << 8 | UInt16(bytes[9])
            guard version == BackupFile.version else {
                throw KeychainError(.unsupported, "This backup is in format \(version); this keychainctl reads format \(BackupFile.version): restore it with a newer one")
            }
            if bytes[10] == kindSealed, bytes[11] == 0, bytes.count == (try length(prefix: Array(bytes.prefix(16)))) {
                let end = bytes.count - checkLength - Sodium.secretStreamHeaderLength
                return Header(sealedKey: Array(bytes[16..<end]), check: Array(bytes[end..<(end + checkLength)]),
                              streamHeader: Array(bytes.suffix(Sodium.secretStreamHeaderLength)))
            }
            guard bytes[10] == kindPassphrase, bytes[11] == argon2id13, bytes.count == headerLength else {
                throw KeychainError(.unsupported, "This backup is protected in a way this keychainctl does not read (kind \(bytes[10]), KDF \(bytes[11]))")
            }
            let ops = UInt64(bytes[12..<16].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
            let mem = bytes[16..<24].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            guard Sodium.argon2idOpsLimits.contains(ops), ops <= maxOpsLimit,
                  Sodium.argon2idMemLimits.contains(mem), mem <= maxMemLimit else {
                throw KeychainError(.dataCorrupted, "This backup's Argon2id parameters (opslimit \(ops), memlimit \(mem) bytes) are "
                                    + "outside what a restore accepts (opslimit ≤ \(maxOpsLimit), memlimit 8 KiB to 4 GiB)")
            }
            return Header(opsLimit: ops, memLimit: mem, salt: Array(bytes[24..<40]), check: Array(bytes[40..<72]),
                          streamHeader: Array(bytes[72..<96]))
        }
    }

    /// The master key from the passphrase (Argon2id).
    static func master(passphrase: SecureBytes, salt: [UInt8], opsLimit: UInt64, memLimit: UInt64) throws(KeychainError) -> SecureBytes {
        do {
            return try Sodium.argon2id(passphrase: passphrase, salt: salt, opsLimit: opsLimit, memLimit: memLimit)
        } catch {
            throw KeychainError(.internal, "Argon2id failed: \(error) (memlimit \(memLimit) bytes)")
        }
    }

    /// The stream key and the key check from the master key.
    static func keys(master: SecureBytes) -> (stream: SecureBytes, check: [UInt8]) {
        let stream = Sodium.blake2b(key: master, message: Array("keychain-linux backup stream v1".utf8))
        let check = Sodium.blake2b(key: master, message: Array("keychain-linux backup check v1".utf8))
        return (stream, check.withUnsafeBytes { Array($0) })
    }

    // MARK: Chunk bodies

    static func startBody(created: Int64) -> SecureBytes {
        SecureBytes(copying: [ChunkType.start.rawValue] + UInt64(bitPattern: created).bigEndianBytes)
    }

    static func endBody(count: UInt64) -> SecureBytes {
        SecureBytes(copying: [ChunkType.end.rawValue] + count.bigEndianBytes)
    }

    static func itemBody(_ item: BackupItem) -> SecureBytes {
        var fields: [UInt8] = [ChunkType.item.rawValue]
        func text(_ s: String) { fields += UInt32(s.utf8.count).bigEndianBytes + Array(s.utf8) }
        text(item.service)
        text(item.key)
        text(item.accessible.rawValue)
        text(item.accessControl.rawValue)
        fields += UInt32(clamping: item.authValidity).bigEndianBytes
        if let label = item.label { fields.append(1); text(label) } else { fields.append(0) }
        fields += UInt64(bitPattern: item.created).bigEndianBytes + UInt64(bitPattern: item.modified).bigEndianBytes
        fields += UInt32(item.value.count).bigEndianBytes
        let body = SecureBytes(count: fields.count + item.value.count)
        body.withUnsafeMutableBytes { out in
            out.copyBytes(from: fields)
            item.value.withUnsafeBytes { UnsafeMutableRawBufferPointer(rebasing: out[fields.count...]).copyMemory(from: $0) }
        }
        return body
    }

    enum Body {
        case start(created: Int64)
        case item(BackupItem)
        case end(count: UInt64)
    }

    /// Reads an authenticated chunk's body. A body that does not parse was still sealed with this
    /// passphrase: a writer's bug or a forger who knows it; either way the file is not restored.
    static func parse(_ body: SecureBytes) throws(KeychainError) -> Body {
        let parsed: Body? = body.withUnsafeBytes { raw -> Body? in
            var cursor = Cursor(raw: raw)
            guard let type = cursor.byte().flatMap(ChunkType.init(rawValue:)) else { return nil }
            switch type {
            case .start:
                guard let created = cursor.u64(), cursor.atEnd else { return nil }
                return .start(created: Int64(bitPattern: created))
            case .end:
                guard let count = cursor.u64(), cursor.atEnd else { return nil }
                return .end(count: count)
            case .item:
                // Names are bounded by the chunk here and checked by ItemNames at restore, item by item:
                // one name a backup of an older version carried must not refuse the whole file.
                guard let service = cursor.text(max: maxChunk), let key = cursor.text(max: maxChunk),
                      let accessible = cursor.text(max: 64).flatMap(Accessible.init(rawValue:)),
                      let accessControl = cursor.text(max: 64).flatMap(AccessControl.init(rawValue:)),
                      let window = cursor.u32(), let hasLabel = cursor.byte(), hasLabel <= 1 else { return nil }
                var label: String?
                if hasLabel == 1 { guard let text = cursor.text(max: maxChunk) else { return nil }; label = text }
                guard let created = cursor.u64(), let modified = cursor.u64(), let length = cursor.u32(),
                      let value = cursor.bytes(Int(length)), cursor.atEnd else { return nil }
                return .item(BackupItem(service: service, key: key, accessible: accessible, accessControl: accessControl,
                                        authValidity: Int(window), label: label, created: Int64(bitPattern: created),
                                        modified: Int64(bitPattern: modified), value: SecureBytes(copying: value)))
            }
        }
        guard let parsed else {
            throw KeychainError(.dataCorrupted, "A chunk of this backup passed authentication but does not parse: it was not written by this keychain")
        }
        return parsed
    }

    private struct Cursor {
        let raw: UnsafeRawBufferPointer
        var offset = 0
        var atEnd: Bool { offset == raw.count }

        mutating func bytes(_ n: Int) -> UnsafeRawBufferPointer.SubSequence? {
            guard n >= 0, raw.count - offset >= n else { return nil }
            defer { offset += n }
            return raw[offset..<(offset + n)]
        }
        mutating func byte() -> UInt8? { bytes(1)?.first }
        mutating func u32() -> UInt32? { bytes(4)?.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
        mutating func u64() -> UInt64? { bytes(8)?.reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }
        mutating func text(max: Int) -> String? {
            guard let n = u32(), n <= max, let b = bytes(Int(n)) else { return nil }
            return String(validating: b, as: UTF8.self)
        }
    }
}

/// Writes a backup to a file descriptor, one chunk per item: memory holds one item at a time.
final class BackupWriter {
    private let fd: Int32
    private let stream: SecretStreamPush
    private(set) var count: UInt64 = 0

    convenience init(fd: Int32, passphrase: SecureBytes, opsLimit: UInt64, memLimit: UInt64) throws(KeychainError) {
        let salt = Sodium.randomBytes(Sodium.argon2idSaltLength)
        let master = try BackupFile.master(passphrase: passphrase, salt: salt, opsLimit: opsLimit, memLimit: memLimit)
        try self.init(fd: fd, master: master, header: BackupFile.Header(opsLimit: opsLimit, memLimit: memLimit, salt: salt,
                                                                         check: [], streamHeader: []))
    }

    /// `header`'s check and stream header are filled in here.
    init(fd: Int32, master: SecureBytes, header template: BackupFile.Header) throws(KeychainError) {
        self.fd = fd
        let keys = BackupFile.keys(master: master)
        stream = SecretStreamPush(key: keys.stream)
        var header = template
        header.check = keys.check
        header.streamHeader = stream.header
        let bytes = header.bytes
        try write(bytes)
        try chunk(BackupFile.startBody(created: Engine.now()), associatedData: bytes, final: false)
    }

    func append(_ item: BackupItem) throws(KeychainError) {
        try chunk(BackupFile.itemBody(item), associatedData: [], final: false)
        count += 1
    }

    func finish() throws(KeychainError) {
        try chunk(BackupFile.endBody(count: count), associatedData: [], final: true)
    }

    private func chunk(_ body: SecureBytes, associatedData: [UInt8], final: Bool) throws(KeychainError) {
        let sealed = stream.push(body, associatedData: associatedData, final: final)
        try write(UInt32(sealed.count).bigEndianBytes + sealed)
    }

    private func write(_ bytes: [UInt8]) throws(KeychainError) {
        var offset = 0
        while offset < bytes.count {
            switch valueOrErrno({ bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) } }) {
            case .success(let n) where n > 0: offset += n
            case .success: throw KeychainError(.storageError, "Cannot write the backup", underlying: .errno(errno))
            case .failure(let code): throw KeychainError(.storageError, "Cannot write the backup", underlying: .errno(code.rawValue))
            }
        }
    }
}

/// Reads a backup from a file descriptor, chunk by chunk, each authenticated before it is parsed.
final class BackupReader {
    private let fd: Int32
    let header: BackupFile.Header
    private let headerBytes: [UInt8]
    private let key: SecureBytes
    private var stream: SecretStreamPull
    private var started = false

    /// Reads the header and derives the key (Argon2id: the costly step, done once per file).
    /// - Throws: `AUTHENTICATION_FAILED` for a wrong passphrase; `DATA_CORRUPTED` for a file that is not a backup.
    convenience init(fd: Int32, passphrase: SecureBytes) throws(KeychainError) {
        let (header, bytes) = try Self.header(fd)
        guard header.sealedKey == nil else {
            throw KeychainError.invalidArgument("This backup is sealed to a device's TPM, not to a passphrase: restore it on that device without --passphrase-stdin")
        }
        let master = try BackupFile.master(passphrase: passphrase, salt: header.salt, opsLimit: header.opsLimit, memLimit: header.memLimit)
        try self.init(fd: fd, header: header, headerBytes: bytes, master: master)
    }

    /// The header, read from the start of `fd`.
    static func header(_ fd: Int32) throws(KeychainError) -> (BackupFile.Header, [UInt8]) {
        let prefix = try read(fd, 16, what: "header")
        let bytes = prefix + (try read(fd, try BackupFile.Header.length(prefix: prefix) - 16, what: "header"))
        return (try BackupFile.Header.parse(bytes), bytes)
    }

    /// - Throws: `AUTHENTICATION_FAILED` (passphrase) or `DATA_CORRUPTED` (sealed key) when `master` is not the file's.
    init(fd: Int32, header: BackupFile.Header, headerBytes bytes: [UInt8], master: SecureBytes) throws(KeychainError) {
        self.fd = fd
        self.header = header
        headerBytes = bytes
        let keys = BackupFile.keys(master: master)
        guard Sodium.constantTimeEqual(keys.check, header.check) else {
            throw header.sealedKey == nil ? KeychainError(.authenticationFailed, "Wrong passphrase for this backup")
                : KeychainError(.dataCorrupted, "This backup's key check does not match the key its device unsealed: the file was changed")
        }
        key = keys.stream
        do { stream = try SecretStreamPull(key: key, header: header.streamHeader) } catch {
            throw KeychainError(.dataCorrupted, "This backup's stream header is malformed")
        }
    }

    /// Starts again at the first chunk (a second pass: the first one only verified).
    func rewind() throws(KeychainError) {
        guard lseek(fd, off_t(headerBytes.count), SEEK_SET) >= 0 else {
            throw KeychainError(.storageError, "Cannot read the backup a second time: restore reads a file, not a pipe", underlying: .errno(errno))
        }
        do { stream = try SecretStreamPull(key: key, header: header.streamHeader) } catch {
            throw KeychainError(.dataCorrupted, "This backup's stream header is malformed")
        }
        started = false
        items = 0
    }

    /// The next item, or nil after the end chunk (whose count must match, with nothing after it).
    func next() throws(KeychainError) -> BackupItem? {
        if !started {
            guard case .start = try pull(associatedData: headerBytes) else { throw corrupted("it does not begin with its start chunk") }
            started = true
        }
        switch try pull(associatedData: []) {
        case .item(let item):
            items += 1
            return item
        case .end(let count):
            guard stream.finished, count == items else { throw corrupted("its end chunk does not close it") }
            var extra: UInt8 = 0
            guard Glibc.read(fd, &extra, 1) == 0 else { throw corrupted("bytes follow its end") }
            return nil
        case .start:
            throw corrupted("a second start chunk")
        }
    }
    private var items: UInt64 = 0

    private func pull(associatedData: [UInt8]) throws(KeychainError) -> BackupFile.Body {
        if stream.finished { throw corrupted("a chunk follows the final one") }
        let lengthBytes = try Self.read(fd, 4, what: "chunk length", endIsTruncation: true)
        let length = Int(lengthBytes.reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        guard (Sodium.secretStreamOverhead...BackupFile.maxChunk).contains(length) else {
            throw corrupted("a chunk length of \(length) bytes")
        }
        let sealed = try Self.read(fd, length, what: "chunk", endIsTruncation: true)
        let body: SecureBytes
        do { body = try stream.pull(sealed, associatedData: associatedData) } catch {
            throw corrupted("a chunk failed authentication (changed, reordered, removed or from another backup)")
        }
        let parsed = try BackupFile.parse(body)
        if stream.finished, case .end = parsed {} else if stream.finished { throw corrupted("its final chunk is not the end") }
        return parsed
    }

    private func corrupted(_ what: String) -> KeychainError {
        KeychainError(.dataCorrupted, "This backup was changed or cut short: \(what); nothing was restored")
    }

    private static func read(_ fd: Int32, _ n: Int, what: String, endIsTruncation: Bool = false) throws(KeychainError) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: n)
        var got = 0
        while got < n {
            switch valueOrErrno({ out.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + got, n - got) } }) {
            case .success(0):
                throw KeychainError(.dataCorrupted, endIsTruncation
                    ? "This backup was cut short (its \(what) ends early); nothing was restored"
                    : "This is not a keychain backup (too short for its \(what))")
            case .success(let r): got += r
            case .failure(let code): throw KeychainError(.storageError, "Cannot read the backup", underlying: .errno(code.rawValue))
            }
        }
        return out
    }
}
