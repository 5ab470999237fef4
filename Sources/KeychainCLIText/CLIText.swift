// What keychainctl's two executables (the front and keychainctl-full) must say alike: one copy,
// so their outputs cannot drift apart. No Foundation: the front links this alone.

import Glibc
import KeychainBasics

/// keychainctl's options: those that take a value, and those that stand alone.
public enum CLIOptions {
    public static let valued: Set<String> = [
        "--store", "--tcti", "--accessible", "--access-control", "--label", "--auth-validity", "--pcrs", "--touch", "--reader",
        "--pkcs11-uri", "--key-storage", "--owner-auth-file", "--owner-auth-out", "--lockout-auth-out", "--service", "--out", "--cost",
        "--pcr", "--version", "--ek-ca", "--parent", "--to", "--key", "--generation", "--boot-policy-key", "--access-group",
        "--credential",
        "--state", "--ledger", "--expect-boot-state", "--nonce", "--identity", "--endorsement-key",
    ]
    public static let booleans: Set<String> = [
        "--json", "--synchronizable", "--passcode-stdin", "--allow-empty-owner-auth", "--help", "-h", "--passphrase-stdin", "--direct",
        "--unattested-srk", "--user",
    ]
}

/// Makes text safe for a terminal: control characters (C0, DEL, C1), bidirectional overrides and
/// the backslash are written as escapes, so a key cannot move the cursor, forge lines or recolour.
public func escaped(_ text: String) -> String {
    replacingScalars(of: text) { value in
        switch value {
        case 0x5C: "\\\\"
        case 0x0A: "\\n"
        case 0x0D: "\\r"
        case 0x09: "\\t"
        case 0x00..<0x20, 0x7F: "\\x" + lowerHex(value, digits: 2)
        case 0x80..<0xA0, 0x202A...0x202E, 0x2066...0x2069: "\\u{" + lowerHex(value, digits: 4) + "}"
        default: nil
        }
    }
}

/// `text` with every scalar `escape` gives an escape for written as that escape, the others as they are.
public func replacingScalars(of text: String, with escape: (UInt32) -> String?) -> String {
    var out = ""
    for scalar in text.unicodeScalars {
        if let escaped = escape(scalar.value) { out += escaped } else { out.unicodeScalars.append(scalar) }
    }
    return out
}

/// A field that came from someone else (a unit name from a peer's address, a path, an ID), as a log
/// line may hold it: one word that cannot end the line, forge another or move a terminal's cursor.
/// As systemd escapes a unit name, every byte but printable ASCII (space, control bytes, a NUL, a backslash,
/// UTF-8's bytes) is written `\xNN`; past `limit` bytes the rest is cut and counted.
public func logField(_ bytes: some Collection<UInt8>, limit: Int = 256) -> String {
    var out = ""
    for byte in bytes.prefix(limit) {
        if byte > 0x20 && byte < 0x7F && byte != 0x5C {
            out.unicodeScalars.append(Unicode.Scalar(byte))
        } else {
            out += "\\x" + lowerHex(byte, digits: 2)
        }
    }
    if bytes.count > limit { out += "…(\(bytes.count) bytes)" }
    return out
}

/// `text`'s UTF-8 as `logField(_:limit:)` writes bytes.
public func logField(_ text: some StringProtocol, limit: Int = 256) -> String {
    logField(Array(text.utf8), limit: limit)
}

/// `value` in lower-case hex, at least `digits` long.
public func lowerHex(_ value: some BinaryInteger, digits: Int) -> String {
    Hex.encode(value, digits: digits)
}

/// `bytes` in lower-case hex, two digits each: names, tags and values as the keychain writes them.
public func lowerHex(_ bytes: some Sequence<UInt8>) -> String {
    Hex.encode(bytes)
}

/// Writes everything it can; a closed stdout or stderr is not an error.
public func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
    var at = 0
    while at < bytes.count {
        let result = valueOrErrno { bytes.withUnsafeBytes { write(fd, $0.baseAddress! + at, bytes.count - at) } }
        guard case .success(let n) = result, n > 0 else { return }
        at += n
    }
}

/// `text` in UTF-8 to `fd`, as `writeAll(_:_:)` writes bytes: a program's lines to stderr.
public func writeAll(_ fd: Int32, _ text: String) {
    writeAll(fd, Array(text.utf8))
}

/// A usage error in keychainctl's grammar, in the words the full tool prints.
public struct CLIUsageError: Error {
    public let message: String
}

/// keychainctl's arguments by its one grammar: options anywhere, `--name=value` or `--name value`,
/// `--` ending the options (a key or service that starts with `--` comes after it).
public struct ParsedArguments {
    public var command: [String] = []
    /// The last value of each valued option.
    public var flags: [String: String] = [:]
    public var switches: Set<String> = []
    /// Options given more than once (`--pcr 0=HEX --pcr 7=HEX`), every value in order.
    public var repeated: [String: [String]] = [:]

    public init(_ args: [String]) throws(CLIUsageError) {
        var i = 0
        while i < args.count {
            let arg = args[i]
            if arg == "--" {
                command += args[(i + 1)...]
                break
            } else if arg.hasPrefix("--"), let eq = arg.firstIndex(of: "=") {
                let name = String(arg[..<eq])
                guard CLIOptions.valued.contains(name) else { throw CLIUsageError(message: "unknown option \(name) (or it takes no value)") }
                set(name, String(arg[arg.index(after: eq)...]))
            } else if CLIOptions.valued.contains(arg) {
                guard i + 1 < args.count else { throw CLIUsageError(message: "\(arg) needs a value") }
                set(arg, args[i + 1])
                i += 1
            } else if CLIOptions.booleans.contains(arg) {
                switches.insert(arg)
            } else if arg.hasPrefix("--") {
                throw CLIUsageError(message: "unknown option \(arg) (a key or service that starts with -- goes after --)")
            } else {
                command.append(arg)
            }
            i += 1
        }
    }

    private mutating func set(_ name: String, _ value: String) {
        flags[name] = value
        repeated[name, default: []].append(value)
    }
}
