import Glibc
internal import CSystemd

extension Bus {
    /// What the bus daemon vouches for about a connection (`GetConnectionCredentials`), never what the
    /// client says: its uid, the pid that connected and, where the bus gives one (dbus-broker, dbus
    /// 1.15.2 and later; not Debian 12's 1.14), that process as a pidfd, which the caller closes.
    public struct ConnectionCredentials: Sendable {
        public var uid: UInt32
        public var pid: Int32
        public var pidfd: Int32?
    }

    /// The credentials of the connection `name` (a unique name: `:1.42`), bus thread only.
    /// - Throws: the bus's error (`NameHasNoOwner` once the connection left), or `failed` when the
    ///   reply lacks the uid or the pid.
    public func credentials(of name: String) throws(DBusError) -> ConnectionCredentials {
        var message: OpaquePointer?
        guard sd_bus_message_new_method_call(bus, &message, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus",
                                             "GetConnectionCredentials") >= 0, let message else {
            throw .failed("Cannot make a call of GetConnectionCredentials")
        }
        defer { sd_bus_message_unref(message) }
        guard name.withCString({ sd_bus_message_append_basic(message, CChar(UInt8(ascii: "s")), $0) }) >= 0 else {
            throw .failed("Cannot encode the name \(name.prefix(64)) for GetConnectionCredentials")
        }
        var error = sd_bus_error()
        defer { sd_bus_error_free(&error) }
        var reply: OpaquePointer?
        guard sd_bus_call(bus, message, 5_000_000, &error, &reply) >= 0, let reply else {
            throw DBusError(error.name.map { String(cString: $0) } ?? "org.freedesktop.DBus.Error.Failed",
                            error.message.map { String(cString: $0) } ?? "GetConnectionCredentials got no reply")
        }
        defer { sd_bus_message_unref(reply) }
        var found = ConnectionCredentials(uid: UInt32.max, pid: 0, pidfd: nil)
        var haveUID = false
        do throws(DBusError) {
            try Self.credentialEntries(reply) { key, contents throws(DBusError) in
                switch (key, contents) {
                case ("UnixUserID", "u"):
                    found.uid = try Self.basic(reply, "u", UInt32(0))
                    haveUID = true
                case ("ProcessID", "u"): found.pid = Int32(bitPattern: try Self.basic(reply, "u", UInt32(0)))
                case ("ProcessFD", "h"):
                    // The message owns its descriptor: keep a duplicate of our own.
                    let fd = fcntl(try Self.basic(reply, "h", Int32(-1)), F_DUPFD_CLOEXEC, 3)
                    if fd >= 0 { found.pidfd = fd }
                default: return false
                }
                return true
            }
        } catch {
            if let pidfd = found.pidfd { close(pidfd) }
            throw error
        }
        guard haveUID, found.pid > 0 else {
            if let pidfd = found.pidfd { close(pidfd) }
            throw .failed("The bus did not tell the uid and pid of \(name.prefix(64)) (GetConnectionCredentials)")
        }
        return found
    }

    /// Walks the `a{sv}` of `reply`: `read` reads the variant's value of a key it knows (true), or leaves
    /// it (false: skipped).
    private static func credentialEntries(_ reply: OpaquePointer, _ read: (String, String) throws(DBusError) -> Bool) throws(DBusError) {
        func check(_ status: Int32) throws(DBusError) {
            guard status >= 0 else { throw .failed("GetConnectionCredentials' reply does not decode (errno \(-status))") }
        }
        try check(sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "a")), "{sv}"))
        while true {
            let entered = sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "e")), "sv")
            try check(entered)
            if entered == 0 { break }
            let keyPointer: UnsafePointer<CChar>? = try basic(reply, "s", nil)
            let key = keyPointer.map { String(cString: $0) } ?? ""
            var type: CChar = 0
            var contents: UnsafePointer<CChar>?
            try check(sd_bus_message_peek_type(reply, &type, &contents))
            let signature = contents.map { String(cString: $0) } ?? ""
            try check(sd_bus_message_enter_container(reply, CChar(UInt8(ascii: "v")), signature))
            if try !read(key, signature) { try check(sd_bus_message_skip(reply, signature)) }
            try check(sd_bus_message_exit_container(reply))
            try check(sd_bus_message_exit_container(reply))
        }
        try check(sd_bus_message_exit_container(reply))
    }

    private static func basic<T>(_ message: OpaquePointer, _ type: Unicode.Scalar, _ initial: T) throws(DBusError) -> T {
        var value = initial
        let status = withUnsafeMutablePointer(to: &value) { sd_bus_message_read_basic(message, CChar(UInt8(ascii: type)), $0) }
        guard status >= 0 else { throw .failed("GetConnectionCredentials' reply does not decode (errno \(-status))") }
        return value
    }
}
