#if canImport(Glibc)
import Glibc
#endif
import KeychainBasics
import KeychainCLIText
import KeychainWire

// keychainctl, the command users run: a front that loads no Foundation, ICU, tpm2-tss, OpenSSL or
// SQLite (docs/daemon.md, "keychainctl's two executables"). It does the simple item commands
// through keychaind itself (get, has, rm, set, ls, clear, with the options below) with the full tool's
// outputs, messages and exit codes byte for byte, and runs keychainctl-full, installed next to it,
// with the same arguments and environment for everything else: direct mode, device commands,
// help, any option it does not know, any input it is not sure of, and prompts. With --json it writes
// what the full tool's JSONEncoder writes (sorted keys, its string escapes).

// MARK: Handing over

/// Runs keychainctl-full from this executable's own directory (the kernel's /proc/self/exe: never
/// argv[0], PATH or the working directory, which the caller chooses), in this process: same pid,
/// arguments, environment and descriptors, and stdin untouched. Where keychainctl-full is not there,
/// keychain-multicall (the Debian package's one executable, which holds it) run as keychainctl-full.
func runFullTool() -> Never {
    if fullToolIsThisExecutable { runAsFullTool(Array("/proc/self/exe".utf8CString), shown: "/proc/self/exe") }
    var link = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let n = readlink("/proc/self/exe", &link, Int(PATH_MAX))
    guard n > 0, link[0] == CChar(UInt8(ascii: "/")) else {
        fail("cannot find keychainctl-full: /proc/self/exe does not name this program (errno \(errno)); mount /proc", 3)
    }
    // The directory's bytes as they are (a path need not be UTF-8), then the full tool's name.
    var directory = Array(link[0..<n])
    while let last = directory.last, last != CChar(UInt8(ascii: "/")) { directory.removeLast() }
    let path = directory + Array("keychainctl-full".utf8CString)
    let multicall = directory + Array("keychain-multicall".utf8CString)
    var info = stat()
    if lstat(path, &info) != 0 && errno == ENOENT && lstat(multicall, &info) == 0 {
        checkOwnership(multicall, info)
        runAsFullTool(multicall, shown: shownPath(multicall))
    }
    if lstat(path, &info) == 0 { checkOwnership(path, info) }
    execv(path, CommandLine.unsafeArgv)
    let code = errno
    fail("cannot run \(escaped(shownPath(path))) (errno \(code): \(String(cString: strerror(code)))): keychainctl-full is installed "
         + "next to keychainctl and does every command but the item commands through keychaind", 3)
}

private func shownPath(_ path: [CChar]) -> String { String(decoding: path.dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self) }

/// The front may be run by root from a folder others can add files to (a sticky /tmp): the full
/// tool must be a file only its owner can change, and that owner root or this user, as the front
/// itself is. Not a symbolic link (it could name any program); a hard link to another user's file
/// is what fs.protected_hardlinks refuses.
private func checkOwnership(_ path: [CChar], _ info: stat) {
    let foreignGroupWrite = info.st_mode & 0o020 != 0 && info.st_gid != 0 && info.st_gid != getegid()
    guard info.st_mode & S_IFMT == S_IFREG, info.st_uid == 0 || info.st_uid == geteuid(),
          info.st_mode & 0o002 == 0, !foreignGroupWrite else {
        fail("refusing to run \(escaped(shownPath(path))): it must be a regular file owned by root or uid \(geteuid()) that no one "
             + "else can write (it is uid \(info.st_uid)'s, mode \(String(info.st_mode, radix: 8))); install keychainctl-full "
             + "next to keychainctl as they come", 3)
    }
}

/// Set once, at the start: whether keychainctl-full is this program (keychain-multicall).
nonisolated(unsafe) private var fullToolIsThisExecutable = false

/// The multi-call executable at `path` run as keychainctl-full: argv[0] keychainctl-full, the rest of the
/// arguments, the environment and the descriptors as they are.
private func runAsFullTool(_ path: [CChar], shown: String) -> Never {
    var argv: [UnsafeMutablePointer<CChar>?] = [strdup("keychainctl-full")]
    for i in stride(from: 1, to: Int(CommandLine.argc), by: 1) { argv.append(CommandLine.unsafeArgv[i]) }
    argv.append(nil)
    execv(path, argv)
    let code = errno
    fail("cannot run \(escaped(shown)) as keychainctl-full (errno \(code): \(String(cString: strerror(code))))", 3)
}

