import Foundation
@testable import Keychain
@testable import KeychainEngine
import KeychainTestSupport
import KeychainTestThreads
import KeychainWire
import Testing

/// A socket planted where KEYCHAIN_SOCKET points, by another user: the clients check the listener's
/// uid (SO_PEERCRED) before they send anything, so the impostor gets no value and no passcode.
@Suite("keychaind clients refuse an impostor's socket", .offThePool)
struct ImpostorTests {
    static let nobody: UInt32 = 65534
    static let value = "value-7c1e-secret", passcode = "9731-secret"

    /// A fake keychaind run as `nobody`: accepts connections, records each one and every frame it
    /// receives, answers a getItem with a passcode prompt (to draw the answer) and anything else with ok.
    final class Impostor {
        let directory: String
        var socket: String { directory + "/fake.sock" }
        var log: String { directory + "/received" }
        let pid: pid_t

        init() throws {
            directory = "/tmp/impostor-" + String(UUID().uuidString.prefix(13))
            guard mkdir(directory, 0o777) == 0, chmod(directory, 0o777) == 0 else { throw SoftwareTPMError("mkdir: errno \(errno)") }
            let script = """
                import os, socket, struct, sys
                path, log = sys.argv[1], sys.argv[2]
                def record(line):
                    with open(log, 'ab') as f: f.write(line + b'\\n')
                def frame(kind, fields):
                    body = bytes([\(Wire.version), kind]) + b''.join(bytes([t]) + struct.pack('>I', len(d)) + d for t, d in fields)
                    return struct.pack('>I', len(body)) + body
                s = socket.socket(socket.AF_UNIX); s.bind(path); os.chmod(path, 0o777); s.listen(64)
                record(b'listening')
                os.write(1, b'ready'); os.close(1)  # one write: the test stops reading at "ready"
                while True:
                    c, _ = s.accept()
                    record(b'connection')
                    c.settimeout(10)
                    try:
                        while True:
                            head = c.recv(4, socket.MSG_WAITALL)
                            if head == b'DONE': record(b'done'); sys.exit(0)
                            if len(head) < 4: break
                            body = c.recv(struct.unpack('>I', head)[0], socket.MSG_WAITALL)
                            record(b'frame ' + body)
                            if len(body) > 1 and body[1] == 2: c.sendall(frame(0x82, [(41, b'["passcode"]'), (42, b'svc'), (43, b'k')]))
                            else: c.sendall(frame(0x80, []))
                    except Exception: pass
                    c.close()
                """
            let out = Pipe()
            let errors = open(directory + "/errors", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
            defer { if errors >= 0 { close(errors) } }
            guard let child = Processes.spawn("/usr/bin/setpriv", ["/usr/bin/setpriv", "--reuid=\(ImpostorTests.nobody)",
                                                                   "--regid=\(ImpostorTests.nobody)", "--clear-groups",
                                                                   "/usr/bin/python3", "-c", script, directory + "/fake.sock",
                                                                   directory + "/received"],
                                              stdout: out.fileHandleForWriting.fileDescriptor, stderr: errors >= 0 ? errors : nil) else {
                throw SoftwareTPMError("cannot start the impostor: errno \(errno)")
            }
            try out.fileHandleForWriting.close()
            pid = child
            let said = try read(out.fileHandleForReading, until: "the impostor to listen") { String(decoding: $0, as: UTF8.self).contains("ready") }
            if !String(decoding: said, as: UTF8.self).contains("ready") {
                _ = Processes.wait(child)
                throw SoftwareTPMError("the impostor ended before it listened")
            }
        }

        private var ended = false

        deinit {
            if !ended {
                kill(pid, SIGKILL)
                _ = Processes.wait(pid)
            }
            try? FileManager.default.removeItem(atPath: directory)
        }

        /// Ends the impostor after it has taken every earlier connection (it accepts them in order: the
        /// test's own last one says DONE); what it recorded, and its stderr (a crash would pass for a refusal).
        func finish() throws -> String {
            let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
            defer { close(fd) }
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in for (i, b) in socket.utf8.enumerated() { raw[i] = b } }
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            guard connected == 0, write(fd, "DONE", 4) == 4 else { throw SoftwareTPMError("the impostor is gone: errno \(errno)") }
            ended = true
            #expect(Processes.wait(pid) == 0, "the impostor failed: \(received)")
            return received
        }

