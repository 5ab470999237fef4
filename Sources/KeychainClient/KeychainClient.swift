#if canImport(Glibc)
import Glibc
#endif
@_exported import KeychainWire

// A storage on keychaind for a program that only talks to it: the item calls over the socket, with
// the library's codes, messages and causes, and nothing else linked (no Foundation, tpm2-tss,
// libcrypto, p11-kit, SQLite or libsodium; `scripts/test-outside-package.sh` checks the program it
// builds). The library's `Keychain` is the full API (prompts, device calls, the store in-process).

/// What keychaind (or the socket to it) reported: a `KeychainError`'s code, message and cause, as
/// the library would throw them.
public struct KeychainClientError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The library's `KeychainError.Code` raw value (`INVALID_ARGUMENT`, `HARDWARE_UNAVAILABLE`, …).
    public let code: String
    public let message: String
    /// What failed below the keychain, in the library's words.
    public let cause: String?

    public init(code: String, message: String, cause: String? = nil) { (self.code, self.message, self.cause) = (code, message, cause) }

    init(_ reply: WireErrorReply) { self.init(code: reply.code, message: reply.message, cause: reply.cause?.description) }

    init(_ failure: WireFailure) {
        let cause: String? = switch failure.cause {
        case .errno(let code)?: WireCause.errno(code).description
        case .detail(let text)?: text
        case nil: nil
        }
        self.init(code: failure.code, message: failure.message, cause: cause)
    }

    /// As `KeychainError.description`: `CODE: message (cause: …)`.
    public var description: String {
        var text = message.isEmpty ? code : "\(code): \(message)"
        if let cause { text += " (cause: \(cause))" }
        return text
    }
}

/// One storage (a service, its options) on keychaind. Each call is one request on a connection of
/// its own and blocks the calling thread until the reply; keychaind checks the options and who the
/// caller is (SO_PEERCRED) as for the library. A read behind an access control cannot ask the user
/// here: keychaind answers it `INTERACTION_NOT_ALLOWED`.
public struct KeychainClient: Sendable {
    /// keychaind's socket.
    public let socket: String
    public let options: WireStorageOptions
    private let encodedOptions: [UInt8]

    /// How long a reply may take (keychaind bounds its own TPM commands), and a started frame may stall.
    static let replyTimeout = 120, stallTimeout = 10

    /// - Parameters:
    ///   - options: the storage's options; the service is required (no application identifier here).
    ///   - socket: keychaind's socket; nil finds it by the rule every front door shares (`DaemonSocket`).
    /// - Throws: `INVALID_ARGUMENT` for options without a service, `HARDWARE_UNAVAILABLE` when no
    ///   socket is named and the system's does not exist.
    public init(options: WireStorageOptions, socket: String? = nil) throws(KeychainClientError) {
        guard options.service.map({ !$0.isEmpty }) ?? false else {
            throw KeychainClientError(code: "INVALID_ARGUMENT", message: "A storage on keychaind needs a service")
        }
        guard let path = socket ?? DaemonSocket.resolve() else {
            throw KeychainClientError(code: "HARDWARE_UNAVAILABLE", message: "No keychain service to reach: KEYCHAIN_SOCKET is not set "
                                      + "and \(DaemonSocket.system) does not exist (is keychaind running?)")
        }
        (self.socket, self.options, encodedOptions) = (path, options, options.encoded())
    }

    /// Stores `value` under `key`, replacing any value atomically; the buffer is wiped once sent.
    public func setItem(_ key: String, _ value: inout [UInt8], options overrides: WireSetOptions? = nil) throws(KeychainClientError) {
        _ = try call(.setItem, WireSetItem(storage: storage(key), value: value, options: overrides))
        value.wipe()
    }

    /// The value's bytes (wipe them after use), or nil when there is none.
    public func getItem(_ key: String) throws(KeychainClientError) -> [UInt8]? {
        try call(.getItem, WireGetItem(storage: storage(key))).bytes
    }

    public func hasItem(_ key: String) throws(KeychainClientError) -> Bool {
        guard let present = try call(.hasItem, storage(key)).value else {
            throw KeychainClientError(code: "INTERNAL", message: "The keychain service's reply has no boolean result")
        }
        return present
    }

    /// Removing an absent item is not an error.
    public func removeItem(_ key: String) throws(KeychainClientError) { _ = try call(.removeItem, storage(key)) }

    /// Removes every item of this storage's service and its wrapping keys.
    public func clear() throws(KeychainClientError) { _ = try call(.clear, storage(nil)) }

    /// The keys of this storage's items, sorted.
    public func getAllKeys() throws(KeychainClientError) -> [String] {
        guard let bytes = try call(.allKeys, storage(nil)).json, let keys = WireJSONStrings.decode(bytes) else {
            throw KeychainClientError(code: "INTERNAL", message: "The keychain service's reply has no list of keys")
        }
        return keys
    }

    private func storage(_ key: String?) -> WireStorage { WireStorage(options: encodedOptions, key: key) }

    /// One request and its reply's fields (an error reply thrown as the library words it).
    private func call<Request, Reply>(_ call: WireCall<Request, Reply>, _ fields: consuming Request) throws(KeychainClientError) -> Reply {
        var request = call.request(fields)
        _ = consume fields
        defer { request.wipe() }
        let fd: Int32
        switch WireSocket.connect(path: socket) {
        case .success(let connected): fd = connected
        case .failure(let error): throw KeychainClientError(WireFailure(connecting: error, socket: socket))
        }
        defer { close(fd) }
        let reply: WireReply
        do throws(WireError) {
            let first = try WireSocket.exchange(fd, request, idle: Self.replyTimeout, stall: Self.stallTimeout)
            // Asked without an authenticator (none was offered): "interrupted", as the library answers.
            reply = try WireReply.awaiting(first, unreadable: { $0 }) { _ throws(WireError) in
                try WireSocket.exchange(fd, WirePromptAnswer.interrupted.message, idle: Self.replyTimeout, stall: Self.stallTimeout)
            }
        } catch {
            throw KeychainClientError(WireFailure(exchanging: error, socket: socket, replyTimeout: Self.replyTimeout))
        }
        var result = try (consume reply).result(thrown: KeychainClientError.init, unknown: KeychainClientError.init)
        defer { result.wipe() }
        do { return try call.reply(from: result) } catch {
            throw KeychainClientError(WireFailure(exchanging: error, socket: socket, replyTimeout: Self.replyTimeout))
        }
    }
}
