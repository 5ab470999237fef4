import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Synchronization
import Testing

/// The Flatpak Secret portal's backend through a real xdg-desktop-portal (Debian 12's 1.16) on a
/// private bus, reading our `.portal` file only: sandboxed apps (bwrap, a `/.flatpak-info` as Flatpak
/// writes it) ask `org.freedesktop.portal.Secret.RetrieveSecret` and read their secret from a pipe.
@Suite(.serialized, .offThePool) struct PortalSecretTests {
    static let portalExecutable = "/usr/libexec/xdg-desktop-portal"

    init() throws {
        try PrivateBus.require(Self.portalExecutable, "xdg-desktop-portal")
        try PrivateBus.require("/usr/bin/bwrap", "bubblewrap")
        try PrivateBus.requirePython(module: "dbus, gi", package: "python3-dbus python3-gi")
    }

    @Test func twoSandboxedAppsGetTwoSecretsEachTheSameAfterRestartingThePortalTheProviderTheBusAndTheTPM() throws {
        let tpm = try SoftwareTPM()
        let a: String, b: String
        do {
            let bus = try Self.bus(tpm)
            let portal = try Portal(bus)
            var first: App.Answer?
            let capture = try bus.captured { first = try? App.sandboxed(bus, "org.example.A") }
            a = try #require(first).secret
            #expect(first?.response == "0")
            #expect(a.count == 128, "64 bytes, read from the pipe: \(a)")
            let secret = try #require(Data(hexString: a))
            #expect(capture.range(of: secret) == nil, "the secret never crossed the bus")
            let second = try App.sandboxed(bus, "org.example.B")
            b = second.secret
            #expect(second.response == "0" && b.count == 128, "\(second) \(bus.log)")
            #expect(a != b, "each app its own secret")
            #expect(try App.sandboxed(bus, "org.example.A").secret == a, "the same on A's next call")
            withExtendedLifetime(portal) {}
        }
        try tpm.reboot()
        try FileManager.default.removeItem(atPath: tpm.directory + "/bus")  // the first bus's socket and files
        let bus = try Self.bus(tpm)
        let portal = try Portal(bus)
        #expect(try App.sandboxed(bus, "org.example.B").secret == b, "B's after restarting everything: \(bus.log)")
        #expect(try App.sandboxed(bus, "org.example.A").secret == a, "A's after restarting everything")
        withExtendedLifetime(portal) {}
    }

    /// Through keychaind (`--socket`, as the package's user unit runs the provider): the secrets are
    /// items of the user's namespace in keychaind's store, the same after restarting the provider,
    /// keychaind and the TPM.
    @Test func throughKeychaindEachAppsSecretIsAnItemOfTheUserAndOutlivesRestarts() throws {
        let tpm = try SoftwareTPM()
        let keychaind = try KeychainDaemon(tpm: tpm)
        let socket = keychaind.socket
        let bus = try Self.bus(tpm, providerArguments: ["--socket", socket])
        let portal = try Portal(bus)
        let a = try App.sandboxed(bus, "org.example.A"), b = try App.sandboxed(bus, "org.example.B")
        #expect(a.response == "0" && a.secret.count == 128 && b.secret.count == 128 && a.secret != b.secret, "\(a) \(b) \(bus.log)")
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        let listed = try bus.run(keychainctl, ["ls", "org.freedesktop.impl.portal.Secret"], environment: keychaind.environment)
        #expect(String(decoding: listed.stdout, as: UTF8.self).split(separator: "\n").sorted() == ["org.example.A", "org.example.B"], "\(listed.stderr)")

        for pid in bus.providerPIDs() { kill(pid, SIGTERM) }
        try waitUntil("the provider to stop") { bus.providerPIDs().isEmpty }
        _ = keychaind.kill()
        try tpm.reboot()
        try keychaind.start()
        #expect(try App.sandboxed(bus, "org.example.A").secret == a.secret, "A's after restarting the provider, keychaind and the TPM: \(bus.log)")
        withExtendedLifetime(portal) {}
    }

