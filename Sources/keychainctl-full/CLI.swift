import Foundation
import Keychain
import KeychainCLIText
import KeychainWire
import SecureMemory

/// Exit codes: 0 success (and "present" for `has`); 1 not found; 2 usage or INVALID_ARGUMENT; 3 any other error.
enum Exit: Int32 { case ok = 0, notFound = 1, usage = 2, failure = 3 }

struct UsageError: Error { let message: String }

/// Global options and the command's own arguments, parsed by hand (no outside packages).
struct Invocation {
    var store: String?
    var tcti: String?
    var json = false
    var command: [String] = []
    var flags: [String: String] = [:]
    var switches: Set<String> = []
    /// Options given more than once (`--pcr 0=HEX --pcr 7=HEX`), every value in order.
    var repeated: [String: [String]] = [:]

    init(_ args: [String]) throws(UsageError) {
        let parsed: ParsedArguments
        do { parsed = try ParsedArguments(args) } catch { throw UsageError(message: error.message) }
        (command, flags, switches, repeated) = (parsed.command, parsed.flags, parsed.switches, parsed.repeated)
        store = flags["--store"]
        tcti = flags["--tcti"]
        json = switches.contains("--json")
    }

    func configuration() throws(KeychainError) -> KeychainConfiguration {
        // Through keychaind by the library's rule (DaemonSocket); --direct, --store or --tcti use a
        // store in this process.
        let direct = switches.contains("--direct") || store != nil || tcti != nil
        if !direct, let socket = DaemonSocket.resolve() { return .daemon(socket: socket) }
        var configuration = KeychainConfiguration.direct
        if let store, (ProcessInfo.processInfo.environment["KEYCHAIN_READER"] ?? "").isEmpty {
            configuration.readerDirectory = store + ".reader"
        }
        if let reader = flags["--reader"] { configuration.readerDirectory = reader == "none" ? nil : reader }
        if let uri = flags["--pkcs11-uri"] { configuration.pkcs11URI = uri }
        if let file = flags["--owner-auth-file"] { configuration.ownerAuthorization = try readSecretFile(file) }
        if let store { configuration.storeDirectory = store }
        if let tcti { configuration.tpm = .tcti(tcti) }
        if let pcrs = flags["--pcrs"] {
            let indices = pcrs.split(separator: ",").map { Int($0) }
            guard !indices.isEmpty, indices.allSatisfy({ $0 != nil }) else {
                throw KeychainError.invalidArgument("Invalid --pcrs '\(pcrs)': expected PCR numbers 0–15 separated by commas, e.g. 7 or 0,7")
            }
            configuration.pcrSelection = indices.compactMap { $0 }
            try configuration.checkPCRSelection()
        }
        return configuration
    }
}

