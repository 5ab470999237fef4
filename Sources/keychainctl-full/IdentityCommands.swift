import Glibc
import FoundationEssentials
import Keychain
import KeychainBasics
import KeychainCLIText

/// `identity [--out FILE]`: the device's identity document, for a fleet server to enroll.
extension Commands {
    func identity() async throws -> Exit {
        _ = try arguments(0, "no arguments (--out FILE)")
        let document = try await device.identity().json() + Data("\n".utf8)
        if let out = inv.flags["--out"] {
            // Public values only, but the file is made new (never over another), 0644.
            let fd = open(out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            guard fd >= 0 else { throw KeychainError(.storageError, "Cannot create \(out) (it may exist already)", underlying: .errno(errno)) }
            defer { close(fd) }
            document.withUnsafeBytes { raw in _ = write(fd, raw.baseAddress!, raw.count) }
            if inv.json { printJSON(["written": out]) } else { print("identity written to \(escaped(out))") }
        } else {
            document.withUnsafeBytes { writeStdout($0) }
        }
        return .ok
    }
}

/// `seal-for IDENTITY SERVICE KEY [...] < value > BUNDLE` (no TPM), `seal-for IDENTITY --credential UNIT:ID`
/// (a systemd credential) and `import BUNDLE` (on the device).
extension Commands {
    func sealFor() async throws -> Exit {
        let credential = try inv.flags["--credential"].map(Self.credentialTarget)
        let args = credential == nil ? try arguments(3, "IDENTITY SERVICE KEY (the value on stdin)")
            : try arguments(1, "IDENTITY --credential UNIT:ID (the value on stdin)") + [credential!.unit, credential!.id]
        let ekCA = try inv.flags["--ek-ca"].map { (path: String) throws(KeychainError) in [UInt8](try readFile(path, limit: 1 << 20, what: "the EK CA file")) }
        let identityFile = try readFile(args[0], limit: 1 << 20, what: "the identity")
        let unattestedSRK = inv.switches.contains("--unattested-srk")
        let accessible = try inv.flags["--accessible"].map { (t: String) throws(KeychainError) in try Accessible(parsing: t) } ?? .afterFirstUnlock
        let control = try inv.flags["--access-control"].map { (t: String) throws(KeychainError) in try AccessControl(parsing: t) } ?? AccessControl.none
        var version: UInt64 = 0
        if let v = inv.flags["--version"] {
            guard let n = UInt64(v) else { throw KeychainError.invalidArgument("Invalid --version '\(v)': expected a whole number, 0 or more") }
            version = n
        }
        if isatty(1) == 1 { throw KeychainError.invalidArgument("seal-for writes the bundle to stdout: redirect it (> BUNDLE)") }
        let parent = try inv.flags["--parent"].map { (t: String) throws(KeychainError) in try Provisioning.Parent(parsing: t) }
        let value = try readValue("Value to seal")
        // A verified identity (attest verify) or a device's own identity document.
        let bundle: ProvisioningBundle
        if Self.documentFormat(identityFile) == VerifiedIdentity.formatName {
            if unattestedSRK { throw UsageError(message: "--unattested-srk is for a device's own identity; this one is verified") }
            bundle = try Provisioning.seal(value, service: args[1], key: args[2], accessible: accessible, accessControl: control,
                                           label: inv.flags["--label"], version: version, credential: credential != nil,
                                           for: try VerifiedIdentity(json: identityFile), parent: parent, ekCA: ekCA)
        } else {
            bundle = try Provisioning.seal(value, service: args[1], key: args[2], accessible: accessible, accessControl: control,
                                           label: inv.flags["--label"], version: version, credential: credential != nil,
                                           for: try DeviceIdentity(json: identityFile), parent: parent, ekCA: ekCA, unattestedSRK: unattestedSRK)
        }
        (bundle.json() + Data("\n".utf8)).withUnsafeBytes { writeStdout($0) }
        return .ok
    }

    /// The `format` of a JSON document, nil for anything else.
    static func documentFormat(_ json: Data) -> String? {
        struct Format: Decodable { let format: String }
        return try? JSONDecoder().decode(Format.self, from: json).format
    }

    func importBundle() async throws -> Exit {
        let args = try arguments(1, "BUNDLE")
        let bundle = try ProvisioningBundle(json: try readFile(args[0], limit: Keychain.maxValueLength * 2, what: "the bundle"))
        let passcode = inv.switches.contains("--passcode-stdin") ? try readLines(["Passcode"]).first : nil
        let outcome = try await device.importBundle(bundle, passcode: passcode)
        if bundle.credential == true {
            output(["outcome": outcome.rawValue, "unit": bundle.service, "credential": bundle.key]) {
                "\($0["outcome"]!): systemd credential \(escaped(bundle.key)) of \(escaped(bundle.service)) (version \(bundle.itemVersion))"
            }
            return .ok
        }
        output(["outcome": outcome.rawValue, "service": bundle.service, "key": bundle.key]) {
            "\($0["outcome"]!): \(escaped(bundle.service)) \(escaped(bundle.key)) (version \(bundle.itemVersion))"
        }
        return .ok
    }

    /// `UNIT:ID` of `--credential`: split at the last colon (a unit name may hold one; systemd's
    /// `LoadCredential=ID:PATH` ends the ID at the first, so an ID never does).
    static func credentialTarget(_ text: String) throws(KeychainError) -> (unit: String, id: String) {
        guard let colon = text.lastIndex(of: ":"), colon != text.startIndex, text.index(after: colon) != text.endIndex else {
            throw KeychainError.invalidArgument("Invalid --credential '\(text)': expected UNIT:ID, as db.service:db-password")
        }
        return (String(text[..<colon]), String(text[text.index(after: colon)...]))
    }

    /// Reads a regular file only: opened without blocking (a FIFO someone planted would hang the
    /// open, and a read of a FIFO or device never ends), then checked with fstat.
    func readFile(_ path: String, limit: Int, what: String) throws(KeychainError) -> Data {
        let fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw KeychainError(.invalidArgument, "Cannot read \(what) at \(path)", underlying: .errno(errno)) }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
            close(fd)
            throw KeychainError.invalidArgument("\(path) is not a regular file: give \(what) as a file")
        }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        defer { close(fd) }
        var data = Data()
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        reading: while data.count <= limit {  // up to limit + 1 bytes: more says the file is too large
            let wanted = min(chunk.count, limit + 1 - data.count)
            switch valueOrErrno({ chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, wanted) } }) {
            case .success(let n) where n > 0: data.append(contentsOf: chunk[..<n])
            case .success: break reading
            case .failure:
                data = Data()  // a failed read gives nothing, as FileHandle's did
                break reading
            }
        }
        guard data.count <= limit else { throw KeychainError.invalidArgument("\(path) is larger than \(what) can be") }
        return data
    }
}
