// The package's parsers at each trust boundary, as libFuzzer targets (scripts/fuzz.sh; docs/security.md).
//
// Built only with `-DFUZZING -sanitize=fuzzer,address`: libFuzzer then brings `main` and calls
// `LLVMFuzzerTestOneInput` with each input, here handed to the target `KEYCHAIN_FUZZ_TARGET` names.
// The default build makes a program that says how to build the real one, so `swift build` and
// `swift test` neither need libFuzzer nor link its `main`.
#if FUZZING
internal import CSystemd
@testable import DBus
import FoundationEssentials
import Glibc
import KeychainCLIText
@testable import Keychain
@testable import KeychainEngine
@testable import Keychaind
@testable import KeychainDaemon
import KeychainWire
import PKCS11
@testable import SecretService
import SecureMemory
import Synchronization

/// One boundary: what an attacker hands the package there, through the code that reads it.
enum FuzzTarget: String, CaseIterable {
    /// keychaind's sockets: a byte stream cut into frames by the daemon's own reader, each decoded as a request.
    case frame
    /// One frame's fields as keychaind's request handler reads them (op, options, set options, attempts)
    /// and as a client reads a reply's error.
    case request
    /// The abstract address a peer of credentials.sock binds (systemd's `\0<hex>/unit/<unit>/<ID>`), and its log lines.
    case credentials
    /// A backup file's header and a chunk's body (`keychainctl restore` reads files from anywhere).
    case backup
    /// A provisioning bundle (`keychainctl import`, keychaind's importBundle).
    case bundle
    /// The identity documents a server is sent: a device identity, a verified identity, a key attestation.
    case identity
    /// A device's attestation request, up to the challenge the server makes for it.
    case attestationRequest = "attestation-request"
    /// A server's kept state and a device's answer (separated by a NUL), through the verification.
    case attestationAnswer = "attestation-answer"
    /// Item options as JSON (the library's Codable options: configuration files, wrappers' JSON).
    case options
    /// A PKCS#11 URI (RFC 7512) from the command line or the configuration.
    case pkcs11URI = "pkcs11-uri"
    /// D-Bus messages as a client of the Secret Service sends them: read by sd-bus, their arguments
    /// decoded by the provider's `Bus`, each call answered by a provider on a store of its own.
    case dbus
    /// The Secret Service's stored items, its label of attribute hashes, and a client's label,
    /// attributes and object path element (a first line of `path\0label`, then `name=value` lines).
    case secretService = "secret-service"
    /// The fingerprint reader's state file (`reader.json` in its private directory).
    case reader
    /// A datagram on keychain-journal-relay's socket (`RelayedRefusal`): keychaind's, or a sender's that
    /// reached the socket; what the root relay writes of it into a unit's journal.
    case journalRelay = "journal-relay"
    /// What keychaind and the Secret Service read of a peer in /proc (cgroup, `.flatpak-info`, mount
    /// table, a pidfd's fdinfo) and the app id the Secret portal is handed (PeerProcessTarget.swift).
    case peerProcess = "peer-process"

    /// The target `KEYCHAIN_FUZZ_TARGET` names; a missing or unknown name ends the run saying the names.
    static let chosen: FuzzTarget = {
        let name = getenv("KEYCHAIN_FUZZ_TARGET").map { String(cString: $0) } ?? ""
        guard let target = FuzzTarget(rawValue: name) else {
            let names = allCases.map(\.rawValue).joined(separator: ", ")
            writeAll(2, "keychain-fuzz: set KEYCHAIN_FUZZ_TARGET to one of \(names) (got '\(escaped(name))')\n")
            exit(2)
        }
        return target
    }()

    func run(_ bytes: [UInt8]) {
        switch self {
        case .frame: Self.frames(bytes)
        case .request: if let message = try? WireMessage.decode(bytes) { Self.request(message) }
        case .credentials: Self.credentials(bytes)
        case .backup: Self.backup(bytes)
        case .bundle: Self.bundle(bytes)
        case .identity:
            _ = try? DeviceIdentity(json: Data(bytes))
            _ = try? VerifiedIdentity(json: Data(bytes))
            _ = try? KeyAttestation(json: Data(bytes))
        case .attestationRequest:
            if let request = try? AttestationRequest(json: Data(bytes)) { _ = try? AttestationServer.challenge(for: request) }
        case .attestationAnswer: Self.attestationAnswer(bytes)
        case .options: _ = try? KeychainOptions.fromJSON(Data(bytes))
        case .pkcs11URI: if let uri = try? PKCS11URI(String(decoding: bytes, as: UTF8.self)) { _ = uri.description }
        case .dbus: Self.dbus(bytes)
        case .secretService: Self.secretService(bytes)
        case .reader: Self.reader(bytes)
        case .journalRelay: Self.journalRelay(bytes)
        case .peerProcess: Self.peerProcess(bytes)
        }
    }

