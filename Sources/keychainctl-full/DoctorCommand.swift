import DBus
import Glibc
import Keychain
import KeychainCLIText

/// One line of `keychainctl doctor`: what was checked, how it stands, and what to do when it is not well.
struct DoctorFinding: Encodable {
    enum Verdict: String, Encodable { case ok, note, problem }
    let check: String
    let verdict: Verdict
    let detail: String
    let fix: String?
}

/// `keychainctl doctor`: what a newcomer needs, in a few lines: the TPM and its state, whether keychaind and its
/// sockets answer, the store's binding, the Secret Service's owner on this session, and what to do about each
/// problem. Read-only: it changes nothing, asks for nothing and never prints a value.
struct Doctor {
    let configuration: KeychainConfiguration
    static let credentialsSocket = "/run/keychain/credentials.sock"
    static let secretsName = "org.freedesktop.secrets"

    func findings() async -> [DoctorFinding] {
        var findings = [keychaindFinding()]
        findings += await deviceFindings()
        findings.append(credentialsFinding())
        findings.append(secretServiceFinding())
        return findings
    }

    private func keychaindFinding() -> DoctorFinding {
        guard let socket = configuration.daemonSocket else {
            return DoctorFinding(check: "keychaind", verdict: .note,
                                 detail: "not in use: this user's items are in \(configuration.storeDirectory), opened in this process",
                                 fix: nil)
        }
        return DoctorFinding(check: "keychaind", verdict: .ok, detail: "in use at \(socket) (the device lines below come through it)", fix: nil)
    }

    /// The TPM, the lock, the store's binding and the reader, from the device's status (through keychaind when in use).
    private func deviceFindings() async -> [DoctorFinding] {
        let status: DeviceStatus
        do {
            status = try await KeychainDevice(configuration: configuration).status()
        } catch {
            return [DoctorFinding(check: "keychain", verdict: .problem, detail: "\(error.code.rawValue): \(error.message)",
                                  fix: Self.fix(for: error.code, daemon: configuration.daemonSocket))]
        }
        var findings: [DoctorFinding] = []
        switch status.securityLevel {
        case .softwareTPM:
            findings.append(DoctorFinding(check: "tpm", verdict: .note, detail: "\(status.tpm): a software TPM, no hardware protection",
                                          fix: "on a device with a TPM 2.0, use /dev/tpmrm0 (root or the group tss) or --tcti device:/dev/tpmrm0"))
        default:
            findings.append(DoctorFinding(check: "tpm", verdict: .ok, detail: "\(status.tpm) (\(status.securityLevel.rawValue))", fix: nil))
        }
        if !status.passcodeSet {
            findings.append(DoctorFinding(check: "passcode", verdict: .note, detail: "not set: items behind the passcode and the whenPasscodeSet levels cannot be stored",
                                          fix: "keychainctl passcode set (the PIN on stdin)"))
        } else if status.lockState != .unlocked {
            findings.append(DoctorFinding(check: "lock", verdict: .note, detail: "\(status.lockState.rawValue): whenUnlocked items cannot be read",
                                          fix: "keychainctl unlock (the passcode on stdin)"))
        } else {
            findings.append(DoctorFinding(check: "lock", verdict: .ok, detail: "passcode set, unlocked", fix: nil))
        }
        if let counter = status.rollbackCounter {
            switch counter.state {
            case .current, .oneAhead, .restartWindow:
                findings.append(DoctorFinding(check: "store binding", verdict: .ok, detail: "bound to the TPM's rollback counter (\(counter.state.rawValue))", fix: nil))
            case .unbound, .interrupted:
                break  // the status's warning says it, and how to bind it
            case .rolledBack, .forged, .missing, .replaced:
                findings.append(DoctorFinding(check: "store binding", verdict: .problem, detail: "\(counter.state.rawValue): every operation refuses this store",
                                              fix: "keychainctl status says why; keychainctl accept-store keeps the store as it is now (docs/cli.md)"))
            }
        }
        if let reader = status.reader, reader.state == .rolledBack || reader.state == .unreadable {
            findings.append(DoctorFinding(check: "fingerprint reader", verdict: .problem, detail: reader.state.rawValue,
                                          fix: "keychainctl reader delete, then keychainctl reader enroll NAME"))
        }
        for warning in status.warnings {
            findings.append(DoctorFinding(check: "warning", verdict: .problem, detail: warning, fix: nil))
        }
        return findings
    }

