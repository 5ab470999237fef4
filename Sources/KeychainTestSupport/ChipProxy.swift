import Foundation
import Synchronization
import TPM2
import KeychainBasics

/// A TPM that behaves like a chip: a proxy on swtpm's two Unix sockets that applies a `TPMProfile`.
///
/// On swtpm's server socket, tpm2-tss's swtpm TCTI sends each command as the TPM takes it (header:
/// tag, size, command code) and swtpm answers the bare response; the locality and the rest go over
/// the control socket, relayed as it is. (The mssim TCTI's framing, TPM_SEND_COMMAND with a locality and
/// a length, is not used here: seen on the wire.) The proxy reads whole commands, so it can answer in the
/// chip's place (a missing command, a warning), edit an answer (GetCapability(TPM_CAP_COMMANDS)) and
/// hold one back for the chip's time. The TCTI connects for each command: one thread per connection.
final class ChipProxy: @unchecked Sendable {
    private let profile: TPMProfile
    private let upstream: String
    private let listeners: [Int32]
    private let open = Mutex<Set<Int32>>([])
    private let state = Mutex<(stopped: Bool, seen: [UInt32], warnings: [TPMProfile.Warning], answered: [TPMExchange])>((false, [], [], []))

    /// The command codes the proxy was sent, in order (refused and warned ones included).
    var commandsSeen: [UInt32] { state.withLock { $0.seen } }
    /// The commands swtpm answered, in order, with their answers' codes.
    var exchangesSeen: [TPMExchange] { state.withLock { $0.answered } }

    /// Listens on `socket` and `socket.ctrl` and forwards to swtpm's `upstream` and `upstream.ctrl`.
    init(profile: TPMProfile, socket: String, upstream: String) throws {
        self.profile = profile
        self.upstream = upstream
        state.withLock { $0.warnings = profile.warnings }
        var listeners: [Int32] = []
        do {
            for path in [socket, socket + ".ctrl"] { listeners.append(try Self.listen(path)) }
        } catch {
            listeners.forEach { _ = close($0) }
            throw error
        }
        self.listeners = listeners
        for (index, listener) in listeners.enumerated() {
            Thread.detachNewThread { [self] in accept(on: listener, control: index == 1) }
        }
    }

    deinit { stop() }