    /// An app's first calls, several at once (an app's processes starting together), make one secret:
    /// every caller reads the one that is kept.
    @Test func anAppsFirstCallsAtOnceAllGetTheOneSecretThatIsKept() throws {
        let bus = try Self.bus(try SoftwareTPM())
        let portal = try Portal(bus)
        let answers = Mutex<[String]>([])
        let go = bus.directory + "/go"
        let release = Thread {
            usleep(2_000_000)  // every client started and waiting (bwrap and python take ~0.2 s)
            _ = FileManager.default.createFile(atPath: go, contents: nil)
        }
        release.start()
        DispatchQueue.concurrentPerform(iterations: 6) { _ in
            let answer = (try? App.sandboxed(bus, "org.example.C", startingAt: go))?.secret ?? "failed"
            answers.withLock { $0.append(answer) }
        }
        let kept = try App.sandboxed(bus, "org.example.C").secret
        #expect(kept.count == 128)
        #expect(answers.withLock { $0 } == Array(repeating: kept, count: 6), "\(bus.log)")
        withExtendedLifetime(portal) {}
    }

    /// Where gnome-keyring is installed, its `.portal` file (42.1: `DBusName=org.freedesktop.secrets`,
    /// `UseIn=gnome`) is the one the portal chooses, in GNOME and elsewhere (it sorts first): once
    /// keychain-secret-service owns org.freedesktop.secrets, the app gets the same secret that way.
    @Test func gnomeKeyringsPortalFileReachesTheBackendUnderOrgFreedesktopSecrets() throws {
        let tpm = try SoftwareTPM()
        let bus = try Self.bus(tpm)
        let ours = try App.sandboxed(bus, "org.example.A", through: try Portal(bus))
        #expect(ours.response == "0" && ours.secret.count == 128, "\(ours) \(bus.log)")
        let gnomeKeyrings = "[portal]\nDBusName=org.freedesktop.secrets\nInterfaces=org.freedesktop.impl.portal.Secret\nUseIn=gnome\n"
        for desktop in ["GNOME", nil] {
            let portal = try Portal(bus, others: ["gnome-keyring.portal": gnomeKeyrings], desktop: desktop)
            #expect(try App.sandboxed(bus, "org.example.A", through: portal).secret == ours.secret, "desktop \(desktop ?? "none"): \(bus.log)")
        }
        #expect(bus.log.contains("Using gnome-keyring.portal for org.freedesktop.impl.portal.Secret in GNOME"), "\(bus.log)")
        #expect(bus.log.contains("Falling back to gnome-keyring.portal for org.freedesktop.impl.portal.Secret"), "\(bus.log)")
    }

    /// The app id comes from the portal, which takes it from the kernel; a program that calls the
    /// backend itself, naming an app, is not the portal and gets nothing.
    @Test func aProgramThatIsNotThePortalGetsNoAppsSecretFromTheBackend() throws {
        let bus = try Self.bus(try SoftwareTPM())
        let portal = try Portal(bus)
        let a = try App.sandboxed(bus, "org.example.A")
        #expect(a.response == "0" && a.secret.count == 128, "\(a) \(bus.log)")

        let host = try App.direct(bus, "org.example.A")
        #expect(host.hasPrefix("error org.freedesktop.DBus.Error.AccessDenied"), "\(host)")
        #expect(host.contains("is not xdg-desktop-portal"), "\(host)")
        #expect(!host.contains(a.secret))
        let sandboxedB = try App.direct(bus, "org.example.A", from: "org.example.B")
        #expect(sandboxedB.hasPrefix("error org.freedesktop.DBus.Error.AccessDenied"), "app B asking for A's: \(sandboxedB)")
        withExtendedLifetime(portal) {}
    }

    /// A host program asks the portal: the portal names no app (an empty id) and it gets nothing.
    @Test func aHostProgramGetsNoSecretThroughThePortal() throws {
        let bus = try Self.bus(try SoftwareTPM())
        let portal = try Portal(bus)
        let host = try App.host(bus)
        #expect(host.response == "2" && host.secret.isEmpty, "\(host)")
        #expect(bus.log.contains("The app id is empty"), "the portal logs the backend's reason: \(bus.log)")
        withExtendedLifetime(portal) {}
    }

    @Test func anAppIdThatIsNotOneIsRefusedSayingWhatAnAppIdIs() throws {
        let bus = try Self.bus(try SoftwareTPM())
        for bad in ["org..A", ".org.A", "org.example.A.", "orgA", "org-x.A", "org.exa mple", "org.é.A", String(repeating: "a.", count: 128) + "b",
                    "org.example.A\n[forged] line"] {
            let answer = try App.direct(bus, bad)
            #expect(answer.hasPrefix("error org.freedesktop.DBus.Error.InvalidArgs"), "\(bad): \(answer)")
            #expect(!answer.contains("\n[forged]"), "the id is escaped in the message: \(answer)")
        }
        #expect(try App.direct(bus, String(repeating: "a.", count: 128) + "b").contains("at most 255"))
        #expect(try App.direct(bus, "org..A").contains("as org.example.App"))
        // The portal's rule, not Flatpak's: snap ids (two elements) and elements starting with a digit.
        #expect(try App.direct(bus, "snap.foo").hasPrefix("error org.freedesktop.DBus.Error.AccessDenied"))
        #expect(try App.direct(bus, "org.1example.my-app").hasPrefix("error org.freedesktop.DBus.Error.AccessDenied"))
    }

