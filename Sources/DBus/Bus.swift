import Glibc
import KeychainBasics
internal import CSystemd
import FoundationEssentials
import SecureMemory
import Synchronization

/// The session bus connection, on a thread of its own: every sd-bus call of the provider is here.
///
/// sd-bus is not thread-safe, so the connection is used only by its thread. Method calls are decoded
/// into `DBusCall` and answered by the handler on that thread; work finished elsewhere (a prompt's
/// answer) comes back through `post`, which wakes the loop.
public final class Bus: @unchecked Sendable {
    private let bus: OpaquePointer
    private let wake: Int32
    private let posted = Mutex<[@Sendable () -> Void]>([])
    private var handler: ((DBusCall) -> DBusAnswer)?
    private var vanished: ((String) -> Void)?
    private var lost: (() -> Void)?
    private var running = true
    private var slots: [OpaquePointer?] = []

    /// A reply: its arguments, and whether they hold a secret (the message is then wiped when freed).
    public struct DBusReply: Sendable {
        public var arguments: [DBusValue]
        public var sensitive: Bool
        public init(_ arguments: [DBusValue], sensitive: Bool = false) {
            self.arguments = arguments
            self.sensitive = sensitive
        }
    }

    /// What a handler answers a call with: its reply now, or later, when work off the bus thread is done.
    public enum DBusAnswer {
        case now(Result<DBusReply, DBusError>)
        /// `start` runs at once (bus thread) and gets the function that sends the reply: call it once,
        /// from any thread; meanwhile the bus serves other calls.
        case later((_ reply: @escaping @Sendable (Result<DBusReply, DBusError>) -> Void) -> Void)
    }

    /// Connects to the caller's session bus (`DBUS_SESSION_BUS_ADDRESS`).
    public init() throws(DBusError) {
        var connection: OpaquePointer?
        if case .failure(let code) = valueOrNegatedErrno(sd_bus_open_user(&connection)) {
            throw .failed("Cannot connect to the session bus: \(code) (is DBUS_SESSION_BUS_ADDRESS set?)")
        }
        guard let connection else { throw .failed("Cannot connect to the session bus (is DBUS_SESSION_BUS_ADDRESS set?)") }
        bus = connection
        wake = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
    }

    /// Connects to the bus at `address` (a D-Bus address: `unix:path=…`), as a client that says Hello.
    public init(address: String) throws(DBusError) {
        var connection: OpaquePointer?
        if case .failure(let code) = valueOrNegatedErrno(sd_bus_new(&connection)) { throw .failed("Cannot make a bus connection: \(code)") }
        guard let connection else { throw .failed("Cannot make a bus connection") }
        let started = valueOrNegatedErrno(sd_bus_set_address(connection, address))
            .flatMap { _ in valueOrNegatedErrno(sd_bus_set_bus_client(connection, 1)) }
            .flatMap { _ in valueOrNegatedErrno(sd_bus_start(connection)) }
        if case .failure(let code) = started {
            sd_bus_unref(connection)
            throw .failed("Cannot connect to the bus at \(address): \(code)")
        }
        bus = connection
        wake = eventfd(0, Int32(EFD_NONBLOCK | EFD_CLOEXEC))
    }

    deinit {
        sd_bus_flush_close_unref(bus)
        close(wake)
    }

    public enum Ownership: Sendable { case owned, ownedBy(String) }

    /// Asks for `name`; another owner is described (pid and command) unless `replace` took the name from it.
    /// We allow replacement ourselves, so `--replace` of another instance works.
    public func request(name: String, replace: Bool) throws(DBusError) -> Ownership {
        var flags = UInt64(SD_BUS_NAME_ALLOW_REPLACEMENT)
        if replace { flags |= UInt64(SD_BUS_NAME_REPLACE_EXISTING) }
        guard case .failure(let code) = valueOrNegatedErrno(sd_bus_request_name(bus, name, flags)) else { return .owned }
        guard code.rawValue == EEXIST || code.rawValue == EALREADY else { throw .failed("Cannot own \(name): \(code)") }
        var creds: OpaquePointer?
        var who = "another process"
        if sd_bus_get_name_creds(bus, name, UInt64(SD_BUS_CREDS_PID | SD_BUS_CREDS_COMM | SD_BUS_CREDS_UNIQUE_NAME), &creds) >= 0,
           let creds {
            defer { sd_bus_creds_unref(creds) }
            var pid: pid_t = 0
            var comm: UnsafePointer<CChar>?
            var unique: UnsafePointer<CChar>?
            _ = sd_bus_creds_get_unique_name(creds, &unique)
            if sd_bus_creds_get_pid(creds, &pid) >= 0 { who = "pid \(pid)" }
            if sd_bus_creds_get_comm(creds, &comm) >= 0, let comm {
                who += " (\(String(cString: comm)))"
            } else if pid > 0, let command = Self.command(of: pid) {
                who += " (\(command))"  // dbus-daemon tells the pid only; the kernel tells the rest
            }
            if let unique { who += " as \(String(cString: unique))" }
        }
        return .ownedBy(who)
    }

