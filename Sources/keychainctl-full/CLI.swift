import Glibc
import FoundationEssentials
import Keychain
import KeychainBasics
import KeychainCLIText
import KeychainWire
import SecureMemory

/// Exit codes: 0 success (and "present" for `has`); 1 not found; 2 usage or INVALID_ARGUMENT; 3 any other error.
enum Exit: Int32 { case ok = 0, notFound = 1, usage = 2, failure = 3 }

struct UsageError: Error { let message: String }

/// The command's words in `args`, options and their values left out, for a usage error found
/// before the arguments parsed (an unknown option): its usage follows the error's line.
func commandWords(_ args: [String]) -> [String] {
    var words: [String] = [], i = 0
    while i < args.count {
        let arg = args[i]
        if arg == "--" { return words + args[(i + 1)...] }
        if CLIOptions.valued.contains(arg) { i += 1 } else if !arg.hasPrefix("-") || arg == "-" { words.append(arg) }
        i += 1
    }
    return words
}

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
        let result = valueOrErrno { buffer.withUnsafeMutableBytes { raw in read(0, raw.baseAddress! + length, raw.count - length) } }
        guard case .success(let n) = result, n > 0 else { break }
        length += n
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
        guard case .success(let n) = valueOrErrno({ write(1, bytes.baseAddress! + offset, bytes.count - offset) }), n > 0 else { return }
        offset += n
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
        writeAll(2, "keychainctl: \(escaped("\(error)"))\n")
    }
    return error.code == .invalidArgument ? .usage : .failure
}