        var received: String {
            ((try? String(contentsOfFile: log, encoding: .isoLatin1)) ?? "")
                + ((try? String(contentsOfFile: directory + "/errors", encoding: .isoLatin1)) ?? "")
        }
    }

    func expectRefused(_ error: KeychainError, _ impostor: Impostor, _ what: String) {
        #expect(error.code == .hardwareUnavailable, "\(what): \(error)")
        #expect(error.message.contains("The keychain service at \(impostor.socket) is not trusted")
                && error.message.contains("uid \(Self.nobody)") && error.message.contains("nothing was sent"), "\(what): \(error)")
    }

    /// What the impostor got: connections (the victims did reach it), never a frame, a value or a passcode.
    func expectNothingArrived(_ impostor: Impostor, connections: Int) throws {
        let received = try impostor.finish()
        #expect(received.components(separatedBy: "connection").count - 1 >= connections, "victims reached it: \(received)")
        #expect(!received.contains("frame"), "the impostor received a request: \(received)")
        #expect(!received.contains(Self.value) && !received.contains(Self.passcode), "a secret reached the impostor")
    }

    @Test func theLibraryClientSendsNothingToAnotherUsersSocket() async throws {
        let impostor = try Impostor()
        let answers = ScriptedAuthenticator()
        let configuration = KeychainConfiguration.daemon(socket: impostor.socket, authenticator: answers)
        let storage = try createKeychain(.init(service: "svc"), configuration: configuration)
        let device = KeychainDevice(configuration: configuration)
        var refused = 0
        let calls: [(String, () async throws -> Void)] = [
            ("setItem", { try await storage.setItem("k", Self.value) }),
            ("getItem", { answers.push(.passcode(bytes(Self.passcode))); _ = try await storage.getItem("k") }),
            ("unlock", { try await device.unlock(passcode: bytes(Self.passcode)) }),
            ("setPasscode", { try await device.setPasscode(bytes(Self.passcode)) }),
        ]
        for (name, call) in calls {
            do {
                try await call()
                Issue.record("\(name) succeeded against the impostor")
            } catch let error as KeychainError {
                expectRefused(error, impostor, name)
                refused += 1
            }
        }
        #expect(answers.requests.isEmpty, "the impostor's prompt reached the authenticator")
        try expectNothingArrived(impostor, connections: refused)
    }

    /// keychainctl (the lean front for get/set, the full tool for prompts), run by root and by
    /// another user pointed at the impostor's socket.
    @Test(arguments: [nil, 65533] as [UInt32?])
    func keychainctlSendsNothingToAnotherUsersSocket(victim: UInt32?) throws {
        let impostor = try Impostor()
        let keychainctl = buildDirectory.appendingPathComponent("keychainctl").path
        func ctl(_ args: [String], _ input: String = "") throws -> (status: Int32, stderr: String) {
            let environment = ["KEYCHAIN_SOCKET": impostor.socket]
            let result = if let victim {
                try run("/usr/bin/setpriv", ["--reuid=\(victim)", "--regid=\(victim)", "--clear-groups", keychainctl] + args,
                        input: Array(input.utf8), environment: environment)
            } else {
                try run(keychainctl, args, input: Array(input.utf8), environment: environment)
            }
            return (result.status, result.stderr)
        }
        let runs: [([String], String)] = [(["set", "svc", "k"], Self.value), (["get", "svc", "k"], ""),
                                          (["get", "svc", "k", "--passcode-stdin"], Self.passcode + "\n"),
                                          (["unlock"], Self.passcode + "\n")]
        for (args, input) in runs {
            let result = try ctl(args, input)
            #expect(result.status == 3 && result.stderr.contains("HARDWARE_UNAVAILABLE: The keychain service at \(impostor.socket) is not trusted")
                    && result.stderr.contains("uid \(Self.nobody)"), "\(args): \(result.stderr)")
        }
        try expectNothingArrived(impostor, connections: runs.count)
    }

    @Test func theTrustedUidsAreRootOneselfAndTheServiceUser() {
        #expect(WireSocket.isTrusted(uid: 0))
        #expect(WireSocket.isTrusted(uid: geteuid()))
        #expect(!WireSocket.isTrusted(uid: Self.nobody))
        if let service = getpwnam(WireSocket.serviceUser)?.pointee.pw_uid {
            #expect(WireSocket.serviceUID == service && WireSocket.isTrusted(uid: service))
        } else {
            #expect(WireSocket.serviceUID == nil)
        }
    }
}