    /// The bytes as a peer sends them on a socket, read by `WireReader` until it refuses or runs dry.
    private static func frames(_ bytes: [UInt8]) {
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0 else { fatalError("socketpair: errno \(errno)") }
        defer { close(pair[1]) }
        // The fuzzer's inputs (-max_len in scripts/fuzz.sh) fit a socket's buffer: one write, then EOF.
        guard bytes.withUnsafeBytes({ write(pair[0], $0.baseAddress, $0.count) }) == bytes.count else { fatalError("write: errno \(errno)") }
        shutdown(pair[0], Int32(SHUT_WR))
        close(pair[0])
        let reader = WireReader(fd: pair[1])
        while let message = try? reader.receive(idle: 1, stall: 1) { request(message) }
    }

    private static func request(_ message: WireMessage) {
        _ = WireOp(rawValue: message.kind)
        // Every operation's request codec, whatever the kind (keychaind picks one by the kind).
        if let bytes = message.bytes(WireTag.options), let options = try? KeychainOptions(wire: WireStorageOptions(decoding: bytes)),
           let service = options.service {
            _ = try? StorageRef(scope: .user(1000), options: options, defaultService: service, forWire: true)
        }
        _ = try? SetItemOptions(wire: WireCall.setItem.request(from: message).options)
        _ = try? WireCall.getItem.request(from: message)
        _ = try? WireCall.getItems.request(from: message)
        _ = try? WireCall.storageCanUse.request(from: message)
        _ = try? WireCall.attestKey.request(from: message)
        _ = try? WireDevice(from: message)
        _ = try? WireCall.importBundle.request(from: message)
        _ = try? KeychainError(decoding: message)
        if let bytes = message.bytes(WireTag.value) { _ = WireJSONStrings.decode(bytes) }
    }

    /// The address parsed, and what keychaind logs of it (a refusal names the address, a request its unit
    /// and ID): never a control byte, so no peer writes a line of its own into the log (issue 38 item 3).
    private static func credentials(_ bytes: [UInt8]) {
        var logged = [logField(bytes)]
        if let request = CredentialRequest.parse(peerAddress: bytes, uid: 1000) {
            logged.append("unit \(logField(request.unit)) credential \(logField(request.id))")
        }
        for line in logged where line.utf8.contains(where: { $0 < 0x20 || $0 == 0x7F }) {
            fatalError("a peer's address put a control byte into keychaind's log: \(lowerHex(line.utf8))")
        }
    }

    /// The bytes as a file's header (its length read from its first 16 bytes, as `BackupReader` does),
    /// and as a chunk's authenticated body (a forger who knows the passphrase writes any body).
    private static func backup(_ bytes: [UInt8]) {
        if bytes.count >= 16, let length = try? BackupFile.Header.length(prefix: Array(bytes.prefix(16))), length <= bytes.count {
            _ = try? BackupFile.Header.parse(Array(bytes.prefix(length)))
        }
        _ = try? BackupFile.parse(SecureBytes(copying: bytes))
    }

    /// A bundle as `Engine.importBundle` reads it before it opens the store or the TPM.
    private static func bundle(_ bytes: [UInt8]) {
        guard let bundle = try? ProvisioningBundle(json: Data(bytes)) else { return }
        _ = try? ProvisioningBundle.check(bundle.accessible, bundle.accessControl)
        _ = try? ProvisioningBundle.checkNames(service: bundle.service, key: bundle.key, label: bundle.label)
        _ = try? bundle.scope(importedIn: .user(1000)).storeName(bundle.service)
        _ = try? ItemProtection(accessible: bundle.accessible, accessControl: bundle.accessControl)
        _ = try? bundle.parts()
    }