    /// Stops listening and ends the connections being served.
    func stop() {
        let first = state.withLock { state in defer { state.stopped = true }; return !state.stopped }
        guard first else { return }
        // shutdown wakes a thread blocked in accept or read on the descriptor; each thread closes its own.
        for fd in listeners { shutdown(fd, Int32(SHUT_RDWR)) }
        open.withLock { fds in for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) } }
    }

    private var stopped: Bool { state.withLock { $0.stopped } }

    private func accept(on listener: Int32, control: Bool) {
        defer { close(listener) }
        while !stopped {
            let client = Glibc.accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            Thread.detachNewThread { [self] in serve(client, control: control) }
        }
    }

    private func serve(_ client: Int32, control: Bool) {
        guard let server = try? Self.connect(control ? upstream + ".ctrl" : upstream) else {
            close(client)
            return
        }
        let tracked = open.withLock { fds in
            guard !stopped else { return false }
            fds.formUnion([client, server])
            return true
        }
        defer {
            open.withLock { fds in fds.subtract([client, server]) }
            close(client)
            close(server)
        }
        guard tracked else { return }
        if control { relay(client, server) } else { serveCommands(client, server) }
    }

    /// Whole commands, one at a time: each is answered before the next is read.
    private func serveCommands(_ client: Int32, _ server: Int32) {
        while let command = Self.readMessage(client) {
            let code = Self.u32(command, 6)
            let refusal: TPMReturnCode? = state.withLock { state in
                state.seen.append(code)
                if profile.missingCommands.contains(code) { return .commandCode }
                if let refusal = nvBufferRefusal(command) { return refusal }
                guard let index = state.warnings.firstIndex(where: { $0.command == code && $0.times > 0 }) else { return nil }
                state.warnings[index].times -= 1
                return state.warnings[index].code
            }
            var response: [UInt8]
            if let refusal {
                response = [0x80, 0x01] + Self.bytes(UInt32(10)) + Self.bytes(refusal.rawValue)
            } else {
                guard Self.write(server, command), let answer = Self.readMessage(server) else { return }
                response = answer
                if code == TPMProfile.Command.getCapability {
                    response = withNVBufferMax(command, withoutMissingCommands(command, response))
                }
                // StartAuthSession's first handle is tpmKey: TPM_RH_NULL for an unsalted session.
                let salted = code == TPMProfile.Command.startAuthSession && command.count >= 14 && Self.u32(command, 10) != 0x4000_0007
                state.withLock { state in
                    state.answered.append(TPMExchange(command: code, salted: salted, responseCode: Self.u32(response, 6),
                                                      unsealAnswer: code == TPMProfile.Command.unseal ? response : []))
                }
                let latency = profile.latency(command: code, salted: salted)
                let (seconds, attoseconds) = latency.components
                if latency > .zero { usleep(useconds_t(seconds * 1_000_000 + attoseconds / 1_000_000_000_000)) }
            }
            guard Self.write(client, response) else { return }
        }
    }

    /// One TPM command or response: the 10-byte header (tag, size, code) and the rest its size gives.
    /// Nil at the end of the stream, an error, or a size no TPM message has (under 10, over 64 KiB).
    private static func readMessage(_ fd: Int32) -> [UInt8]? {
        guard let header = read(fd, 10) else { return nil }
        let size = Int(u32(header, 2))
        guard size >= 10, size <= 1 << 16, let rest = read(fd, size - 10) else { return nil }
        return header + rest
    }

    /// GetCapability(TPM_CAP_COMMANDS)'s answer without the commands the profile lacks (Part 3, 30.2:
    /// moreData, then TPMS_CAPABILITY_DATA: capability, TPML_CCA count, TPMA_CC entries).
    private func withoutMissingCommands(_ command: [UInt8], _ response: [UInt8]) -> [UInt8] {
        // A command without sessions: the capability is the first parameter, after the 10-byte header.
        guard !profile.missingCommands.isEmpty, command.count >= 22, Self.u32(command, 10) == 2 /* TPM_CAP_COMMANDS */,
              response.count >= 19, Self.u32(response, 6) == 0, Self.u32(response, 11) == 2 else { return response }
        let count = Int(Self.u32(response, 15))
        guard response.count >= 19 + 4 * count else { return response }
        let kept = (0..<count).map { Self.u32(response, 19 + 4 * $0) }
            .filter { attributes in !(attributes & 0x2000_0000 == 0 && profile.missingCommands.contains(attributes & 0xFFFF)) }
        let body = Array(response[10..<15]) + Self.bytes(UInt32(kept.count)) + kept.flatMap(Self.bytes)
            + Array(response[(19 + 4 * count)...])
        return Array(response[0..<2]) + Self.bytes(UInt32(10 + body.count)) + Array(response[6..<10]) + body
    }

    /// The chip's answer to an NV_Read or NV_Write of more than its NV buffer (`TPMProfile.nvBufferMax`):
    /// NV_Read's `size` is TPM_RC_VALUE on parameter 1 (Part 3, 31.13), NV_Write's data does not
    /// unmarshal, TPM_RC_SIZE on parameter 1 (a TPM2B_MAX_NV_BUFFER larger than MAX_NV_BUFFER_SIZE).
    /// Both have sessions: handles (8 bytes), the authorization area's size and bytes, then the parameters.
    private func nvBufferRefusal(_ command: [UInt8]) -> TPMReturnCode? {
        guard let limit = profile.nvBufferMax, command.count >= 22 else { return nil }
        let code = Self.u32(command, 6)
        guard code == TPMProfile.Command.nvRead || code == TPMProfile.Command.nvWrite else { return nil }
        let parameters = 22 + Int(Self.u32(command, 18))
        guard command.count >= parameters + 2 else { return nil }
        let size = Int(command[parameters]) << 8 | Int(command[parameters + 1])
        guard size > limit else { return nil }
        return TPMReturnCode(rawValue: code == TPMProfile.Command.nvRead ? 0x1C4 : 0x1D5)
    }

    /// GetCapability(TPM_CAP_TPM_PROPERTIES)'s TPM_PT_NV_BUFFER_MAX (0x12C) as the profile's, so that a
    /// client that sizes its NV reads by it (tpm2-tools) sees the chip's (Part 2, TPML_TAGGED_TPM_PROPERTY).
    private func withNVBufferMax(_ command: [UInt8], _ response: [UInt8]) -> [UInt8] {
        guard let limit = profile.nvBufferMax, command.count >= 22, Self.u32(command, 10) == 6 /* TPM_CAP_TPM_PROPERTIES */,
              response.count >= 19, Self.u32(response, 6) == 0, Self.u32(response, 11) == 6 else { return response }
        var response = response
        let count = Int(Self.u32(response, 15))
        for entry in 0..<count where 19 + 8 * entry + 8 <= response.count && Self.u32(response, 19 + 8 * entry) == 0x12C {
            response.replaceSubrange((23 + 8 * entry)..<(27 + 8 * entry), with: Self.bytes(UInt32(limit)))
        }
        return response
    }

    /// Both directions as they come, until either side closes.
    private func relay(_ a: Int32, _ b: Int32) {
        var fds = [pollfd(fd: a, events: Int16(POLLIN), revents: 0), pollfd(fd: b, events: Int16(POLLIN), revents: 0)]
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            guard poll(&fds, 2, -1) >= 0 || errno == EINTR else { return }
            for (from, to) in [(0, 1), (1, 0)] where fds[from].revents != 0 {
                let count = Glibc.read(fds[from].fd, &buffer, buffer.count)
                guard count > 0, Self.write(fds[to].fd, Array(buffer[..<count])) else { return }
            }
        }
    }

    // MARK: Sockets and bytes

    private static func address(_ path: String) throws -> sockaddr_un {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { throw SoftwareTPMError("socket path too long: \(path)") }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: bytes) }
        return address
    }

    private static func listen(_ path: String) throws -> Int32 {
        var address = try address(path)
        unlink(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SoftwareTPMError("cannot make a socket: errno \(errno)") }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o600) == 0, Glibc.listen(fd, 16) == 0 else {
            let error = errno
            close(fd)
            throw SoftwareTPMError("cannot listen on \(path): errno \(error)")
        }
        return fd
    }

    private static func connect(_ path: String) throws -> Int32 {
        var address = try address(path)
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SoftwareTPMError("cannot make a socket: errno \(errno)") }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else {
            close(fd)
            throw SoftwareTPMError("cannot connect to \(path): errno \(errno)")
        }
        return fd
    }

    /// Exactly `count` bytes; nil at the end of the stream or an error. Bounded: no frame of a TPM
    /// (at most a few KiB) comes near 1 MiB.
    private static func read(_ fd: Int32, _ count: Int) -> [UInt8]? {
        guard count <= 1 << 20 else { return nil }
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let got = valueOrErrno { bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress! + done, count - done) } }
            guard case .success(let n) = got, n > 0 else { return nil }
            done += n
        }
        return bytes
    }

    private static func write(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var done = 0
        while done < bytes.count {
            let sent = valueOrErrno { bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL)) } }
            guard case .success(let n) = sent, n > 0 else { return false }
            done += n
        }
        return true
    }

    private static func u32(_ bytes: [UInt8], _ offset: Int) -> UInt32 {
        bytes[offset..<offset + 4].reduce(0) { $0 << 8 | UInt32($1) }
    }

    private static func bytes(_ value: UInt32) -> [UInt8] { (0..<4).map { UInt8(truncatingIfNeeded: value >> (24 - 8 * $0)) } }
}

/// One command swtpm answered behind a profile's proxy: what keychaind sent, as a bus analyser sees it.
public struct TPMExchange: Sendable {
    public let command: UInt32
    /// A StartAuthSession salted with a key (its tpmKey is not TPM_RH_NULL).
    public let salted: Bool
    /// The answer's response code (0: success).
    public let responseCode: UInt32
    /// An Unseal's whole answer as it crossed the wire (empty for other commands).
    public let unsealAnswer: [UInt8]
}
