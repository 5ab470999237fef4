import Glibc
import Dispatch
import Keychain
import KeychainCLIText

/// systemd's side of `LoadCredential=ID:/run/keychain/credentials.sock`: at a unit's start the service
/// manager connects from the abstract address `\0<16 hex>/unit/<unit>/<ID>` and reads until EOF.
///
/// Each connection is answered once: the value and a close, or a refusal that fails the manager's read so
/// that the unit does not start (`refuseConnection`). A plain close would not do: systemd 252 takes an empty read for
/// an empty credential and starts the unit with an empty file.
struct CredentialRequest: Equatable {
    var manager: SystemdCredentials.Manager
    var unit: String
    var id: String

    /// The unit and ID from the peer's address, nil for an address systemd does not make. The random part is
    /// a 64-bit number in hex without leading zeros: up to 16 digits, fewer one time in sixteen (seen in the
    /// booted container: a 15-digit address was refused and its unit failed).
    static func parse(peerAddress bytes: [UInt8], uid: UInt32) -> CredentialRequest? {
        // sun_path of an abstract address: a NUL, then the name (no terminator).
        guard bytes.first == 0, let name = String(validating: bytes.dropFirst(), as: UTF8.self) else { return nil }
        let parts = name.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 4, (1...16).contains(parts[0].utf8.count), parts[0].utf8.allSatisfy(\.isHexDigit), parts[1] == "unit",
              !parts[2].isEmpty, !parts[3].isEmpty else { return nil }
        return CredentialRequest(manager: .init(uid: uid), unit: String(parts[2]), id: String(parts[3]))
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool { (0x30...0x39).contains(self) || (0x61...0x66).contains(self) || (0x41...0x46).contains(self) }
}

/// Accepts on the credentials socket forever, one thread per connection (a unit's start waits on it).
/// - Parameter service: keychaind's engine (`DaemonServer.handler.service`): each request is one
///   `getItem` in the manager's `ItemScope.credentials`, with no authenticator (nobody can answer a
///   prompt at a unit's start, so an item behind an access control is refused).
func serveCredentials(listener: Int32, service: any KeychainService, relay: JournalRelayClient?) {
    while true {
        let fd = accept(listener, nil, nil)
        if fd < 0 {
            if errno == EMFILE || errno == ENFILE || errno == ENOMEM { usleep(50_000) }
            continue
        }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        if let code = DetachedThread.start(stackSize: 1 << 20, { answerCredential(fd, service: service, relay: relay) }) {
            refuseConnection(fd, "no thread for the request (pthread_create: errno \(code))")
        }
    }
}

/// One unit's request: the value, or a reset and a line in the log naming unit, ID and reason.
private func answerCredential(_ fd: Int32, service: any KeychainService, relay: JournalRelayClient?) {
    guard let peer = CredentialPeer(fd) else { return refuseConnection(fd, "a peer without credentials (SO_PEERCRED)") }
    guard let request = CredentialRequest.parse(peerAddress: peer.address, uid: peer.uid) else {
        return refuseConnection(fd, "uid \(peer.uid) pid \(peer.pid) connected from an address systemd does not use "
                      + "(not \\0<16 hex>/unit/<unit>/<ID>): only a service manager's LoadCredential= is served here")
    }
    let who = "unit \(request.unit) (\(request.manager)) credential \(request.id)"
    // The unit's own journal gets the reason too (keychain-journal-relay), without the unit's name repeated.
    func refuse(_ fd: Int32, _ reason: String) {
        relay?.tell(RelayedRefusal(manager: request.manager, unit: request.unit, reason: "credential \(request.id): \(reason)"))
        refuseConnection(fd, "\(who): \(reason)")
    }
    let result = blocking { () async throws(KeychainError) -> SecureBytes? in
        let storage = try SystemdCredentials.storage(unit: request.unit, manager: request.manager)
        return try await service.getItem(request.id, options: nil, in: storage, authenticator: nil)
    }
    switch result {
    case .failure(let error):
        refuse(fd, "\(error.code.rawValue): \(error.message)")
    case .success(nil):
        refuse(fd, "no such credential (\(storeCommand(request)))")
    case .success(let value?):
        let sent = value.withUnsafeBytes { raw -> Bool in
            var offset = 0
            while offset < raw.count {
                let n = send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n > 0 { offset += n } else if n < 0 && errno == EINTR { continue } else { return false }
            }
            return true
        }
        if sent {
            close(fd)
            log("keychaind: \(who): served to pid \(peer.pid)")
        } else {
            refuse(fd, "the service manager went away before the value was sent (errno \(errno))")
        }
    }
}

/// The command that stores the credential `request` asked for: the administrator's for a system unit, the user's
/// own `--user` one for a user manager's unit (its namespace holds only what that uid stored for itself).
func storeCommand(_ request: CredentialRequest) -> String {
    switch request.manager {
    case .system: "keychainctl credential set \(request.unit) \(request.id)"
    case .user(let uid): "as uid \(uid): keychainctl credential set --user \(request.unit) \(request.id)"
    }
}

/// Fails the manager's read, so that the unit does not start: more than systemd's 1 MiB credential limit
/// (status 243/CREDENTIALS), then a reset (SO_LINGER 0). A reset alone is not enough: systemd 252 started
/// the unit anyway (seen in the booted container), as it does after a plain close, with an empty file.
private func refuseConnection(_ fd: Int32, _ reason: String) {
    var timeout = timeval(tv_sec: 2, tv_usec: 0)
    _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    let chunk = [UInt8](repeating: 0, count: 64 << 10)
    var sent = 0
    while sent <= 1 << 20 {
        let n = chunk.withUnsafeBytes { send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }
        if n > 0 { sent += n } else if n < 0 && errno == EINTR { continue } else { break }
    }
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    close(fd)
    log("keychaind: refused: \(reason)")
}

private func log(_ line: String) {
    writeAll(2, line + "\n")
}

/// The peer of a connected Unix socket: its kernel credentials and the address it connected from.
private struct CredentialPeer {
    var pid: Int32
    var uid: UInt32
    var address: [UInt8]

    init?(_ fd: Int32) {
        guard let peer = Peer(socket: fd) else { return nil }
        var storage = sockaddr_un()
        var addressLength = socklen_t(MemoryLayout<sockaddr_un>.size)
        let named = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &addressLength) }
        }
        guard named == 0 else { return nil }
        let pathLength = max(0, Int(addressLength) - MemoryLayout<sa_family_t>.size)
        address = withUnsafeBytes(of: &storage.sun_path) { Array($0.prefix(pathLength)) }
        pid = peer.pid
        uid = peer.uid
    }
}

/// Runs an async call to its end on this thread (a credential connection's own thread, the start's).
func blocking<T: Sendable>(_ body: @escaping @Sendable () async throws(KeychainError) -> T) -> Result<T, KeychainError> {
    let done = DispatchSemaphore(value: 0)
    let box = ResultBox<T>()
    Task {
        do throws(KeychainError) { box.result = .success(try await body()) } catch { box.result = .failure(error) }
        done.signal()
    }
    done.wait()
    return box.result!
}

private final class ResultBox<T>: @unchecked Sendable {
    var result: Result<T, KeychainError>?
}
