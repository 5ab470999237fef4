#if canImport(Glibc)
import Glibc
#endif
import KeychainWire

// keychain-client: the item commands of keychainctl through keychaind only, in a process that loads
// no Foundation, ICU, tpm2-tss, OpenSSL or SQLite (docs/daemon.md): start-up is the Swift runtime's.
// Same outputs and exit codes as keychainctl: 0 ok (present), 1 not found, 2 usage or
// INVALID_ARGUMENT, 3 any other error. Prompts are not answered (reads behind an access control
// fail with INTERACTION_NOT_ALLOWED, as keychainctl's without --touch).

let usage = """
    usage: keychain-client get|has|rm SERVICE KEY | set SERVICE KEY (value on stdin) | ls SERVICE
      Through keychaind at KEYCHAIN_SOCKET, or /run/keychain/keychaind.sock.
    """

func fail(_ text: String, _ status: Int32) -> Never {
    let line = "keychain-client: \(text)\n"
    _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
    exit(status)
}

func output(_ bytes: [UInt8]) {
    var at = 0
    while at < bytes.count {
        let n = bytes.withUnsafeBytes { write(1, $0.baseAddress! + at, bytes.count - at) }
        if n <= 0 { if errno == EINTR { continue }; exit(3) }
        at += n
    }
}

/// A JSON string literal (the options' service).
func jsonString(_ text: String) -> String {
    var out = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case _ where scalar.value < 0x20:
            let hex = Array("0123456789abcdef")
            out += "\\u00" + String(hex[Int(scalar.value >> 4)]) + String(hex[Int(scalar.value & 15)])
        default: out.unicodeScalars.append(scalar)
        }
    }
    return out + "\""
}

/// `["a","b"]` as keychaind sends getAllKeys; the strings are ours to print one a line.
func jsonStrings(_ bytes: [UInt8]) -> [String]? {
    guard let text = String(validating: bytes, as: UTF8.self) else { return nil }
    var result: [String] = [], current = "", inString = false, escaped = false
    var scalars = text.unicodeScalars.makeIterator()
    while let c = scalars.next() {
        if !inString { if c == "\"" { inString = true; current = "" }; continue }
        if escaped {
            escaped = false
            switch c {
            case "n": current += "\n"
            case "t": current += "\t"
            case "r": current += "\r"
            case "b": current += "\u{8}"
            case "f": current += "\u{c}"
            case "u":
                var value: UInt32 = 0
                for _ in 0..<4 {
                    guard let h = scalars.next(), let digit = UInt32(String(h), radix: 16) else { return nil }
                    value = value << 4 | digit
                }
                guard let scalar = Unicode.Scalar(value) else { return nil }  // surrogate pairs: keychaind escapes none
                current.unicodeScalars.append(scalar)
            default: current.unicodeScalars.append(c)
            }
        } else if c == "\\" { escaped = true } else if c == "\"" { inString = false; result.append(current) } else { current.unicodeScalars.append(c) }
    }
    return result
}

var arguments = CommandLine.arguments.dropFirst()
guard let command = arguments.popFirst() else { fail("no command\n\(usage)", 2) }
let operands = Array(arguments)
let kind: UInt8
switch (command, operands.count) {
case ("get", 2): kind = 2
case ("has", 2): kind = 3
case ("rm", 2): kind = 4
case ("ls", 1): kind = 6
case ("set", 2): kind = 1
default: fail("usage: \(usage)", 2)
}
var request = WireMessage(kind: kind)
request.add(1, Array("{\"service\":\(jsonString(operands[0]))}".utf8))
if operands.count == 2 { request.add(2, operands[1]) }
if kind == 1 {
    var value: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
        if n < 0 { if errno == EINTR { continue }; fail("cannot read stdin: errno \(errno)", 3) }
        if n == 0 { break }
        value += buffer[0..<n]
        if value.count > 16 * 1024 * 1024 { fail("INVALID_ARGUMENT: the value on stdin is longer than 16 MiB", 2) }
    }
    buffer.wipe()
    request.add(3, value)
    value.wipe()
}

let socketPath = getenv("KEYCHAIN_SOCKET").map { String(cString: $0) }.flatMap { $0.isEmpty ? nil : $0 } ?? "/run/keychain/keychaind.sock"
let fd: Int32
switch WireSocket.connect(path: socketPath) {
case .success(let connected): fd = connected
case .failure(let error):
    fail("HARDWARE_UNAVAILABLE: The keychain service is not running: nothing answers on \(socketPath) (\(error))", 3)
}
do {
    try WireSocket.send(fd, request)
    request.wipe()
    var reply = try WireSocket.receive(fd, idle: 120, stall: 10)
    while reply.kind == 0x82 {
        // A prompt: this client has no authenticator, so the prompt is interrupted.
        var answer = WireMessage(kind: 0x83)
        answer.add(50, UInt64(4))
        try WireSocket.send(fd, answer)
        reply = try WireSocket.receive(fd, idle: 120, stall: 10)
    }
    if reply.kind == 0x81 {
        let code = (try? reply.string(30)).flatMap { $0 } ?? "INTERNAL"
        let message = (try? reply.string(31)).flatMap { $0 } ?? ""
        fail("\(code): \(message)", code == "INVALID_ARGUMENT" ? 2 : 3)
    }
    switch command {
    case "get":
        guard var value = reply.bytes(20) else { fail("no item '\(operands[1])' in service '\(operands[0])'", 1) }
        output(value)
        value.wipe()
    case "has":
        exit(((try? reply.bool(21)).flatMap { $0 } ?? false) ? 0 : 1)
    case "ls":
        for key in reply.bytes(22).flatMap(jsonStrings) ?? [] { output(Array((key + "\n").utf8)) }
    default: break
    }
    reply.wipe()
} catch {
    fail("HARDWARE_UNAVAILABLE: The keychain service stopped during the call (\(socketPath)): \(error)", 3)
}
exit(0)
