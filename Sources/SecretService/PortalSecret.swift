import Glibc
import Keychain
import KeychainBasics
import KeychainCLIText

/// The Flatpak Secret portal's backend (`org.freedesktop.impl.portal.Secret`): each sandboxed app's
/// own random secret, which libsecret inside the sandbox uses to encrypt the app's keyring file.
///
/// xdg-desktop-portal calls `RetrieveSecret(o handle, s app_id, h fd, a{sv} options)` with the app id
/// it took from the kernel (the caller's `/.flatpak-info`, a snap's cgroup); the backend writes the
/// app's secret to `fd` (never into a D-Bus message, never a log) and answers `(u 0, a{sv} {})`.
/// A secret is 64 random bytes (libsodium), made at an app's first call and kept as a keychain item
/// (service `org.freedesktop.impl.portal.Secret`, key the app id, `afterFirstUnlockThisDeviceOnly`:
/// sealed by the TPM like every item). Calls for one app run one at a time, so two first calls
/// cannot each make a secret. Served on the provider's connection at `/org/freedesktop/portal/desktop`,
/// under its own name (`busName`) and under org.freedesktop.secrets, the name gnome-keyring's
/// `.portal` file names. docs/secret-service.md, "The Flatpak Secret portal".
///
/// - Important: only the portal is answered: a caller whose executable is not xdg-desktop-portal
///   (`PortalCaller`) is refused. That stops a program that merely asks; a program of the same
///   user can still run or trace the portal's executable (docs/security.md).
public final class PortalSecretBackend: @unchecked Sendable {
    public static let busName = "org.freedesktop.impl.portal.desktop.keychain"
    public static let path = "/org/freedesktop/portal/desktop"
    static let interface = "org.freedesktop.impl.portal.Secret"
    static let service = "org.freedesktop.impl.portal.Secret"
    static let secretBytes = 64

    private let storage: Keychain
    private let caller: PortalCaller
    /// Calls of one app one at a time (bus thread).
    private let turns = TurnTaking()
    /// Runs work on the bus thread (`Bus.post`).
    public var post: (@escaping @Sendable () -> Void) -> Void = { $0() }

    /// What the bus says of a sender: its pid, its uid and, where the bus gives one, a pidfd of its
    /// process (the backend closes it).
    public struct Credentials {
        public var pid: Int32
        public var uid: UInt32
        public var pidfd: Int32?
        public init(pid: Int32, uid: UInt32, pidfd: Int32?) { (self.pid, self.uid, self.pidfd) = (pid, uid, pidfd) }
    }

    /// The backend over the keychain of `configuration`; `credentials` tells a sender's pid and uid.
    public init(configuration: KeychainConfiguration, credentials: @escaping (String) -> Credentials?) throws(DBusError) {
        let options = KeychainOptions(service: Self.service, accessible: .afterFirstUnlockThisDeviceOnly)
        storage = try SecretServiceProvider.keychainCall { () throws(KeychainError) in
            try createKeychain(options, configuration: configuration)
        }
        caller = PortalCaller(credentials: credentials)
    }

    /// Whether `call` is this backend's (its object's path); the provider answers every other.
    public static func owns(_ call: DBusCall) -> Bool { call.path == path }

    /// Answers a call on `path` (bus thread).
    public func handle(_ call: DBusCall) -> Bus.DBusAnswer {
        switch (call.interface, call.member) {
        case ("org.freedesktop.DBus.Introspectable", "Introspect"):
            return .reply([.string(Self.introspection)])
        case ("org.freedesktop.DBus.Properties", "Get") where call.arguments.count == 2,
             ("org.freedesktop.DBus.Properties", "GetAll") where call.arguments.count == 1:
            guard case .string(Self.interface) = call.arguments[0] else {
                return .now(.failure(.unknownProperty("\(Self.path) has the interface \(Self.interface) only")))
            }
            if call.member == "GetAll" { return .reply([.array(element: "{sv}", [.dictEntry(.string("version"), .variant(.uint32(1)))])]) }
            guard case .string("version") = call.arguments[1] else { return .now(.failure(.unknownProperty("\(Self.interface) has the property version only"))) }
            return .reply([.variant(.uint32(1))])
        case (Self.interface, "RetrieveSecret"), ("", "RetrieveSecret"):
            do throws(DBusError) {
                return try retrieveSecret(call)
            } catch {
                return .now(.failure(error))
            }
        default:
            return .now(.failure(.unknownMethod("No method \(logField(call.interface.utf8, limit: 64)).\(logField(call.member.utf8, limit: 64)) "
                                                + "at \(Self.path): the Secret portal backend has \(Self.interface).RetrieveSecret")))
        }
    }