let usage = """
    usage: keychainctl [--store DIR] [--tcti CONF] [--direct] [--json] COMMAND …

    Through keychaind when KEYCHAIN_SOCKET names its socket, or when /run/keychain/keychaind.sock exists
    and KEYCHAIN_STORE is not set; --direct (or --store, --tcti) uses a store in this process instead.

    Device:
      init [--owner-auth-file FILE|-] [--owner-auth-out FILE] [--lockout-auth-out FILE] [--allow-empty-owner-auth]
                                   provision the TPM and the store, and take ownership of the TPM: an empty
                                   owner or lockout authorization (anyone with TPM access could replace the
                                   passcode's PIN index, or clear the TPM) is set to 32 random bytes, written
                                   first to the --…-auth-out FILE (created 0600, never overwritten, 'hex:…' as
                                   tpm2-tools reads it); without that FILE init provisions, then refuses, unless
                                   --allow-empty-owner-auth. --owner-auth-file: FILE (or stdin) holds the owner
                                   authorization already set (first line); never argv. The embedded software
                                   TPM keeps random ones in <store>/swtpm/ (owner.auth, lockout.auth)
      status                       the TPM, the passcode, the lock state, the TPM's authorizations and
                                   storage root key, the store's rollback counter, with warnings in words
      accept-store [--owner-auth-file FILE|-]
                                   after a rollback (a copy of the store put back: every operation refuses
                                   it as DATA_CORRUPTED), keep the store as it is now: bind it to a new TPM
                                   counter, undefining the old one (needs the owner authorization)
      passcode set|change|remove   PINs on stdin, one per line (change: old then new)
      passcode reset-tries [--owner-auth-file FILE|-]   reset the TPM's count of wrong passcodes
      unlock                       the passcode on stdin (no input when none is set)
      lock
      tpm reboot                   restart the embedded software TPM (a TPM reset)
      boot-state                   the PCRs ThisDeviceOnly items are bound to: approved and current values
      boot-state sign --key VENDOR.pem --pcr N=HEX… [--generation G]   (offline, no TPM) a signed boot
                                   policy for those values on stdout (JSON), generation G 0–63 (default 0)
      boot-state install POLICY    install a signed policy (the TPM checks its signature)
      boot-state revoke-before N   revoke signed policies of generations below N, for good (passcode on
                                   stdin, or --owner-auth-file)
      boot-state approve [--pcr N=HEX]… [--owner-auth-file FILE|-]
                                   approve the current boot state (after an update you trust), or with
                                   --pcr the values an update will leave (before its reboot); revokes the
                                   state approved before. The passcode on stdin (no input when none is set),
                                   or the owner authorization with --owner-auth-file
      token reset-tries            reset this library's count of wrong token PINs

    Items (the value of `set` is read from stdin to EOF, bytes kept exactly):
      set SERVICE KEY [--accessible A] [--access-control C] [--label L] [--auth-validity N] [--synchronizable]
    Item commands take --access-group NAME: through keychaind, the items the access group NAME shares
    (groups.d/NAME.conf), for its members only (ACCESS_DENIED otherwise).
    Item commands take --key-storage tee|strongbox: strongbox is the PKCS#11 token of --pkcs11-uri
    (KEYCHAIN_PKCS11_URI); its items are kept apart from the TPM storage of the same service.
      get SERVICE KEY [--auth-validity N]   the value on stdout, exactly as stored; a passed prompt
                                   opens the item for its window (set --auth-validity), across
                                   processes; N shortens it for this read, never widens it
      has SERVICE KEY              exit 0 when present, 1 when not
      rm SERVICE KEY
      ls SERVICE
      info SERVICE KEY
      clear SERVICE
      can-use ACCESS_CONTROL       available, and the reason when not
      biometry-types

    Provisioning and backup (docs/provisioning.md, docs/formats.md):
      identity [--out FILE]        the device's identity document (JSON): EK public keys and certificates,
                                   SRK public area and name, the keychain's NV indices, the boot state
      seal-for IDENTITY SERVICE KEY [--accessible A] [--access-control none|passcode] [--label L] [--version N] [--ek-ca CA.pem]
                                   [--parent ek|srk] [--unattested-srk]  (no TPM needed) the value on stdin sealed to that
                                   device's TPM (its EK, or its SRK when it has none): a provisioning bundle on stdout; --ek-ca
                                   refuses a device whose EK certificate does not verify against CA.pem; IDENTITY may be
                                   a verified identity (attest verify), else an SRK bundle needs --unattested-srk
      seal-for IDENTITY --credential UNIT:ID [--accessible A] [--version N] …   the same, for a systemd credential:
                                   its import makes it UNIT's credential ID (docs/credentials.md)
      attest init                  (device) the attestation key: restricted signing, under the RSA EK, kept in the store
      attest request [--endorsement-key rsa2048|eccP256|eccP384]   (device) EK public and certificate (the RSA EK,
                                   or that ECC EK), AK public and name, SRK name, PCR selection (JSON)
      attest challenge REQUEST --state FILE   (server, no TPM) a credential for that EK and AK and a nonce (JSON on
                                   stdout); the credential and nonce kept in FILE (made new, 0600)
      attest respond CHALLENGE     (device) ActivateCredential, a Quote of the PCRs and a Certify of the SRK (JSON)
      attest verify ANSWER --state FILE [--ek-ca CA.pem] [--expect-boot-state VERIFIED]   (server, no TPM) the
                                   verified identity (JSON) or AUTHENTICATION_FAILED naming the check; with
                                   --expect-boot-state, the PCR values must be those of that verified identity;
                                   FILE is removed once it verified
      attest key SERVICE --nonce HEX [--accessible A] [--access-control C] [--auth-validity N]   (device) the AK's
                                   CertifyCreation of the wrapping key of SERVICE's items of that protection (JSON)
      attest verify-key ATTESTATION --identity VERIFIED --nonce HEX   (verifier, no TPM) what the TPM enforces on
                                   that key, in words and JSON; exit status 3 when it does not match its claim
      import BUNDLE [--passcode-stdin]   TPM2_Import of a bundle sealed to this device; the item becomes an
                                   ordinary item of its service (the caller's, through keychaind), or the
                                   systemd credential it was sealed as; never an older --version than installed
                                   (identity and import through keychaind: root or the access group admin only)
      backup (--passphrase-stdin | --to IDENTITY [--ek-ca CA.pem] [--parent ek|srk]) [--service S] [--out FILE]
             [--cost interactive|moderate|sensitive] [--passcode-stdin]
                                   every item of a migratable level (whenUnlocked, afterFirstUnlock, always),
                                   never ThisDeviceOnly, biometric or token items, encrypted under the
                                   passphrase (first line of stdin; the passcode on the second with
                                   --passcode-stdin, asked once); the file on stdout, or --out FILE
                                   With --to the backup's key is sealed to that device's TPM (no passphrase).
      restore FILE [--passphrase-stdin] [--passcode-stdin]   items come back with their protection, label
                                   and dates; an item that exists or whose protection this device cannot
                                   give is skipped; a backup made --to this device needs no passphrase, and
                                   this device's passcode (next line) when it holds passcode items

    systemd credentials (through keychaind, root or the access group admin only; docs/credentials.md):
      credential set UNIT ID [--accessible A]   the value on stdin, for LoadCredential=ID:/run/keychain/credentials.sock
      credential get UNIT ID | credential ls UNIT | credential rm UNIT ID
      credential … --user          the same for a unit of your own user manager (systemctl --user), as any user

    The fingerprint reader (simulated; its own directory, --reader DIR or KEYCHAIN_READER, 'none' for no reader):
      reader enroll NAME | reader remove NAME   the device passcode on stdin when one is set
      reader delete                             the reader and its TPM key (passcode on stdin when set)
      reader list

    Reads of items behind an access control ask on the terminal; without one, answer with
      --touch FINGER | --touch cancel | --touch fallback | --touch interrupt, or --passcode-stdin
      demo                         the sign-in flow, step by step, on a fresh embedded software TPM

    Environment: KEYCHAIN_SOCKET (keychaind's socket), KEYCHAIN_STORE (store directory), KEYCHAIN_TCTI then TPM2TCTI (the TPM), KEYCHAIN_READER
    (the reader's directory, or none), KEYCHAIN_PKCS11_URI (the token), KEYCHAIN_APP_ID (the default service).
    Without either and without /dev/tpmrm0, a software TPM kept in the store directory is used.
    """