    private static func fix(for code: KeychainError.Code, daemon: String?) -> String {
        switch code {
        case .hardwareUnavailable where daemon != nil:
            "is keychaind running? systemctl status keychaind.socket keychaind.service; journalctl -u keychaind"
        case .hardwareUnavailable:
            "the TPM: /dev/tpmrm0 needs root or the group tss; or give --tcti, or use keychaind (KEYCHAIN_SOCKET)"
        case .accessDenied:
            "this user may not use that store: use keychaind (KEYCHAIN_SOCKET) or your own --store"
        default:
            "keychainctl status gives the whole message; docs/cli.md has each code"
        }
    }

    /// systemd's `LoadCredential=` socket (the package's keychaind.socket makes it).
    private func credentialsFinding() -> DoctorFinding {
        var info = stat()
        guard lstat(Self.credentialsSocket, &info) == 0 else {
            return DoctorFinding(check: "credentials socket", verdict: .note,
                                 detail: "\(Self.credentialsSocket) absent: systemd units cannot get credentials from the keychain",
                                 fix: "systemctl enable --now keychaind.socket (the package keychain-linux installs it)")
        }
        guard info.st_mode & S_IFMT == S_IFSOCK else {
            return DoctorFinding(check: "credentials socket", verdict: .problem, detail: "\(Self.credentialsSocket) is not a socket",
                                 fix: "remove it, then systemctl restart keychaind.socket")
        }
        return DoctorFinding(check: "credentials socket", verdict: .ok, detail: "\(Self.credentialsSocket) listening (LoadCredential=ID:\(Self.credentialsSocket))", fix: nil)
    }

    /// Who serves org.freedesktop.secrets on this session bus, or who would be started.
    private func secretServiceFinding() -> DoctorFinding {
        let bus: Bus
        do { bus = try Bus() } catch {
            return DoctorFinding(check: "secret service", verdict: .note,
                                 detail: "no session bus here (an ssh login or a service): programs use keychaind or credentials instead", fix: nil)
        }
        let dbus = ("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus")
        guard let owner = try? bus.call(dbus.0, dbus.1, dbus.2, "GetNameOwner", [.string(Self.secretsName)], timeout: .seconds(5)).first?.string else {
            var activatable: [DBusValue] = []
            if case .array(_, let names)? = (try? bus.call(dbus.0, dbus.1, dbus.2, "ListActivatableNames", timeout: .seconds(5)))?.first {
                activatable = names
            }
            return activatable.contains { $0.string == Self.secretsName }
                ? DoctorFinding(check: "secret service", verdict: .ok, detail: "not running; the bus starts a provider on the first call", fix: nil)
                : DoctorFinding(check: "secret service", verdict: .note, detail: "no provider running or activatable on this session",
                                fix: "keychain-secret-service (docs/secret-service.md)")
        }
        var pid: UInt32?
        if case .uint32(let number)? = (try? bus.call(dbus.0, dbus.1, dbus.2, "GetConnectionUnixProcessID", [.string(owner)], timeout: .seconds(5)))?.first {
            pid = number
        }
        let command = pid.flatMap { Self.command(of: $0) } ?? "?"
        let who = "\(escaped(command)) (pid \(pid.map(String.init) ?? "?"), \(owner))"
        guard command.hasPrefix("keychain") else {
            return DoctorFinding(check: "secret service", verdict: .note, detail: "served by \(who), not by this keychain",
                                 fix: "docs/secret-service.md: switching a user's session to keychain-secret-service")
        }
        return DoctorFinding(check: "secret service", verdict: .ok, detail: "served by \(who)", fix: nil)
    }

    /// A process's command name (/proc/PID/comm), nil when it cannot be read.
    private static func command(of pid: UInt32) -> String? {
        guard let file = fopen("/proc/\(pid)/comm", "r") else { return nil }
        defer { fclose(file) }
        var line = [CChar](repeating: 0, count: 64)
        guard fgets(&line, Int32(line.count), file) != nil else { return nil }
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return text.hasSuffix("\n") ? String(text.dropLast()) : text
    }
}