    /// Checks the call (its shape, the app id, the caller, the fd) on the bus thread, then reads or
    /// makes the app's secret off it and writes it to the fd.
    private func retrieveSecret(_ call: DBusCall) throws(DBusError) -> Bus.DBusAnswer {
        guard call.signature == "osha{sv}", case .string(let text) = call.arguments[1], case .int32(let passed) = call.arguments[2] else {
            throw .invalidArgs("RetrieveSecret takes (o handle, s app_id, h fd, a{sv} options), got (\(logField(call.signature.utf8, limit: 64)))")
        }
        let app = try PortalAppID.parse(text).get()
        try caller.check(call.sender)
        let fd = try SecretPipe(passed: passed)
        let storage = storage
        return .later { [self, turns] reply in
            turns.run([.client(app.value)]) { [self] done in
                let done = BusThreadOnly(done)
                Task.detached { [self] in
                    let outcome = await Self.secret(of: app, in: storage)
                    post {
                        reply(outcome.flatMap { secret in Result { () throws(DBusError) in try fd.write(secret) } }
                            .map { .init([.uint32(0), .array(element: "{sv}", [])]) })
                        fd.close()
                        done.value()
                    }
                }
            }
        }
    }

    /// `app`'s secret: the stored one, or a new one stored first (its calls run one at a time).
    private static func secret(of app: PortalAppID, in storage: Keychain) async -> Result<SecureBytes, DBusError> {
        do throws(KeychainError) {
            if let stored = try await storage.getSecureBytes(app.value) {
                guard stored.count == secretBytes else {
                    return .failure(.failed("The stored portal secret of \(app.value) is \(stored.count) bytes, not \(secretBytes): "
                                            + "the store is damaged (keychainctl rm \(service) \(app.value) makes a new one, "
                                            + "and the app's encrypted data is lost)"))
                }
                return .success(stored)
            }
            let secret = SecureBytes(random: secretBytes)
            try await storage.setItem(app.value, secret, options: SetItemOptions(label: "Flatpak Secret portal: \(app.value)"))
            return .success(secret)
        } catch {
            return .failure(SecretServiceProvider.dbusError(error))
        }
    }

    static let introspection = """
        <!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">
        <node>
          <interface name="org.freedesktop.impl.portal.Secret">
            <method name="RetrieveSecret">
              <arg type="o" name="handle" direction="in"/>
              <arg type="s" name="app_id" direction="in"/>
              <arg type="h" name="fd" direction="in"/>
              <arg type="a{sv}" name="options" direction="in"/>
              <arg type="u" name="response" direction="out"/>
              <arg type="a{sv}" name="results" direction="out"/>
            </method>
            <property name="version" type="u" access="read"/>
          </interface>
          <interface name="org.freedesktop.DBus.Introspectable">
            <method name="Introspect"><arg type="s" name="xml" direction="out"/></method>
          </interface>
          <interface name="org.freedesktop.DBus.Properties">
            <method name="Get"><arg type="s" direction="in"/><arg type="s" direction="in"/><arg type="v" direction="out"/></method>
            <method name="GetAll"><arg type="s" direction="in"/><arg type="a{sv}" direction="out"/></method>
          </interface>
        </node>
        """
}

/// Who may call the backend: a connection of this uid whose process runs xdg-desktop-portal's
/// executable (`/proc/PID/exe`, the kernel's link, as `GetConnectionCredentials` names the pid: its
/// path, and the host's file of that path by device and inode).
///
/// - Important: a speed bump, not a boundary: any program of the user can start that executable
///   with a library preloaded, or trace it, and call as it. It stops a program that merely asks the
///   backend for another app's secret over the bus.
struct PortalCaller {
    /// Where Debian (and Fedora) install the portal, and where Arch does.
    static let executables: Set<String> = ["/usr/libexec/xdg-desktop-portal", "/usr/lib/xdg-desktop-portal"]
    let credentials: (String) -> PortalSecretBackend.Credentials?