    private static func attestationAnswer(_ bytes: [UInt8]) {
        let parts = bytes.split(separator: 0, maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2, let state = try? AttestationState(json: Data(parts[0])),
              let answer = try? AttestationAnswer(json: Data(parts[1])) else { return }
        _ = try? AttestationServer.verify(answer, state: state, ekCA: nil)
    }

    private static func secretService(_ bytes: [UInt8]) {
        _ = SealedItem(decoding: SecureBytes(copying: bytes))
        let text = String(decoding: bytes, as: UTF8.self)
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let first = lines.isEmpty ? [] : lines.removeFirst().split(separator: "\0", maxSplits: 1, omittingEmptySubsequences: false)
        _ = AttributeHasher.hashes(label: first.last.map(String.init))
        _ = SecretServiceProvider.isPathElement(first.first.map(String.init) ?? "")
        var attributes: [String: String] = [:]
        for line in lines {
            let pair = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            attributes[String(pair[0])] = pair.count > 1 ? String(pair[1]) : ""
        }
        guard (try? SecretServiceProvider.check(label: first.last.map(String.init) ?? "", attributes: attributes)) != nil else { return }
        // What passes the check is stored: it reads back as written.
        let item = SealedItem(label: first.last.map(String.init) ?? "", contentType: "text/plain", attributes: attributes,
                              secret: SecureBytes(copying: bytes))
        guard let back = SealedItem(decoding: item.encoded()), back.attributes == attributes, back.label == item.label else {
            fatalError("an item that passed the provider's check did not read back as written")
        }
    }

    /// The provider that answers the `dbus` target's calls: its own store and embedded swtpm in a
    /// directory made once per run, no prompter (a locked collection stays locked). At the run's exit
    /// its swtpm is stopped and the directory removed (an embedded swtpm otherwise outlives its owner).
    private static let provider: SecretServiceProvider = {
        var template = Array("/tmp/keychain-fuzz-dbus.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("mkdtemp: errno \(errno)") }
        dbusDirectory.withLock { $0 = String(cString: made) }
        atexit { FuzzTarget.removeDBusStore() }
        let configuration = KeychainConfiguration(storeDirectory: String(cString: made) + "/store", tpm: .embedded, authenticator: nil)
        do throws(DBusError) {
            let provider = try SecretServiceProvider(configuration: configuration)
            // A prompt's answer comes back from another thread: kept for the fuzzer's thread, as the bus would.
            provider.post = { work in posted.withLock { $0.append(work) } }
            return provider
        } catch {
            fatalError("The Secret Service provider does not start: \(error.name): \(error.message)")
        }
    }()
    private static let posted = Mutex<[@Sendable () -> Void]>([])
    private static let dbusDirectory = Mutex<String?>(nil)

    private static func removeDBusStore() {
        guard let directory = dbusDirectory.withLock({ $0 }) else { return }
        EmbeddedTPM.stop(storeDirectory: directory + "/store")
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The bytes follow a client's authentication on a connection whose other end is an sd-bus
    /// server: sd-bus reads the messages, `Bus.call` decodes each call, the provider answers it.
    private static func dbus(_ bytes: [UInt8]) {
        let provider = provider
        for work in posted.withLock({ queue in defer { queue = [] }; return queue }) { work() }
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue | SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else { fatalError("socketpair: errno \(errno)") }
        defer { close(pair[0]) }
        // AUTH EXTERNAL with this process's uid in hex digits of its decimal form, as a D-Bus client says it.
        let uid = String(getuid()).utf8.map { String($0, radix: 16) }.joined()
        let stream = Array("\0AUTH EXTERNAL \(uid)\r\nBEGIN\r\n".utf8) + bytes
        guard stream.withUnsafeBytes({ write(pair[0], $0.baseAddress, $0.count) }) == stream.count else { fatalError("write: errno \(errno)") }
        shutdown(pair[0], Int32(SHUT_WR))
        var bus: OpaquePointer?
        var id = sd_id128_t()
        guard sd_bus_new(&bus) >= 0, let bus, sd_id128_randomize(&id) >= 0, sd_bus_set_fd(bus, pair[1], pair[1]) >= 0,
              sd_bus_set_server(bus, 1, id) >= 0 else { fatalError("sd-bus does not make a server connection") }
        defer { sd_bus_flush_close_unref(bus) }
        guard sd_bus_start(bus) >= 0 else { return }
        // The connection ends with the input: its clients leave the bus, and their sessions and prompts go.
        var senders: Set<String> = []
        defer { for sender in senders { provider.clientVanished(sender) } }
        // Every message read, until sd-bus refuses the stream or reads its end (the input is at most -max_len).
        for _ in 0..<10_000 {
            var message: OpaquePointer?
            let status = sd_bus_process(bus, &message)
            if status < 0 { return }
            if let message {
                defer { sd_bus_message_unref(message) }
                var type: UInt8 = 0
                if sd_bus_message_get_type(message, &type) >= 0, type == UInt8(SD_BUS_MESSAGE_METHOD_CALL),
                   let call = try? Bus.call(message) {
                    _ = provider.handle(call)
                    senders.insert(call.sender)
                }
            } else if status == 0, sd_bus_wait(bus, 100_000) < 0 {
                return
            }
        }
    }

    /// The relay takes a datagram whole or drops it, and what it writes (the journal's fields, or its own line
    /// about a drop) holds no control byte and is bounded; a refusal keychaind encodes arrives as it was sent.
    private static func journalRelay(_ bytes: [UInt8]) {
        switch RelayedRefusal.parse(bytes) {
        case .failure(let drop):
            checkRelayLine(drop.why, limit: 512, of: bytes)
        case .success(let refusal):
            guard (try? SystemdCredentials.checkUnitName(refusal.unit)) != nil else {
                fatalError("the relay took a unit name systemd does not give: \(lowerHex(refusal.unit.utf8))")
            }
            // escaped() writes a byte as at most 4 (a control byte as \xNN; a C1 character's 2 bytes as \u{NNNN}).
            checkRelayLine(refusal.reason, limit: 4 * RelayedRefusal.reasonLimit + 32, of: bytes)
            for field in refusal.journalFields { checkRelayLine(field, limit: 4 * RelayedRefusal.reasonLimit + 128, of: bytes) }
            // keychaind's side: a refusal of this unit whose reason is the whole input arrives as sent, escaped and cut.
            let reason = String(decoding: bytes, as: UTF8.self)
            let sent = RelayedRefusal(manager: refusal.manager, unit: refusal.unit, reason: reason)
            guard sent.encoded.count <= RelayedRefusal.datagramLimit, case .success(let received) = RelayedRefusal.parse(sent.encoded),
                  received.manager == sent.manager, received.unit == sent.unit else {
                fatalError("the relay did not take a refusal keychaind encoded: \(lowerHex(sent.encoded))")
            }
            let whole = reason.utf8.count <= RelayedRefusal.reasonLimit
            guard whole ? received.reason == escaped(reason) : received.reason.hasSuffix(" (cut at \(RelayedRefusal.reasonLimit) bytes)") else {
                fatalError("a refusal's reason did not arrive as keychaind sent it: \(lowerHex(sent.encoded))")
            }
        }
    }

    /// A line the relay writes: no C0 or C1 control, DEL or bidirectional override (escaped()'s promise), at most `limit` bytes.
    private static func checkRelayLine(_ line: String, limit: Int, of bytes: [UInt8]) {
        let unsafe = line.unicodeScalars.contains {
            $0.value < 0x20 || (0x7F..<0xA0).contains($0.value) || (0x202A...0x202E).contains($0.value) || (0x2066...0x2069).contains($0.value)
        }
        guard !unsafe, line.utf8.count <= limit else {
            fatalError("the relay would write \(line.utf8.count) bytes\(unsafe ? " with a control character" : "") of \(lowerHex(bytes))")
        }
    }

    /// The reader's private directory, made once per run; each input is its `reader.json`.
    private static let readerDirectory: String = {
        var template = Array("/tmp/keychain-fuzz-reader.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("mkdtemp: errno \(errno)") }
        return String(cString: made)
    }()

    private static func reader(_ bytes: [UInt8]) {
        let path = readerDirectory + "/reader.json"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0, bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count else { fatalError("write \(path): errno \(errno)") }
        close(fd)
        guard let reader = try? FingerprintReader(directory: readerDirectory) else { return }
        _ = reader.enrolled
        _ = reader.enrollmentSet
        _ = reader.lockState(of: "fuzz", recorded: 3)
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    FuzzTarget.chosen.run(size == 0 ? [] : Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

/// libFuzzer's driver (compiler-rt's FuzzerDriver.cpp): its flags, then `callback` on every input.
@_silgen_name("LLVMFuzzerRunDriver")
func runFuzzerDriver(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                     _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

/// SwiftPM links an executable with `main` defined as `<module>_main` (so that tests can link its
/// module), which keeps libFuzzer's own `main` out: this is that entry point, handing over to libFuzzer.
@_cdecl("keychain_fuzz_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var count = argc
    var arguments = argv
    return runFuzzerDriver(&count, &arguments, fuzzOneInput)
}
#else
import Glibc
import KeychainCLIText

@main
enum KeychainFuzz {
    static func main() {
        writeAll(2, "keychain-fuzz: this build has no fuzzer; scripts/fuzz.sh builds it with -sanitize=fuzzer,address\n")
        exit(2)
    }
}
#endif