    // MARK: - Parts

    /// A private bus whose provider is also activated by the backend's name (as the package's file does).
    static func bus(_ tpm: SoftwareTPM, providerArguments: [String]? = nil) throws -> PrivateBus {
        let bus = try PrivateBus(tpm: tpm, providerArguments: providerArguments.map { arguments in { _, _ in arguments } })
        let services = bus.directory + "/services/"
        let provider = try String(contentsOfFile: services + "org.freedesktop.secrets.service", encoding: .utf8)
        try provider.replacingOccurrences(of: "Name=org.freedesktop.secrets", with: "Name=org.freedesktop.impl.portal.desktop.keychain")
            .write(toFile: services + "org.freedesktop.impl.portal.desktop.keychain.service", atomically: true, encoding: .utf8)
        _ = try bus.python("import dbus; dbus.SessionBus().get_object('org.freedesktop.DBus', '/org/freedesktop/DBus').ReloadConfig()")
        return bus
    }

    /// xdg-desktop-portal on `bus`, with no desktop and our `.portal` file only (`XDG_DESKTOP_PORTAL_DIR`,
    /// which 1.16 reads instead of /usr/share/xdg-desktop-portal/portals); stopped at deinit.
    final class Portal {
        let pid: pid_t

        /// - Parameters:
        ///   - others: more `.portal` files beside ours (name and contents).
        ///   - desktop: the session's `XDG_CURRENT_DESKTOP`, none when nil.
        init(_ bus: PrivateBus, others: [String: String] = [:], desktop: String? = nil) throws {
            let portals = bus.directory + "/portals"
            try? FileManager.default.removeItem(atPath: portals)
            try FileManager.default.createDirectory(atPath: portals, withIntermediateDirectories: true)
            let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("dist/xdg-desktop-portal/keychain.portal").path
            try FileManager.default.copyItem(atPath: source, toPath: portals + "/keychain.portal")
            for (name, contents) in others { try contents.write(toFile: portals + "/" + name, atomically: true, encoding: .utf8) }
            var environment = ProcessInfo.processInfo.environment
            environment["XDG_CURRENT_DESKTOP"] = desktop
            environment["XDG_DESKTOP_PORTAL_DIR"] = portals
            environment["DBUS_SESSION_BUS_ADDRESS"] = bus.address
            let log = open(bus.directory + "/bus.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            defer { close(log) }
            pid = try #require(Processes.spawn(PortalSecretTests.portalExecutable, [PortalSecretTests.portalExecutable, "-r", "-v"],
                                               environment: environment, stderr: log))
            try waitUntil("xdg-desktop-portal to own org.freedesktop.portal.Desktop") {
                try bus.python("import dbus; print(dbus.SessionBus().name_has_owner('org.freedesktop.portal.Desktop'))") == "True\n"
            }
        }