    /// The pid and uid the bus daemon took from the kernel for a connection (`GetConnectionCredentials`
    /// of `sender`, a unique name: its `ProcessID` and `UnixUserID`, which sd-bus reports as the
    /// effective uid); nil when the bus does not tell them. A round trip to the bus.
    public func credentials(of sender: String) -> (pid: Int32, uid: UInt32)? {
        var creds: OpaquePointer?
        guard sd_bus_get_name_creds(bus, sender, UInt64(SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID), &creds) >= 0, let creds else { return nil }
        defer { sd_bus_creds_unref(creds) }
        var pid: pid_t = 0
        var uid: uid_t = 0
        guard sd_bus_creds_get_pid(creds, &pid) >= 0, sd_bus_creds_get_euid(creds, &uid) >= 0, pid > 0 else { return nil }
        return (pid, uid)
    }

    /// A process's command name (`/proc/PID/comm`, at most 15 bytes), nil when it cannot be read.
    static func command(of pid: pid_t) -> String? {
        let fd = open("/proc/\(pid)/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 32)
        let n = bytes.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress!, $0.count) }
        guard n > 1 else { return nil }
        return String(decoding: bytes[..<(n - 1)], as: UTF8.self)
    }

    /// Serves method calls on every path until `stop`, the name is lost, or the bus closes.
    /// - Parameters:
    ///   - vanished: a client's unique name left the bus (its sessions die with it).
    ///   - lost: another provider took the name (`--replace`).
    public func serve(handler: @escaping (DBusCall) -> DBusAnswer, vanished: @escaping (String) -> Void,
                      lost: @escaping () -> Void) throws(DBusError) {
        self.handler = handler
        self.vanished = vanished
        self.lost = lost
        let context = Unmanaged.passUnretained(self).toOpaque()
        var slot: OpaquePointer?
        guard sd_bus_add_fallback(bus, &slot, "/", { message, userdata, _ in
            guard let message, let userdata else { return 0 }
            return Unmanaged<Bus>.fromOpaque(userdata).takeUnretainedValue().dispatch(message)
        }, context) >= 0 else { throw .failed("sd_bus_add_fallback failed") }
        slots.append(slot)
        guard sd_bus_match_signal(bus, &slot, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                  "NameOwnerChanged", { message, userdata, _ in
            guard let message, let userdata else { return 0 }
            Unmanaged<Bus>.fromOpaque(userdata).takeUnretainedValue().nameOwnerChanged(message)
            return 0
        }, context) >= 0 else { throw .failed("sd_bus_match_signal failed") }
        slots.append(slot)
        guard sd_bus_match_signal(bus, &slot, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                  "NameLost", { _, userdata, _ in
            guard let userdata else { return 0 }
            let this = Unmanaged<Bus>.fromOpaque(userdata).takeUnretainedValue()
            this.running = false
            this.lost?()
            return 0
        }, context) >= 0 else { throw .failed("sd_bus_match_signal failed") }
        slots.append(slot)
        defer {
            for slot in slots { sd_bus_slot_unref(slot) }
            slots = []
        }
        while running {
            var status: Int32
            repeat { status = sd_bus_process(bus, nil) } while status > 0 && running
            if case .failure(let code) = valueOrNegatedErrno(status) {
                if code.rawValue == ECONNRESET || code.rawValue == ENOTCONN { return }
                throw .failed("The session bus failed: \(code)")
            }
            runPosted()
            guard running else { break }
            var timeout: UInt64 = 0
            _ = sd_bus_get_timeout(bus, &timeout)
            var fds = [pollfd(fd: sd_bus_get_fd(bus), events: Int16(sd_bus_get_events(bus)), revents: 0),
                       pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
            var milliseconds: Int32 = -1
            if timeout != UInt64.max {
                var now = timespec()
                clock_gettime(CLOCK_MONOTONIC, &now)
                let nowMicros = UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
                milliseconds = timeout <= nowMicros ? 0 : Int32(min((timeout - nowMicros + 999) / 1000, 60_000))
            }
            _ = poll(&fds, 2, milliseconds)
            if fds[1].revents != 0 {
                var counter: UInt64 = 0
                _ = Glibc.read(wake, &counter, 8)
            }
        }
        sd_bus_flush(bus)
    }

    /// This connection's unique name (`:1.42`).
    public var uniqueName: String {
        var name: UnsafePointer<CChar>?
        return sd_bus_get_unique_name(bus, &name) >= 0 && name != nil ? String(cString: name!) : ""
    }

    /// Calls a method and waits up to `timeout` for its reply (on the bus thread, or before `serve`).
    /// The reply's buffer is wiped when freed: it may carry a secret.
    /// - Throws: the error the callee answered with, or `failed` when the call could not be made.
    public func call(_ destination: String, _ path: String, _ interface: String, _ member: String,
                     _ arguments: [DBusValue] = [], timeout: Duration = .seconds(25)) throws(DBusError) -> [DBusValue] {
        var message: OpaquePointer?
        guard sd_bus_message_new_method_call(bus, &message, destination, path, interface, member) >= 0, let message else {
            throw .failed("Cannot make a call of \(interface).\(member)")
        }
        defer { sd_bus_message_unref(message) }
        for argument in arguments where Self.append(message, argument) < 0 {
            throw .failed("The arguments of \(interface).\(member) could not be encoded")
        }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        let micros = UInt64(timeout.components.seconds) * 1_000_000 + UInt64(timeout.components.attoseconds / 1_000_000_000_000)
        let status = valueOrNegatedErrno(sd_bus_call(bus, message, micros, &error, &reply))
        guard case .success = status, let reply else {
            let cause = if case .failure(let code) = status { code.description } else { "no reply" }
            throw DBusError(error.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed",
                            error.message.map { String(cString: $0) } ?? cause)
        }
        defer { sd_bus_message_unref(reply) }
        _ = sd_bus_message_sensitive(reply)
        return try Self.read(reply)
    }

    /// Calls a method, then waits up to `timeout` for a signal on `path` (a prompt's `Completed`) and
    /// returns its arguments (before `serve`: a client's connection).
    /// - Throws: the callee's error, or `failed` when the signal did not come in time.
    public func callAwaitingSignal(_ destination: String, _ path: String, _ interface: String, _ member: String,
                                   _ arguments: [DBusValue], signal: (interface: String, member: String),
                                   timeout: Duration) throws(DBusError) -> [DBusValue] {
        final class Received { var arguments: [DBusValue]? }
        let received = Received()
        var slot: OpaquePointer?
        guard sd_bus_match_signal(bus, &slot, destination, path, signal.interface, signal.member, { message, userdata, _ in
            guard let message, let userdata else { return 0 }
            Unmanaged<Received>.fromOpaque(userdata).takeUnretainedValue().arguments = (try? Bus.read(message)) ?? []
            return 0
        }, Unmanaged.passUnretained(received).toOpaque()) >= 0 else { throw .failed("sd_bus_match_signal failed") }
        defer { sd_bus_slot_unref(slot) }
        _ = try call(destination, path, interface, member, arguments, timeout: timeout)
        let end = ContinuousClock.now + timeout
        while received.arguments == nil {
            let status: Int32
            switch valueOrNegatedErrno(sd_bus_process(bus, nil)) {
            case .success(let value): status = value
            case .failure(let code): throw .failed("The session bus failed: \(code)")
            }
            if status > 0 { continue }
            let left = end - ContinuousClock.now
            guard left > .zero else { throw .failed("No \(signal.member) from \(path) within \(timeout)") }
            _ = sd_bus_wait(bus, UInt64(left.components.seconds) * 1_000_000 + UInt64(left.components.attoseconds / 1_000_000_000_000))
        }
        return received.arguments!
    }

    /// Stops `serve` after the current message.
    public func stop() { post { [self] in running = false } }

    /// Runs `work` on the bus thread (from any thread).
    public func post(_ work: @escaping @Sendable () -> Void) {
        posted.withLock { $0.append(work) }
        var one: UInt64 = 1
        _ = write(wake, &one, 8)
    }

    private func runPosted() {
        let work = posted.withLock { queue in
            defer { queue = [] }
            return queue
        }
        for item in work { item() }
    }

    /// Emits a signal (bus thread only).
    public func emit(_ signal: DBusSignal) {
        var message: OpaquePointer?
        guard sd_bus_message_new_signal(bus, &message, signal.path, signal.interface, signal.member) >= 0, let message else { return }
        defer { sd_bus_message_unref(message) }
        for argument in signal.arguments where Self.append(message, argument) < 0 { return }
        _ = sd_bus_send(bus, message, nil)
    }

    private func nameOwnerChanged(_ message: OpaquePointer) {
        guard let arguments = try? Self.read(message), arguments.count == 3, case .string(let name) = arguments[0],
              case .string(let newOwner) = arguments[2], newOwner.isEmpty, name.hasPrefix(":") else { return }
        vanished?(name)
    }

    private func dispatch(_ message: OpaquePointer) -> Int32 {
        var type: UInt8 = 0
        guard sd_bus_message_get_type(message, &type) >= 0, type == UInt8(SD_BUS_MESSAGE_METHOD_CALL) else { return 0 }
        let answer: DBusAnswer
        do {
            answer = handler?(try Self.call(message)) ?? .now(.failure(.failed("The provider is not serving")))
        } catch {
            answer = .now(.failure(error))
        }
        switch answer {
        case .now(let result):
            reply(to: message, result)
        case .later(let start):
            // The call is kept until its reply is sent (on this thread, through `post`).
            let held = HeldCall(sd_bus_message_ref(message))
            start { [self] result in
                post { [self] in
                    reply(to: held.message, result)
                    sd_bus_message_unref(held.message)
                }
            }
        }
        return 1
    }

    /// A method call whose reply comes later; used on the bus thread only.
    private struct HeldCall: @unchecked Sendable {
        let message: OpaquePointer?
        init(_ message: OpaquePointer?) { self.message = message }
    }

    private func reply(to message: OpaquePointer?, _ result: Result<DBusReply, DBusError>) {
        guard let message else { return }
        switch result {
        case .success(let reply):
            var out: OpaquePointer?
            guard sd_bus_message_new_method_return(message, &out) >= 0, let out else { return }
            defer { sd_bus_message_unref(out) }
            if reply.sensitive { _ = sd_bus_message_sensitive(out) }
            for argument in reply.arguments where Self.append(out, argument) < 0 {
                replyError(message, .failed("The reply could not be encoded"))
                return
            }
            _ = sd_bus_send(bus, out, nil)
        case .failure(let error):
            replyError(message, error)
        }
    }

    private func replyError(_ call: OpaquePointer, _ error: DBusError) {
        var value = sd_bus_error()
        defer { sd_bus_error_free(&value) }
        _ = sd_bus_error_set(&value, error.name, error.message)
        _ = sd_bus_reply_method_error(call, &value)
    }

    /// A method call's header fields and arguments, as a handler sees them. The call may carry a
    /// secret: its buffer is wiped when sd-bus frees it.
    static func call(_ message: OpaquePointer) throws(DBusError) -> DBusCall {
        func text(_ pointer: UnsafePointer<CChar>?) -> String { pointer.map { String(cString: $0) } ?? "" }
        _ = sd_bus_message_sensitive(message)
        return DBusCall(sender: text(sd_bus_message_get_sender(message)), path: text(sd_bus_message_get_path(message)),
                        interface: text(sd_bus_message_get_interface(message)), member: text(sd_bus_message_get_member(message)),
                        signature: text(sd_bus_message_get_signature(message, 1)), arguments: try read(message))
    }

    // MARK: - Values

    /// The values left in the message's current container.
    static func read(_ message: OpaquePointer) throws(DBusError) -> [DBusValue] {
        var values: [DBusValue] = []
        while true {
            var type: CChar = 0
            var contents: UnsafePointer<CChar>?
            switch valueOrNegatedErrno(sd_bus_message_peek_type(message, &type, &contents)) {
            case .failure(let code): throw .invalidArgs("The message does not decode: \(code)")
            case .success(0): return values
            case .success: break
            }
            values.append(try readOne(message, UInt8(bitPattern: type), contents.map { String(cString: $0) } ?? ""))
        }
    }

    private static func readOne(_ message: OpaquePointer, _ type: UInt8, _ contents: String) throws(DBusError) -> DBusValue {
        func check(_ status: Int32) throws(DBusError) {
            if case .failure(let code) = valueOrNegatedErrno(status) { throw .invalidArgs("The message does not decode: \(code)") }
        }
        func basic<T>(_ initial: T) throws(DBusError) -> T {
            var value = initial
            try check(withUnsafeMutablePointer(to: &value) { sd_bus_message_read_basic(message, CChar(bitPattern: type), $0) })
            return value
        }
        switch type {
        case UInt8(ascii: "y"): return .byte(try basic(UInt8(0)))
        case UInt8(ascii: "b"): return .bool(try basic(Int32(0)) != 0)
        case UInt8(ascii: "n"): return .int32(Int32(try basic(Int16(0))))
        case UInt8(ascii: "q"): return .uint32(UInt32(try basic(UInt16(0))))
        case UInt8(ascii: "i"), UInt8(ascii: "h"): return .int32(try basic(Int32(0)))
        case UInt8(ascii: "u"): return .uint32(try basic(UInt32(0)))
        case UInt8(ascii: "x"): return .int64(try basic(Int64(0)))
        case UInt8(ascii: "t"): return .uint64(try basic(UInt64(0)))
        case UInt8(ascii: "d"): return .double(try basic(Double(0)))
        case UInt8(ascii: "s"), UInt8(ascii: "o"), UInt8(ascii: "g"):
            let pointer: UnsafePointer<CChar>? = try basic(nil)
            let text = pointer.map { String(cString: $0) } ?? ""
            return type == UInt8(ascii: "s") ? .string(text) : type == UInt8(ascii: "o") ? .objectPath(text) : .signature(text)
        case UInt8(ascii: "a") where contents == "y":
            var pointer: UnsafeRawPointer?
            var size = 0
            try check(sd_bus_message_read_array(message, CChar(bitPattern: UInt8(ascii: "y")), &pointer, &size))
            guard let pointer, size > 0 else { return .bytes(SecureBytes(count: 0)) }
            return .bytes(SecureBytes(copying: UnsafeRawBufferPointer(start: pointer, count: size)))
        case UInt8(ascii: "a"), UInt8(ascii: "e"), UInt8(ascii: "r"), UInt8(ascii: "v"):
            try check(sd_bus_message_enter_container(message, CChar(bitPattern: type), contents))
            let inner = try read(message)
            try check(sd_bus_message_exit_container(message))
            switch type {
            case UInt8(ascii: "a"): return .array(element: contents, inner)
            case UInt8(ascii: "e"):
                guard inner.count == 2 else { throw .invalidArgs("A dictionary entry holds \(inner.count) values") }
                return .dictEntry(inner[0], inner[1])
            case UInt8(ascii: "r"): return .structure(inner)
            default:
                guard inner.count == 1 else { throw .invalidArgs("A variant holds \(inner.count) values") }
                return .variant(inner[0])
            }
        default:
            throw .invalidArgs("The message holds a D-Bus type '\(Character(Unicode.Scalar(type)))' the Secret Service never sends")
        }
    }

    /// Appends `value`; a negative errno when sd-bus refuses it.
    static func append(_ message: OpaquePointer, _ value: DBusValue) -> Int32 {
        func basic<T>(_ type: String, _ initial: T) -> Int32 {
            var copy = initial
            return withUnsafePointer(to: &copy) { sd_bus_message_append_basic(message, CChar(bitPattern: type.utf8.first!), $0) }
        }
        func container(_ type: String, _ contents: String, _ values: [DBusValue]) -> Int32 {
            var status = sd_bus_message_open_container(message, CChar(bitPattern: type.utf8.first!), contents)
            guard status >= 0 else { return status }
            for inner in values {
                status = append(message, inner)
                guard status >= 0 else { return status }
            }
            return sd_bus_message_close_container(message)
        }
        switch value {
        case .byte(let v): return basic("y", v)
        case .bool(let v): return basic("b", Int32(v ? 1 : 0))
        case .int32(let v): return basic("i", v)
        case .uint32(let v): return basic("u", v)
        case .int64(let v): return basic("x", v)
        case .uint64(let v): return basic("t", v)
        case .double(let v): return basic("d", v)
        case .string(let text), .objectPath(let text), .signature(let text):
            let type = value.signature
            return text.withCString { sd_bus_message_append_basic(message, CChar(bitPattern: type.utf8.first!), $0) }
        case .bytes(let bytes):
            return bytes.withUnsafeBytes { sd_bus_message_append_array(message, CChar(bitPattern: UInt8(ascii: "y")), $0.baseAddress, $0.count) }
        case .array(let element, let values): return container("a", element, values)
        case .dictEntry(let key, let inner): return container("e", key.signature + inner.signature, [key, inner])
        case .structure(let fields): return container("r", fields.map(\.signature).joined(), fields)
        case .variant(let inner): return container("v", inner.signature, [inner])
        }
    }
}
