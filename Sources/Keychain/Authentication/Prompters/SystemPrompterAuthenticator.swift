import KeychainCore
import KeychainEngine
internal import DBus
import FoundationEssentials
import Dispatch
import SecureMemory
import Synchronization
import KeychainBasics

/// The desktop's prompt: gcr's system prompter (`org.gnome.keyring.SystemPrompter` on the session
/// bus, `/usr/libexec/gcr-prompter`), the dialog gnome-keyring itself uses. Its protocol is gcr's
/// internal `org.gnome.keyring.internal.Prompter`: `BeginPrompting(callback)`; the prompter calls the
/// callback's `PromptReady` when its dialog is free, with the start of a secret exchange; we send
/// `PerformPrompt(callback, "password", properties, exchange)`; the next `PromptReady` says `yes`
/// (with the password) or `no`; `StopPrompting(callback)` closes the dialog.
///
/// The password crosses the bus only encrypted: gcr's secret exchange `sx-aes-1` (Diffie-Hellman in
/// RFC 3526's 1536-bit group, HKDF-SHA256, AES-128-CBC), decrypted into locked memory here. Only the
/// prompter's own connection (the name's owner) may call the callback.
public struct SystemPrompterAuthenticator: Authenticator, LinePrompter {
    public static let busName = "org.gnome.keyring.SystemPrompter"
    static let prompterPath = "/org/gnome/keyring/Prompter"
    static let prompterInterface = "org.gnome.keyring.internal.Prompter"
    static let exchangeProtocol = "sx-aes-1"

    public let timeout: Duration
    /// Where the session bus and the display are: `DBUS_SESSION_BUS_ADDRESS` (else
    /// `$XDG_RUNTIME_DIR/bus`), `DISPLAY` or `WAYLAND_DISPLAY`.
    public let environment: [String: String]

    public init(timeout: Duration = PromptTimeout.default, environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.timeout = timeout
        self.environment = environment
    }

