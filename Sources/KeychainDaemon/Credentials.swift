import Glibc
import Dispatch
import KeychainEngine
import KeychainCLIText

/// systemd's side of `LoadCredential=ID:/run/keychain/credentials.sock`: at a unit's start the service
/// manager connects from the abstract address `\0<16 hex>/unit/<unit>/<ID>` and reads until EOF.
///
/// Each connection is answered once: the value and a close, or a refusal that fails the manager's read so
/// that the unit does not start (`refuse`). A plain close would not do: systemd 252 takes an empty read for
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

/// The credentials socket's door of keychaind's one connection server (`ConnectionServer`): its limits,
/// slots and log are the keychain socket's, so a user who holds connections here holds at most its
/// quarter of keychaind's descriptors and threads, each for at most a refusal's deadline.
/// - Parameter service: keychaind's engine (`DaemonServer.handler.service`): each request is one
///   `getItem` in the manager's `ItemScope.credentials`, with no authenticator (nobody can answer a
///   prompt at a unit's start, so an item behind an access control is refused).
/// - Parameter relay: keychain-journal-relay's socket, when keychaind was given one: each refusal of a
///   request's unit is also told to the unit's own journal.
package func credentialsDoor(service: any KeychainService, stallTimeout: Int, relay: JournalRelayClient?) -> ConnectionServer.Door {
    .init(name: "credentials socket", tellsApplications: false, serve: { fd, peer in
        answerCredential(fd, peer: peer, service: service, stallTimeout: stallTimeout, relay: relay)
    }, refuse: { fd, _ in
        // On the accept loop, non-blocking: what the socket takes now (the server logs the reason).
        sendRefusal(fd, until: .now)
    })
}

/// One unit's request: the value, or a refusal and a line in the log naming unit, ID and reason.
/// - Parameter stallTimeout: seconds the value may take to send in all (the server's write deadline is per send).
private func answerCredential(_ fd: Int32, peer: Peer, service: any KeychainService, stallTimeout: Int,
                              relay: JournalRelayClient?) {
    let address = peerAddress(fd)
    guard let request = address.flatMap({ CredentialRequest.parse(peerAddress: $0, uid: peer.uid) }) else {
        let from = address.map { "'" + logField($0) + "'" } ?? "no address"
        return refuse(fd, peer: peer, "uid \(peer.uid) pid \(peer.pid) connected from \(from), an address systemd does not use (not \\0<16 hex>/unit/<unit>/<ID>): only a service manager's "
                      + "LoadCredential= is served here")
    }
    let who = "unit \(logField(request.unit)) (\(request.manager)) credential \(logField(request.id))"
    // The unit's own journal gets the reason too (keychain-journal-relay escapes it), without the unit's name.
    func refuseRequest(_ reason: String) {
        relay?.tell(RelayedRefusal(manager: request.manager, unit: request.unit, reason: "credential \(request.id): \(reason)"))
        refuse(fd, peer: peer, "\(who): \(reason)")
    }
    let result = Result { () throws(KeychainError) -> SecureBytes? in
        try waitFor { () async throws(KeychainError) -> SecureBytes? in
            let storage = try SystemdCredentials.storage(unit: request.unit, manager: request.manager)
            return try await service.getItem(request.id, options: nil, in: storage, authenticator: nil)
        }
    }
    switch result {
    case .failure(let error):
        refuseRequest("\(error.code.rawValue): \(error.message)")
    case .success(nil):
        refuseRequest("no such credential (\(storeCommand(request)))")
    case .success(let value?):
        let deadline = ContinuousClock.now + .seconds(stallTimeout)
        let sent = value.withUnsafeBytes { send(fd, $0, until: deadline) }
        let code = errno
        if sent == value.count {
            DaemonLog.say("keychaind: \(who): served to pid \(peer.pid)", uid: peer.uid)
        } else {
            refuseRequest("the service manager did not read the value within \(stallTimeout) s "
                   + "or went away (errno \(code))")
        }
    }
}

/// The command that stores the credential `request` asked for: the administrator's for a system unit, the user's
/// own `--user` one for a user manager's unit (its namespace holds only what that uid stored for itself). For the
/// log: the unit and ID came from the caller's address, so they are escaped (`logField`).
func storeCommand(_ request: CredentialRequest) -> String {
    switch request.manager {
    case .system: "keychainctl credential set \(logField(request.unit)) \(logField(request.id))"
    case .user(let uid): "as uid \(uid): keychainctl credential set --user \(logField(request.unit)) \(logField(request.id))"
    }
}

/// Fails the manager's read, so that the unit does not start, and logs why (`reason`, one line).
///
/// The refusal (`sendRefusal`) is written within `refusalTime` in all: systemd reads it at once, and a
/// client that does not read holds its slot no longer than that.
private func refuse(_ fd: Int32, peer: Peer, _ reason: String) {
    sendRefusal(fd, until: .now + refusalTime)
    DaemonLog.say("keychaind: refused: \(reason)", uid: peer.uid)
}

/// How long a refusal may take to write: systemd reads its 1 MiB in milliseconds.
private let refusalTime = Duration.seconds(2)

/// More than systemd's 1 MiB credential limit (status 243/CREDENTIALS), as much of it as is sent by
/// `deadline`, then a reset (SO_LINGER 0) at the server's close. A plain close would not do: systemd 252 takes an empty read for an empty credential and
/// starts the unit with an empty file (seen in the booted container). The server closes the socket after.
private func sendRefusal(_ fd: Int32, until deadline: ContinuousClock.Instant) {
    let chunk = [UInt8](repeating: 0, count: 64 << 10)
    var sent = 0
    while sent <= 1 << 20 {
        let n = chunk.withUnsafeBytes { send(fd, $0, until: deadline) }
        sent += n
        if n < chunk.count { break }
    }
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    _ = setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
}

/// Sends `bytes` until they are all sent, the peer goes away or `deadline` passes (or at once, on a
/// non-blocking socket, when it takes no more); the count sent.
private func send(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, until deadline: ContinuousClock.Instant) -> Int {
    var offset = 0
    while offset < bytes.count {
        let left = deadline - .now
        // The per-send deadline made the whole's: what is left of it (SO_SNDTIMEO 0 would mean none).
        var timeout = timeval(tv_sec: max(0, Int(left.components.seconds)),
                              tv_usec: max(1, Int(left.components.attoseconds / 1_000_000_000_000)))
        if left <= .zero { timeout = timeval(tv_sec: 0, tv_usec: 1) }
        _ = setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let n = Glibc.send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
        if n > 0 { offset += n } else if n < 0 && errno == EINTR && .now < deadline { continue } else { break }
    }
    return offset
}

/// The address a connected Unix socket's peer connected from (getpeername), nil when there is none to read.
private func peerAddress(_ fd: Int32) -> [UInt8]? {
    var storage = sockaddr_un()
    var addressLength = socklen_t(MemoryLayout<sockaddr_un>.size)
    let named = withUnsafeMutablePointer(to: &storage) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &addressLength) }
    }
    guard named == 0 else { return nil }
    let pathLength = max(0, Int(addressLength) - MemoryLayout<sa_family_t>.size)
    return withUnsafeBytes(of: &storage.sun_path) { Array($0.prefix(pathLength)) }
}