func fail(_ text: String, _ status: Int32) -> Never {
    writeAll(2, Array("keychainctl: \(text)\n".utf8))
    exit(status)
}

// MARK: What the front does itself

/// The arguments, or nil when one is not UTF-8 (the full tool refuses it with its message).
func strictArguments() -> [String]? {
    var args: [String] = []
    for i in stride(from: 1, to: Int(CommandLine.argc), by: 1) {  // argc may be 0 (an empty argv)
        guard let raw = CommandLine.unsafeArgv[i], let arg = String(validatingCString: raw) else { return nil }
        args.append(arg)
    }
    // The full tool checks these before any command: it reports one that is not UTF-8.
    for name in ["KEYCHAIN_STORE", "KEYCHAIN_TCTI", "TPM2TCTI", "KEYCHAIN_READER", "KEYCHAIN_PKCS11_URI", "KEYCHAIN_APP_ID", "HOME",
                 "KEYCHAIN_SOCKET"] {
        if let raw = getenv(name), String(validatingCString: raw) == nil { return nil }
        if timesSet(name) > 1 { return nil }
    }
    return args
}

/// How many entries of the environment set `name`: execve takes any list, and where a name comes
/// twice getenv reads the first and the full tool (Foundation) the last, so the front leaves it to
/// the full tool.
func timesSet(_ name: String) -> Int {
    let prefix = Array((name + "=").utf8)
    var count = 0
    var entry = environ
    while let text = entry.pointee {
        if prefix.withUnsafeBufferPointer({ p in p.baseAddress!.withMemoryRebound(to: CChar.self, capacity: p.count) {
            strncmp(text, $0, p.count) == 0 } }) { count += 1 }
        entry += 1
    }
    return count
}

/// keychaind's socket by the rule every front door shares (`DaemonSocket`); nil for a store in the
/// process.
func daemonSocket() -> String? { DaemonSocket.resolve() }

/// The global options and the command, by the grammar both tools share; nil where the full tool
/// reports a usage error.
struct Invocation {
    var command: [String] = []
    var flags: [String: String] = [:]
    var switches: Set<String> = []

    init?(_ args: [String]) {
        guard let parsed = try? ParsedArguments(args) else { return nil }
        (command, flags, switches) = (parsed.command, parsed.flags, parsed.switches)
    }
}

/// A command the front does itself, or nil to hand it over. Only inputs the full tool accepts as
/// they are: anything it would refuse or treat specially is the full tool's to answer.
struct FastCommand {
    let op: WireOp
    let service: String
    let key: String?
    let accessGroup: String?
    let flags: [String: String]
    let synchronizable: Bool
    /// `--json`: results as JSON on stdout.
    let json: Bool
    /// For `get`: how many questions the full tool's authenticator would allow (nil for other
    /// commands: keychaind answers INTERACTION_NOT_ALLOWED itself instead of asking).
    let attempts: UInt64?

    init?(_ inv: Invocation) {
        guard let name = inv.command.first else { return nil }
        var allowed: Set<String> = ["--access-group"], switches: Set<String> = ["--json"]
        let operands: Int
        switch name {
        case "get": (op, operands) = (.getItem, 2); allowed.insert("--touch")
        case "has": (op, operands) = (.hasItem, 2)
        case "rm": (op, operands) = (.removeItem, 2)
        case "ls": (op, operands) = (.allKeys, 1)
        case "clear": (op, operands) = (.clear, 1)
        case "set":
            // A value typed at a terminal is asked for, without echo: the full tool's prompt.
            guard isatty(0) == 0 else { return nil }
            (op, operands) = (.setItem, 2)
            allowed.formUnion(["--accessible", "--access-control", "--label"])
            switches.insert("--synchronizable")
        default: return nil
        }
        guard inv.command.count == operands + 1, inv.flags.keys.allSatisfy(allowed.contains),
              inv.switches.isSubset(of: switches) else { return nil }
        if let value = inv.flags["--accessible"], !WireValues.accessible.contains(value) { return nil }
        if let value = inv.flags["--access-control"], !WireValues.accessControl.contains(value) { return nil }
        service = inv.command[1]
        key = operands == 2 ? inv.command[2] : nil
        accessGroup = inv.flags["--access-group"]
        // The library's checks of a storage's options, which the full tool makes before connecting:
        // a service of 1 to 256 characters (bytes here, a stricter rule), a non-empty group.
        guard !service.isEmpty, service.utf8.count <= 256, accessGroup.map({ !$0.isEmpty }) ?? true else { return nil }
        flags = inv.flags
        synchronizable = inv.switches.contains("--synchronizable")
        json = inv.switches.contains("--json")
        if op != .getItem {
            attempts = nil
        } else if inv.flags["--touch"] != nil {
            attempts = 1  // one answer, one try
        } else {
            // The full tool's system prompts (the terminal, the desktop's prompter, the password
            // agents: those can-use counts) answer keychaind's question, or say why none can.
            attempts = 3
        }
    }
}