    /// The session bus's address, when there is one.
    var busAddress: String? {
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return address }
        if let runtime = environment["XDG_RUNTIME_DIR"], FileManager.default.fileExists(atPath: runtime + "/bus") {
            return "unix:path=" + runtime + "/bus"
        }
        return nil
    }

    public func reachability() async -> PromptReach {
        let display = [environment["DISPLAY"], environment["WAYLAND_DISPLAY"]].contains { !($0 ?? "").isEmpty }
        guard display else { return .unreachable("desktop prompter: no display (neither DISPLAY nor WAYLAND_DISPLAY)") }
        guard let address = busAddress else { return .unreachable("desktop prompter: no session bus (DBUS_SESSION_BUS_ADDRESS)") }
        return await PromptWait.run { _ in
            do throws(DBusError) {
                return try Self.onKeptConnection(to: address) { bus throws(DBusError) in
                    if try Self.hasOwner(bus) { return .reachable }
                    let names = try bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                             "ListActivatableNames", timeout: .seconds(5))
                    let activatable = names.first.flatMap { value -> [String]? in
                        guard case .array(_, let elements) = value else { return nil }
                        return elements.compactMap(\.string)
                    } ?? []
                    return activatable.contains(Self.busName) ? .reachable
                        : .unreachable("desktop prompter: nothing owns or can start \(Self.busName) on the session bus")
                }
            } catch {
                return .unreachable("desktop prompter: \(error.message)")
            }
        }
    }

    /// The connections of reachability checks, by bus address, kept from one check to the next: a
    /// check is asked before each protected read's prompt and by `canUseAccessControl`, and a new
    /// connection (its authentication and Hello) cost more than the check's own calls. Each check
    /// still asks the bus who owns the name, so a prompter that went away is noticed at the next one.
    private static let keptConnections = Mutex<[String: Bus]>([:])

    /// `check` on the kept connection to `address`; on a new one when there is none yet or a call on
    /// the kept one fails (the bus restarted, the connection closed), which is then replaced. Checks
    /// wait for each other: sd-bus connections are not thread-safe.
    private static func onKeptConnection(to address: String,
                                         _ check: (Bus) throws(DBusError) -> PromptReach) throws(DBusError) -> PromptReach {
        try keptConnections.withLock { (kept: inout [String: Bus]) throws(DBusError) -> PromptReach in
            if let bus = kept[address] {
                do throws(DBusError) { return try check(bus) } catch { kept[address] = nil }
            }
            let bus = try Bus(address: address)
            kept[address] = bus
            return try check(bus)
        }
    }

    public func authenticate(_ request: AuthenticationRequest) async -> AuthenticationAnswer { await answer(request) }

    private static func hasOwner(_ bus: Bus) throws(DBusError) -> Bool {
        let reply = try bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner",
                                 [.string(busName)], timeout: .seconds(5))
        if case .bool(let owned)? = reply.first { return owned }
        return false
    }

    func ask(_ question: PromptQuestion) async -> PromptLine {
        guard let address = busAddress else { return .unavailable("desktop prompter: no session bus (DBUS_SESSION_BUS_ADDRESS)") }
        let timeout = timeout
        return await PromptWait.run { cancel in
            do throws(DBusError) {
                return try Conversation(bus: try Bus(address: address), question: question).run(timeout: timeout, cancel: cancel)
            } catch {
                return .unavailable("desktop prompter: \(error.message)")
            }
        }
    }

    /// One question, on the bus thread: every callback and posted step runs there.
    private final class Conversation: @unchecked Sendable {
        let bus: Bus
        let question: PromptQuestion
        let callback = "/org/keychain/Prompt/p" + (0..<8).map { _ in Hex.encode(UInt8.random(in: 16...255), digits: 1) }.joined()
        var prompter = ""
        var key: SecureBytes?
        var result: PromptLine?

        init(bus: Bus, question: PromptQuestion) {
            self.bus = bus
            self.question = question
        }

        func run(timeout: Duration, cancel: PromptWait.Cancel) throws(DBusError) -> PromptLine {
            // Activates gcr-prompter when it is not running; its unique name is the only caller we answer.
            if !(try SystemPrompterAuthenticator.hasOwner(bus)) {
                _ = try bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "StartServiceByName",
                                 [.string(busName), .uint32(0)], timeout: .seconds(25))
            }
            let owner = try bus.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "GetNameOwner",
                                     [.string(busName)], timeout: .seconds(5))
            guard let name = owner.first?.string, !name.isEmpty else { throw .failed("\(busName) has no owner") }
            prompter = name
            _ = try bus.call(name, prompterPath, prompterInterface, "BeginPrompting", [.objectPath(callback)])
            cancel.onCancel { [weak self] in
                guard let me = self else { return }
                me.bus.post { me.end(.interrupted) }
            }
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(Int(timeout.components.seconds * 1000))) { [weak self] in
                guard let me = self else { return }
                me.bus.post { me.end(.interrupted) }
            }
            try bus.serve(handler: { [self] call in .now(handle(call)) }, vanished: { [self] gone in
                if gone == prompter { result = result ?? .interrupted; bus.stop() }
            }, lost: {})
            return result ?? .interrupted
        }

        /// The answer (or its absence) is in: the dialog closes and the loop ends.
        func end(_ line: PromptLine) {
            guard result == nil else { return }
            result = line
            _ = try? bus.call(prompter, SystemPrompterAuthenticator.prompterPath, SystemPrompterAuthenticator.prompterInterface,
                              "StopPrompting", [.objectPath(callback)], timeout: .seconds(5))
            bus.stop()
        }

        func handle(_ call: DBusCall) -> Result<Bus.DBusReply, DBusError> {
            guard call.sender == prompter else { return .failure(.accessDenied("Only \(busName) answers this prompt")) }
            guard call.path == callback else { return .failure(.unknownObject("No prompt at \(call.path)")) }
            switch call.member {
            case "PromptReady":
                guard call.arguments.count == 3, let reply = call.arguments[0].string, let exchange = call.arguments[2].string else {
                    return .failure(.invalidArgs("PromptReady takes (sa{sv}s)"))
                }
                let fields = Self.exchangeFields(exchange)
                if key == nil {
                    // The prompter's half of the exchange: ours goes back with the question.
                    guard let peer = fields["public"].flatMap({ Data(base64Encoded: $0) }) else {
                        bus.post { [self] in end(.unavailable("desktop prompter: its secret exchange has no public key")) }
                        return .success(.init([]))
                    }
                    do {
                        let (ours, derived) = try SessionCrypto.agree(clientPublic: SecureBytes(copying: peer), group: .modp1536)
                        key = derived
                        let properties = properties()
                        let sent = "[\(exchangeProtocol)]\npublic=\(Data(ours).base64EncodedString())\n"
                        bus.post { [self] in
                            do throws(DBusError) {
                                _ = try bus.call(prompter, prompterPath, prompterInterface, "PerformPrompt",
                                                 [.objectPath(callback), .string("password"), properties, .string(sent)])
                            } catch {
                                end(.unavailable("desktop prompter: \(error.message)"))
                            }
                        }
                    } catch {
                        bus.post { [self] in end(.unavailable("desktop prompter: \(error.message)")) }
                    }
                    return .success(.init([]))
                }
                let line: PromptLine
                if reply == "yes", let key, let secret = fields["secret"].flatMap({ Data(base64Encoded: $0) }),
                   let iv = fields["iv"].flatMap({ Data(base64Encoded: $0) }),
                   let plain = try? SessionCrypto.decrypt(SecureBytes(copying: secret), iv: SecureBytes(copying: iv), key: key) {
                    line = .text(plain)
                } else if reply == "yes" {
                    line = .unavailable("desktop prompter: the password it sent does not decrypt")
                } else {
                    line = .cancel
                }
                bus.post { [self] in end(line) }
                return .success(.init([]))
            case "PromptDone":
                bus.post { [self] in
                    if result == nil { result = .interrupted }
                    bus.stop()
                }
                return .success(.init([]))
            default:
                return .failure(.unknownMethod("No method \(call.member) on a prompt callback"))
            }
        }

        /// The dialog's texts: the storage's title, the details and what to type, the cancel button.
        func properties() -> DBusValue {
            let description = (question.details + ["\(question.label) (empty: \(question.emptyMeans))"]).joined(separator: "\n")
            return .properties([("title", .string(question.title)), ("message", .string(question.title)),
                                ("description", .string(description)), ("warning", .string("")),
                                ("password-new", .bool(false)), ("choice-label", .string("")),
                                ("cancel-label", .string(question.cancel)), ("continue-label", .string("OK"))])
        }

        /// `key=value` lines of the exchange's `[sx-aes-1]` group.
        static func exchangeFields(_ text: String) -> [String: String] {
            var fields: [String: String] = [:]
            var inGroup = false
            for line in text.split(separator: "\n") {
                if line.hasPrefix("[") { inGroup = line == "[\(exchangeProtocol)]"; continue }
                guard inGroup, let equals = line.firstIndex(of: "=") else { continue }
                fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
            }
            return fields
        }
    }
}