/// The arguments, each checked to be UTF-8: `CommandLine.arguments` decodes invalid bytes lossily
/// (U+FFFD), so two different byte strings would name the same key.
func strictArguments() throws(KeychainError) -> [String] {
    var args: [String] = []
    for i in 1..<Int(CommandLine.argc) {
        guard let raw = CommandLine.unsafeArgv[i], let arg = String(validatingCString: raw) else {
            throw KeychainError.invalidArgument("Argument \(i) is not valid UTF-8: keys, services and options must be UTF-8 text")
        }
        args.append(arg)
    }
    // The environment the configuration reads, held to the same rule.
    for name in ["KEYCHAIN_STORE", "KEYCHAIN_TCTI", "TPM2TCTI", "KEYCHAIN_READER", "KEYCHAIN_PKCS11_URI", "KEYCHAIN_APP_ID", "HOME"] {
        if let raw = getenv(name), String(validatingCString: raw) == nil {
            throw KeychainError.invalidArgument("The environment variable \(name) is not valid UTF-8: set it to a UTF-8 path or value")
        }
    }
    return args
}

/// Reads stdin to EOF into locked memory: values and PINs never pass through a Swift String.
/// - Throws: `INVALID_ARGUMENT` as soon as more than `limit` bytes arrive; the rest is never read,
///   so a huge or endless input (`/dev/zero`) costs at most about twice `limit` of memory.
func readStdin(limit: Int = 1 << 16) throws(KeychainError) -> SecureBytes {
    var buffer = SecureBytes(count: min(4096, limit + 1))
    var length = 0
    while true {
        if length == buffer.count {
            guard length <= limit else {
                throw KeychainError.invalidArgument("The input on stdin is longer than the \(limit) bytes allowed here")
            }
            let bigger = SecureBytes(count: min(buffer.count * 2, limit + 1))
            bigger.withUnsafeMutableBytes { dest in buffer.withUnsafeBytes { dest.copyMemory(from: $0) } }
            buffer = bigger
        }
        let n = buffer.withUnsafeMutableBytes { raw in read(0, raw.baseAddress! + length, raw.count - length) }
        if n > 0 { length += n } else if n == 0 || errno != EINTR { break }
    }
    guard length <= limit else {
        throw KeychainError.invalidArgument("The input on stdin is longer than the \(limit) bytes allowed here")
    }
    return buffer.withUnsafeBytes { SecureBytes(copying: $0.prefix(length)) }
}