/// The error as the full tool prints it (`keychainctl: CODE: message (cause: …)`), with its exit code:
/// 2 for INVALID_ARGUMENT, 3 for any other.
struct Failure: Error {
    let code: String
    let message: String
    let cause: String?
    init(_ code: String, _ message: String, cause: String? = nil) {
        (self.code, self.message, self.cause) = (code, message, cause)
    }
    var description: String {
        var text = message.isEmpty ? code : "\(code): \(message)"
        if let cause { text += " (cause: \(cause))" }
        return text
    }
    func report() -> Never {
        let status: Int32 = code == "INVALID_ARGUMENT" ? 2 : 3
        // The full tool words an error as JSON on stdout when any argument is "--json" (even an operand).
        guard CommandLine.arguments.contains("--json") else { fail(escaped(description), status) }
        let fields = (cause.map { ["\"cause\":" + jsonEncoded($0)] } ?? [])
            + ["\"code\":" + jsonEncoded(code), "\"message\":" + jsonEncoded(message)]
        writeAll(1, Array("{\"error\":{\(fields.joined(separator: ","))}}\n".utf8))
        exit(status)
    }
}

/// A failure of the socket, in the library's words (KeychainWire's WireFailure).
extension Failure {
    init(_ failure: WireFailure) {
        let cause: String? = switch failure.cause {
        case .errno(let code)?: "errno \(code)"
        case .detail(let text)?: text
        case nil: nil
        }
        self.init(failure.code, failure.message, cause: cause)
    }
}

/// keychaind's error reply as the library decodes it (KeychainWire's codec, the library's words for the cause).
extension Failure {
    init(_ reply: WireErrorReply) { self.init(reply.code, reply.message, cause: reply.cause?.description) }
}

/// A string as Foundation's JSONEncoder writes it: `"`, `\\` and `/` escaped, \b \t \n \f \r, other
/// control characters as \u00xx, everything else as it is.
func jsonEncoded(_ text: String) -> String {
    let body = replacingScalars(of: text) { value in
        switch value {
        case 0x22: "\\\""
        case 0x5C: "\\\\"
        case 0x2F: "\\/"
        case 0x08: "\\b"
        case 0x09: "\\t"
        case 0x0A: "\\n"
        case 0x0C: "\\f"
        case 0x0D: "\\r"
        case 0x00..<0x20: "\\u00" + lowerHex(value, digits: 2)
        default: nil
        }
    }
    return "\"" + body + "\""
}

/// Stdin to EOF, as the full tool reads a value: at most 16 MiB (INVALID_ARGUMENT beyond, the rest
/// unread), a read error ends the input. One buffer, never grown (no stale copies), wiped after use.
func readValue() -> [UInt8] {
    let limit = 16 << 20
    var length = 0
    var value = [UInt8](unsafeUninitializedCapacity: limit + 1) { buffer, count in
        while length <= limit {
            guard case .success(let n) = valueOrErrno({ read(0, buffer.baseAddress! + length, limit + 1 - length) }), n > 0 else { break }
            length += n
        }
        count = length
    }
    guard length <= limit else {
        value.wipe()
        Failure("INVALID_ARGUMENT", "The input on stdin is longer than the \(limit) bytes allowed here").report()
    }
    return value
}

/// One exchange of the front: `call`'s request, then keychaind's reply read as `call`'s (an error
/// reply reported as the full tool does).
private func frontExchange<Request, Reply>(_ call: WireCall<Request, Reply>, _ message: WireMessage, on fd: Int32, socket: String,
                                           for fast: FastCommand) -> Reply {
    do throws(WireError) {
        let first = try WireSocket.exchange(fd, message, idle: 120, stall: 10)
        let reply = try WireReply.awaiting(first, unreadable: { $0 }) { _ throws(WireError) in
            // The full tool has an authenticator: it asks the question. This request ends
            // unanswered (keychaind takes the closed connection for an interrupted prompt,
            // which changes nothing) and the full tool makes the read again; a get has read
            // no stdin.
            if fast.op == .getItem && fast.attempts != nil {
                close(fd)
                runFullTool()
            }
            // No authenticator: the full tool answers "interrupted", and so does the front.
            return try WireSocket.exchange(fd, WirePromptAnswer.interrupted.message, idle: 120, stall: 10)
        }
        var result: WireMessage
        do throws(Failure) { result = try (consume reply).result(thrown: Failure.init, unknown: Failure.init) } catch { error.report() }
        defer { result.wipe() }
        return try call.reply(from: result)
    } catch {
        Failure(WireFailure(exchanging: error, socket: socket, replyTimeout: 120)).report()
    }
}

