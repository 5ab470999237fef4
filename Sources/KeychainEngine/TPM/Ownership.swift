import KeychainCore
import Glibc
import KeychainBasics
import SecureMemory
import TPM2

/// The TPM hierarchies whose authorization the keychain depends on.
public enum TPMHierarchy: String, Sendable, Hashable, Codable, CaseIterable {
    /// Owner: NV_UndefineSpace and NV_DefineSpace of the passcode's PIN index, owner writes that reset its count.
    case owner
    /// Lockout: TPM2_Clear, which destroys every key and index.
    case lockout

    var handle: TPMHandle { self == .owner ? TPMContext.owner : TPMContext.lockout }

    /// What an empty authorization lets anyone who can open the TPM do, in plain words.
    var emptyCost: String {
        switch self {
        case .owner:
            "The TPM's owner authorization is empty: anyone who can open the TPM can replace the passcode's PIN index "
                + "with one of their own and read passcode items, or reset its count of wrong passcodes. "
                + "Set one: keychainctl init --owner-auth-out FILE"
        case .lockout:
            "The TPM's lockout authorization is empty: anyone who can open the TPM can clear it (TPM2_Clear), "
                + "which destroys every item. Set one: keychainctl init --lockout-auth-out FILE"
        }
    }
}

/// How `initialize(takingOwnership:)` takes the TPM: each hierarchy whose authorization is empty and
/// that has a file here gets 32 random bytes, written to the file (created 0600, never overwritten)
/// before the TPM is changed to them, so a crash can leave the file without the change, never the
/// change without the file.
public struct Ownership: Sendable, Hashable {
    public var ownerAuthorizationFile: String?
    public var lockoutAuthorizationFile: String?
    /// Leave an empty authorization that has no file, instead of refusing with `INVALID_ARGUMENT`.
    public var allowEmpty: Bool

    public init(ownerAuthorizationFile: String? = nil, lockoutAuthorizationFile: String? = nil, allowEmpty: Bool = false) {
        self.ownerAuthorizationFile = ownerAuthorizationFile
        self.lockoutAuthorizationFile = lockoutAuthorizationFile
        self.allowEmpty = allowEmpty
    }

    func file(for hierarchy: TPMHierarchy) -> String? {
        hierarchy == .owner ? ownerAuthorizationFile : lockoutAuthorizationFile
    }
}

/// An authorization as a line of text, the way tpm2-tools reads one: `hex:` and hex digits (what
/// the keychain writes for the random ones it makes), `str:` and the bytes, or the bytes alone.
public enum AuthorizationText {
    /// An authorization from a file that only this user can read: what `init --owner-auth-out` wrote,
    /// or the systemd credential made of it. The first line, as `decode` reads it.
    ///
    /// - Throws: `INVALID_ARGUMENT` for a file that is missing, a link, not a regular file, not this
    ///   user's (or root's), or open to group or others (anyone who can read it owns the TPM).
    public static func readFile(_ path: String) throws(KeychainError) -> SecureBytes {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw KeychainError(.invalidArgument, "Cannot read the authorization file \(path)", underlying: .errno(errno)) }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw KeychainError.invalidArgument("The authorization file \(path) is not a regular file")
        }
        guard info.st_uid == geteuid() || info.st_uid == 0, info.st_mode & 0o077 == 0 else {
            throw KeychainError.invalidArgument("The authorization file \(path) belongs to uid \(info.st_uid) with mode "
                                                + String(info.st_mode & 0o777, radix: 8) + ": it must be this user's (uid "
                                                + "\(geteuid())) or root's, and no one else's to read (chmod 600 \(path))")
        }
        let buffer = SecureBytes(count: 512)
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
        guard n >= 0 else { throw KeychainError(.invalidArgument, "Cannot read the authorization file \(path)", underlying: .errno(errno)) }
        let line = buffer.withUnsafeBytes { raw in
            let bytes = raw.prefix(n)
            return SecureBytes(copying: bytes[..<(bytes.firstIndex(of: UInt8(ascii: "\n")) ?? bytes.endIndex)])
        }
        return try decode(line)
    }

    public static func decode(_ line: SecureBytes) throws(KeychainError) -> SecureBytes {
        let hexPrefix = Array("hex:".utf8), strPrefix = Array("str:".utf8)
        return try line.withUnsafeBytes { raw throws(KeychainError) in
            if raw.starts(with: strPrefix) { return SecureBytes(copying: raw.dropFirst(strPrefix.count)) }
            guard raw.starts(with: hexPrefix) else { return SecureBytes(copying: raw) }
            let digits = raw.dropFirst(hexPrefix.count)
            guard digits.count % 2 == 0 else { throw invalidHex() }
            let value = SecureBytes(count: digits.count / 2)
            try value.withUnsafeMutableBytes { out throws(KeychainError) in
                for i in 0..<out.count {
                    guard let high = Hex.nibble(digits[digits.startIndex + 2 * i]),
                          let low = Hex.nibble(digits[digits.startIndex + 2 * i + 1]) else { throw invalidHex() }
                    out[i] = high << 4 | low
                }
            }
            return value
        }
    }

    /// `hex:` and the value's hex digits, then a newline.
    public static func encode(_ value: SecureBytes) -> SecureBytes {
        let prefix = Array("hex:".utf8)
        let text = SecureBytes(count: prefix.count + 2 * value.count + 1)
        text.withUnsafeMutableBytes { out in
            value.withUnsafeBytes { raw in
                var at = 0
                for byte in prefix { out[at] = byte; at += 1 }
                Hex.write(raw) { out[at] = $0; at += 1 }
                out[out.count - 1] = UInt8(ascii: "\n")
            }
        }
        return text
    }

    private static func invalidHex() -> KeychainError {
        KeychainError.invalidArgument("The authorization starts with 'hex:' but is not an even number of hex digits")
    }
}