    func check(_ sender: String) throws(DBusError) {
        guard let peer = credentials(sender) else {
            throw .accessDenied("The bus does not tell who \(logField(sender.utf8, limit: 64)) is: only xdg-desktop-portal may ask for an app's secret")
        }
        guard peer.uid == getuid() else {
            throw .accessDenied("The caller runs as uid \(peer.uid), not \(getuid()): only this user's xdg-desktop-portal may ask for an app's secret")
        }
        defer { if let pidfd = peer.pidfd { close(pidfd) } }
        // Read as keychaind reads its peers: of the process the bus's pidfd names, where it gives one.
        let exe: String?, isPortals: Bool
        do throws(KeychainError) {
            (exe, isPortals) = try CallerIdentity.readingProcess(pid: peer.pid, pidfd: peer.pidfd) { pid in
                (Self.executable(of: pid), Self.isPortalsFile(pid: pid))
            }
        } catch {
            throw .accessDenied("The caller (pid \(peer.pid)) is gone, or its pid names another process now: only xdg-desktop-portal "
                                + "may ask for an app's secret")
        }
        guard let exe, Self.executables.contains(exe), isPortals else {
            let what = exe.map { "'\(logField($0.utf8, limit: 128))'" } ?? "unknown (its /proc entry cannot be read)"
            throw .accessDenied("The caller (pid \(peer.pid), executable \(what)) is not xdg-desktop-portal "
                                + "(\(Self.executables.sorted().joined(separator: " or "))): a sandboxed app asks "
                                + "org.freedesktop.portal.Secret, which calls this backend with the app id the kernel vouches for")
        }
    }

    /// Whether the file the process runs is one of `executables` on this host (device and inode),
    /// not a file of that name in another mount namespace (a sandbox's own `/usr`).
    static func isPortalsFile(pid: Int32) -> Bool {
        var running = stat()
        guard stat("/proc/\(pid)/exe", &running) == 0 else { return false }
        return executables.contains { path in
            var installed = stat()
            return stat(path, &installed) == 0 && installed.st_dev == running.st_dev && installed.st_ino == running.st_ino
        }
    }

    /// The target of `/proc/PID/exe` (at most PATH_MAX bytes), nil when it cannot be read.
    static func executable(of pid: pid_t) -> String? {
        var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = buffer.withUnsafeMutableBytes { readlink("/proc/\(pid)/exe", $0.baseAddress!.assumingMemoryBound(to: CChar.self), $0.count) }
        guard count > 0, count < buffer.count else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }
}

/// The fd a `RetrieveSecret` carries, duplicated so it outlives the call's message; the secret is
/// written to it without blocking the bus thread, and it is closed after the reply.
struct SecretPipe: Sendable {
    let fd: Int32

    /// Refuses an fd not open for writing (an app passed the wrong end of its pipe).
    init(passed: Int32) throws(DBusError) {
        let flags = fcntl(passed, F_GETFL)
        guard flags >= 0 else { throw .invalidArgs("The fd of RetrieveSecret is not open (\(String(cString: strerror(errno))))") }
        guard flags & O_ACCMODE == O_WRONLY || flags & O_ACCMODE == O_RDWR else {
            throw .invalidArgs("The fd of RetrieveSecret is open for reading only: pass the write end of a pipe")
        }
        fd = fcntl(passed, F_DUPFD_CLOEXEC, 0)
        guard fd >= 0 else { throw .failed("Cannot keep the fd of RetrieveSecret: \(String(cString: strerror(errno)))") }
    }

    /// Writes `secret` whole, or fails when the fd cannot take it at once (a full pipe, a closed
    /// reader): a caller's fd never blocks the bus thread.
    func write(_ secret: SecureBytes) throws(DBusError) {
        var done = 0
        while done < secret.count {
            var ready = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
            guard poll(&ready, 1, 0) == 1, ready.revents == Int16(POLLOUT) else {
                throw .failed("The fd of RetrieveSecret cannot take the secret now (a full pipe, or its reader closed it)")
            }
            // SIGPIPE is ignored in the provider: a reader gone since the poll is EPIPE here.
            switch valueOrErrno({ secret.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + done, $0.count - done) } }) {
            case .success(let wrote) where wrote > 0: done += wrote
            case .success: throw .failed("Cannot write the secret to the fd of RetrieveSecret: it took none of it")
            case .failure(let error): throw .failed("Cannot write the secret to the fd of RetrieveSecret: \(error)")
            }
        }
    }

    func close() { _ = Glibc.close(fd) }
}