// MARK: The run

/// keychainctl's entry point. `fullToolInThisExecutable`: the full tool is this very program (keychain-multicall),
/// run again as keychainctl-full rather than looked for beside it.
public func keychainctlMain(fullToolInThisExecutable: Bool = false) -> Never {
    fullToolIsThisExecutable = fullToolInThisExecutable
    guard let args = strictArguments(), let inv = Invocation(args), let socket = daemonSocket(),
          !inv.switches.contains("--direct"), inv.flags["--store"] == nil, inv.flags["--tcti"] == nil,
          let fast = FastCommand(inv) else {
        runFullTool()
    }
    let storage = WireStorage(options: WireStorageOptions(service: fast.service, accessGroup: fast.accessGroup).encoded(), key: fast.key)

    // The full tool's order: its checks, then stdin (set), then the connection.
    var first = switch fast.op {
    case .setItem:
        // Moved into the request without another reference, so the request's wipe zeroes it in place.
        WireCall.setItem.request(WireSetItem(storage: storage, value: readValue(), options: WireSetOptions(
            accessible: fast.flags["--accessible"], accessControl: fast.flags["--access-control"], label: fast.flags["--label"],
            synchronizable: fast.synchronizable ? true : nil)))
    case .getItem: WireCall.getItem.request(WireGetItem(storage: storage, attempts: fast.attempts))
    case .allKeys: WireCall.allKeys.request(storage)
    case .clear: WireCall.clear.request(storage)
    default: WireCall.hasItem.request(storage)  // hasItem, and removeItem's first question
    }

    let fd: Int32
    switch WireSocket.connect(path: socket) {
    case .success(let connected): fd = connected
    case .failure(let error):
        first.wipe()
        Failure(WireFailure(connecting: error, socket: socket)).report()
    }

    func exchange<Reply>(_ call: WireCall<some WireFields, Reply>, _ message: WireMessage) -> Reply {
        frontExchange(call, message, on: fd, socket: socket, for: fast)
    }

    switch fast.op {
    case .getItem:
        guard var value = exchange(WireCall.getItem, first).bytes else {
            guard fast.json else { fail("no item '\(escaped(fast.key!))' in service '\(escaped(fast.service))'", 1) }
            let message = "No item '\(fast.key!)' in service '\(fast.service)'"
            writeAll(1, Array("{\"error\":{\"code\":\"NOT_FOUND\",\"message\":\(jsonEncoded(message))}}\n".utf8))
            exit(1)
        }
        writeAll(1, value)
        value.wipe()
    case .hasItem, .removeItem:
        guard let present = exchange(WireCall.hasItem, first).value else {
            Failure("INTERNAL", "The keychain service's reply has no boolean result").report()
        }
        if fast.op == .removeItem { _ = exchange(WireCall.removeItem, WireCall.removeItem.request(storage)) }
        if fast.json { writeAll(1, Array("{\"\(fast.op == .removeItem ? "removed" : "present")\":\(present)}\n".utf8)) }
        exit(present ? 0 : 1)
    case .allKeys:
        guard let bytes = exchange(WireCall.allKeys, first).json else { Failure("INTERNAL", "The keychain service's reply has no result").report() }
        // A reply this parser does not read: the full tool asks again and words it (a read changes nothing).
        guard let keys = WireJSONStrings.decode(bytes) else { close(fd); runFullTool() }
        let text = fast.json ? "[" + keys.map(jsonEncoded).joined(separator: ",") + "]\n" : keys.map { escaped($0) + "\n" }.joined()
        writeAll(1, Array(text.utf8))
    case .setItem:
        _ = exchange(WireCall.setItem, first)
        first.wipe()
        if fast.json { writeAll(1, Array("{\"stored\":true}\n".utf8)) }
    case .clear:
        _ = exchange(WireCall.clear, first)
        if fast.json { writeAll(1, Array("{\"cleared\":true}\n".utf8)) }
    default:
        break  // FastCommand makes no other
    }
    exit(0)
}