/// Secret files: created 0600 with O_EXCL|O_NOFOLLOW (never overwritten, never through a planted
/// link), written and synced before anything relies on them.
enum SecretFile {
    static func create(_ path: String, _ contents: SecureBytes) throws(KeychainError) {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            let code = errno
            if code == EEXIST {
                throw KeychainError(.invalidArgument, "\(path) already exists: an authorization file is never overwritten; "
                                    + "give a path that does not exist yet", underlying: .errno(code))
            }
            throw KeychainError(.storageError, "Cannot create \(path)", underlying: .errno(code))
        }
        var ok = fchmod(fd, 0o600) == 0
        contents.withUnsafeBytes { raw in
            var offset = 0
            while ok && offset < raw.count {
                if case .success(let n) = valueOrErrno({ write(fd, raw.baseAddress! + offset, raw.count - offset) }), n > 0 {
                    offset += n
                } else {
                    ok = false
                }
            }
        }
        ok = ok && fsync(fd) == 0
        let code = errno
        close(fd)
        guard ok else {
            unlink(path)
            throw KeychainError(.storageError, "Cannot write \(path)", underlying: .errno(code))
        }
        // The directory entry too: after a crash the file exists whenever the TPM may hold its value.
        let slash = path.lastIndex(of: "/")
        let dir = open(slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dir >= 0 { fsync(dir); close(dir) }
    }

    /// The decoded first line of a secret file, or nil when it does not exist.
    static func read(_ path: String) throws(KeychainError) -> SecureBytes? {
        // O_NONBLOCK: a FIFO planted there must not hang the open; only a regular file is read.
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw KeychainError(.storageError, "Cannot read \(path)", underlying: .errno(errno))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            throw KeychainError(.storageError, "\(path) is not a regular file: remove it")
        }
        let buffer = SecureBytes(count: 256)
        let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) }
        guard n >= 0 else { throw KeychainError(.storageError, "Cannot read \(path)", underlying: .errno(errno)) }
        let line = buffer.withUnsafeBytes { raw in
            let bytes = raw.prefix(n)
            return SecureBytes(copying: bytes[..<(bytes.firstIndex(of: UInt8(ascii: "\n")) ?? bytes.endIndex)])
        }
        return try AuthorizationText.decode(line)
    }
}

extension Engine {
    /// Takes the hierarchies `ownership` has files for whose authorization is empty (see `Ownership`);
    /// refuses, before changing anything, an empty one without a file unless `allowEmpty`.
    func takeOwnership(_ ownership: Ownership) throws(KeychainError) {
        try withKeyring { keyring throws(KeychainError) in
            let context = keyring.context
            let flags: TPMContext.PermanentFlags
            do throws(TPMError) { flags = try context.permanentFlags() } catch { throw keyring.diagnose(error, doing: "read its permanent flags") }
            let empty = TPMHierarchy.allCases.filter { $0 == .owner ? !flags.ownerAuthSet : !flags.lockoutAuthSet }
            let uncovered = empty.filter { ownership.file(for: $0) == nil }
            if !uncovered.isEmpty && !ownership.allowEmpty {
                throw KeychainError.invalidArgument(
                    uncovered.map(\.emptyCost).joined(separator: ". ")
                    + ". The TPM's authorizations were not changed: give " + uncovered.map { $0 == .owner ? "--owner-auth-out FILE" : "--lockout-auth-out FILE" }
                        .joined(separator: " and ")
                    + " to set random ones written to FILE (0600), or --allow-empty-owner-auth to keep them empty")
            }
            // Every file is checked before the first change, so a taken path never leaves a half-taken TPM.
            for file in empty.compactMap(ownership.file(for:)) {
                var info = stat()
                if lstat(file, &info) == 0 {
                    throw KeychainError.invalidArgument("\(file) already exists: an authorization file is never overwritten; "
                                                        + "give a path that does not exist yet. The TPM's authorizations were not changed")
                }
            }
            for hierarchy in empty {
                guard let file = ownership.file(for: hierarchy) else { continue }
                try Self.takeHierarchy(hierarchy, context: context, saltKey: keyring.srk) { value throws(KeychainError) in
                    try SecretFile.create(file, AuthorizationText.encode(value))
                }
            }
        }
    }