/// An item's value: stdin to EOF, byte for byte; on a terminal, asked for there (`TerminalInput.value`).
func readValue(_ prompt: String) throws(KeychainError) -> SecureBytes {
    TerminalInput.isTerminal ? try TerminalInput.value(prompt, limit: Keychain.maxValueLength)
        : try readStdin(limit: Keychain.maxValueLength)
}

/// The first line of FILE (or of stdin for `-`): an authorization that never goes through argv,
/// as tpm2-tools reads it (`hex:…` as `init` writes it, `str:…`, or the bytes).
func readSecretFile(_ path: String) throws(KeychainError) -> SecureBytes {
    try AuthorizationText.decode(try readFirstLine(path))
}

private func readFirstLine(_ path: String) throws(KeychainError) -> SecureBytes {
    if path == "-" {
        guard let line = try readLines(["Owner authorization"]).first else { throw KeychainError.invalidArgument("No authorization on stdin") }
        return line
    }
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw KeychainError(.invalidArgument, "Cannot read \(path)", underlying: .errno(errno)) }
    defer { close(fd) }
    let buffer = SecureBytes(count: 256)
    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
    guard n >= 0 else { throw KeychainError(.invalidArgument, "Cannot read \(path)", underlying: .errno(errno)) }
    return buffer.withUnsafeBytes { raw in
        let bytes = raw.prefix(n)
        let end = bytes.firstIndex(of: UInt8(ascii: "\n")) ?? bytes.endIndex
        return SecureBytes(copying: bytes[..<end])
    }
}

/// PINs and passphrases, one per prompt: asked for on stdin's terminal (`TerminalInput`), or else
/// stdin's lines without the newline, at most one per prompt.
func readLines(_ prompts: [String]) throws(KeychainError) -> [SecureBytes] {
    if TerminalInput.isTerminal { return try TerminalInput.lines(prompts) }
    let count = prompts.count
    let all = try readStdin()
    return all.withUnsafeBytes { raw -> [SecureBytes] in
        var lines: [SecureBytes] = []
        var start = 0
        for i in 0...raw.count where lines.count < count {
            if i == raw.count || raw[i] == UInt8(ascii: "\n") {
                var end = i
                if end > start, raw[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                if i < raw.count || end > start { lines.append(SecureBytes(copying: raw[start..<end])) }
                start = i + 1
            }
        }
        return lines
    }
}

func writeStdout(_ bytes: UnsafeRawBufferPointer) {
    var offset = 0
    while offset < bytes.count {
        let n = write(1, bytes.baseAddress! + offset, bytes.count - offset)
        if n > 0 { offset += n } else if errno != EINTR { return }
    }
}

func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    encoder.dateEncodingStrategy = .iso8601
    if let data = try? encoder.encode(value), let text = String(data: data, encoding: .utf8) { print(text) }
}

struct ErrorBody: Encodable {
    struct Inner: Encodable { let code: String; let message: String; let cause: String? }
    let error: Inner
}

func report(_ error: KeychainError, json: Bool) -> Exit {
    if json {
        printJSON(ErrorBody(error: .init(code: error.code.rawValue, message: error.message,
                                         cause: error.underlying.map { "\($0)" })))
    } else {
        FileHandle.standardError.write(Data("keychainctl: \(escaped("\(error)"))\n".utf8))
    }
    return error.code == .invalidArgument ? .usage : .failure
}