        deinit {
            kill(pid, SIGTERM)
            _ = Processes.wait(pid)
        }
    }

    enum App {
        struct Answer: CustomStringConvertible {
            var response: String
            var secret: String
            var description: String { "response \(response), \(secret.count / 2) bytes" }
        }

        /// python3 in a bwrap sandbox whose `/.flatpak-info` names `appID`, asking the portal.
        /// - Parameter go: the client calls once this file exists (several clients at once).
        static func sandboxed(_ bus: PrivateBus, _ appID: String, through portal: Portal? = nil, startingAt go: String? = nil) throws -> Answer {
            defer { withExtendedLifetime(portal) {} }
            let command = [PrivateBus.python3, "-c", portalClient] + (go.map { [$0] } ?? [])
            return try answer(try bus.run("/usr/bin/bwrap", try sandbox(bus, appID) + command))
        }

        /// python3 on the host (no sandbox) asking the portal.
        static func host(_ bus: PrivateBus) throws -> Answer {
            try answer(try bus.run(PrivateBus.python3, ["-c", portalClient]))
        }

        /// python3 calling the backend itself for `appID`'s secret (on the host, or in a sandbox of
        /// `sandboxApp`): "error NAME MESSAGE" or "ok RESPONSE HEX".
        static func direct(_ bus: PrivateBus, _ appID: String, from sandboxApp: String? = nil) throws -> String {
            let result = if let sandboxApp {
                try bus.run("/usr/bin/bwrap", try sandbox(bus, sandboxApp) + [PrivateBus.python3, "-c", directClient, appID])
            } else {
                try bus.run(PrivateBus.python3, ["-c", directClient, appID])
            }
            #expect(result.status == 0, "\(result.stderr)")
            return String(decoding: result.stdout, as: UTF8.self)
        }

        private static func answer(_ result: (status: Int32, stdout: [UInt8], stderr: String)) throws -> Answer {
            #expect(result.status == 0, "\(result.stderr)")
            let words = String(decoding: result.stdout, as: UTF8.self).split(separator: " ", omittingEmptySubsequences: false)
            try #require(words.count == 2, "\(result.stderr)")
            return Answer(response: String(words[0]), secret: words[1].trimmingCharacters(in: .whitespacesAndNewlines))
        }

        /// Flatpak's shape of a sandbox: a fresh root, the host's /usr, `/.flatpak-info` read-only.
        private static func sandbox(_ bus: PrivateBus, _ appID: String) throws -> [String] {
            let info = "\(bus.directory)/\(appID).flatpak-info"
            try "[Application]\nname=\(appID)\n\n[Instance]\ninstance-id=1\n".write(toFile: info, atomically: true, encoding: .utf8)
            return ["--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                    "--symlink", "usr/bin", "/bin", "--ro-bind", "/etc", "/etc", "--bind", "/tmp", "/tmp",
                    "--bind", bus.directory, bus.directory, "--proc", "/proc", "--dev", "/dev", "--ro-bind", info, "/.flatpak-info"]
        }

        /// What libsecret inside a Flatpak does: a pipe, the portal's RetrieveSecret with its write end,
        /// the Response signal, then the pipe read to its end. Prints "RESPONSE HEX". With an argument,
        /// it calls once that file exists.
        static let portalClient = """
            import dbus, os, select, sys, time
            from dbus.mainloop.glib import DBusGMainLoop
            from gi.repository import GLib
            DBusGMainLoop(set_as_default=True)
            bus = dbus.SessionBus()
            token = 't%d' % os.getpid()
            path = '/org/freedesktop/portal/desktop/request/%s/%s' % (bus.get_unique_name()[1:].replace('.', '_'), token)
            loop, got = GLib.MainLoop(), {}
            def done(response, results):
                got['response'] = int(response)
                loop.quit()
            bus.add_signal_receiver(done, 'Response', 'org.freedesktop.portal.Request', None, path)
            r, w = os.pipe()
            portal = bus.get_object('org.freedesktop.portal.Desktop', '/org/freedesktop/portal/desktop')
            while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]):
                time.sleep(0.001)
            portal.RetrieveSecret(dbus.types.UnixFd(w), {'handle_token': token}, dbus_interface='org.freedesktop.portal.Secret')
            os.close(w)
            GLib.timeout_add_seconds(60, loop.quit)
            loop.run()
            data = b''
            while select.select([r], [], [], 30)[0]:
                chunk = os.read(r, 4096)
                if not chunk:
                    break
                data += chunk
            print(got.get('response'), data.hex())
            """

        static let directClient = """
            import dbus, os, select, sys
            bus = dbus.SessionBus()
            r, w = os.pipe()
            backend = bus.get_object('org.freedesktop.impl.portal.desktop.keychain', '/org/freedesktop/portal/desktop')
            try:
                answer = backend.RetrieveSecret(dbus.ObjectPath('/org/freedesktop/portal/desktop/request/1_1/t'), sys.argv[1],
                                                dbus.types.UnixFd(w), dbus.Dictionary({}, signature='sv'),
                                                dbus_interface='org.freedesktop.impl.portal.Secret', timeout=60)
                os.close(w)
                data = b''
                while select.select([r], [], [], 10)[0]:
                    chunk = os.read(r, 4096)
                    if not chunk:
                        break
                    data += chunk
                print('ok', int(answer[0]), data.hex())
            except dbus.exceptions.DBusException as error:
                print('error', error.get_dbus_name(), error.get_dbus_message())
            """
    }
}

extension Data {
    /// The bytes of an even-length string of hex digits, nil for anything else.
    fileprivate init?(hexString: String) {
        var bytes: [UInt8] = []
        var text = Substring(hexString)
        while text.count >= 2 {
            guard let byte = UInt8(text.prefix(2), radix: 16) else { return nil }
            bytes.append(byte)
            text = text.dropFirst(2)
        }
        guard text.isEmpty else { return nil }
        self.init(bytes)
    }
}