    /// Sets 32 random bytes as the authorization of `hierarchy`, after `handOver` kept them.
    static func takeHierarchy(_ hierarchy: TPMHierarchy, context: TPMContext, saltKey: TPMHandle,
                              handOver: (SecureBytes) throws(KeychainError) -> Void) throws(KeychainError) {
        let value = SecureBytes(random: 32)
        try handOver(value)
        do throws(TPMError) { try context.changeHierarchyAuth(hierarchy.handle, to: value, saltKey: saltKey) } catch {
            throw KeychainError(.hardwareUnavailable, "The TPM refused to set the \(hierarchy.rawValue) authorization "
                                + "(HierarchyChangeAuth); its file was written but the TPM keeps the empty one", underlying: .tpm(error))
        }
    }

    /// The hierarchy flags and the SRK, for `status`: empty authorizations and what they cost, in words.
    func ownershipStatus(_ keyring: TPMKeyring) throws(KeychainError)
        -> (owner: Bool, lockout: Bool, srk: DeviceStatus.StorageRootKey, warnings: [String]) {
        let flags: TPMContext.PermanentFlags
        do throws(TPMError) { flags = try keyring.context.permanentFlags() } catch { throw keyring.diagnose(error, doing: "read its permanent flags") }
        let srk = keyring.srkState()
        var warnings: [String] = []
        switch srk {
        case .pinned: break
        case .missing:
            warnings.append("The TPM's storage root key at 0x81000001 is missing: the TPM was cleared or the key evicted. "
                            + "Items sealed to it cannot be opened; restore the key or start a new store")
        case .replaced:
            warnings.append("The TPM's storage root key at 0x81000001 is not the one this store was made with: "
                            + "the TPM was cleared or the key replaced. Items sealed to the old one cannot be opened, and no "
                            + "item is sealed to the new one")
        }
        if !flags.ownerAuthSet { warnings.append(TPMHierarchy.owner.emptyCost) }
        if !flags.lockoutAuthSet { warnings.append(TPMHierarchy.lockout.emptyCost) }
        return (flags.ownerAuthSet, flags.lockoutAuthSet, srk, warnings)
    }
}

extension EmbeddedTPM {
    static func authorizationFile(_ storeDirectory: String, _ hierarchy: TPMHierarchy) -> String {
        directory(storeDirectory) + "/\(hierarchy.rawValue).auth"
    }

    /// Gives the embedded TPM random owner and lockout authorizations, kept in `<store>/swtpm/` (0700,
    /// files 0600) and written before the TPM takes them; a file whose value the TPM does not hold
    /// yet (a crash in between) is applied now. Sets them on `context`.
    /// - Returns: the owner authorization (nil when the TPM's was set by someone else and there is no file).
    static func takeOwnership(_ context: TPMContext, storeDirectory: String) throws(KeychainError) -> SecureBytes? {
        var owner: SecureBytes?
        do {
            try context.withTransient { () throws -> Void in
                // The salt key, made when a hierarchy needs it, is flushed at the end of this scope.
                var saltKey: TPMHandle?
                let flags = try context.permanentFlags()
                for hierarchy in TPMHierarchy.allCases {
                    let file = authorizationFile(storeDirectory, hierarchy)
                    let isSet = hierarchy == .owner ? flags.ownerAuthSet : flags.lockoutAuthSet
                    var value = try SecretFile.read(file)
                    if !isSet {
                        if saltKey == nil { saltKey = try context.ephemeralSaltKey() }
                        if value == nil {
                            value = SecureBytes(random: 32)
                            try SecretFile.create(file, AuthorizationText.encode(value!))
                        }
                        try context.changeHierarchyAuth(hierarchy.handle, to: value!, saltKey: saltKey!)
                    } else if let value {
                        try context.setAuth(hierarchy.handle, value)
                    }
                    if hierarchy == .owner { owner = value }
                }
            }
        } catch let error as KeychainError {
            throw error
        } catch let error as TPMError {
            throw KeychainError(.hardwareUnavailable, "Cannot set the embedded software TPM's authorizations (\(error.command))",
                                underlying: .tpm(error))
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
        return owner
    }
}
