import Foundation
@testable import Keychain
@testable import KeychainEngine
import Testing

/// The seed's default service is the application's identifier (issue 21, item 5): what Linux has,
/// never the executable's name, so renaming a binary keeps its items.
@Suite struct ApplicationIdentityTests {
    @Test func keychainAppIDComesFirst() {
        let cgroup = "0::/system.slice/mail-sync.service\n"
        #expect(ApplicationIdentity.resolve(environment: ["KEYCHAIN_APP_ID": "com.example.mail"], cgroup: cgroup) == "com.example.mail")
        #expect(ApplicationIdentity.resolve(environment: ["KEYCHAIN_APP_ID": ""], cgroup: cgroup) == "mail-sync")
    }

    @Test func aServiceIsNamedByItsUnit() {
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: "0::/system.slice/mail-sync.service\n") == "mail-sync")
        // cgroup v1: the name=systemd hierarchy; a delegated subgroup below the unit.
        let v1 = "12:pids:/system.slice/vpn.service\n1:name=systemd:/system.slice/vpn.service/payload\n"
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: v1) == "vpn")
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: "0::/user.slice/user-1000.slice/user@1000.service/app.slice/backup.service\n") == "backup")
    }

    @Test func aDesktopApplicationIsNamedByItsDesktopFileID() {
        let scope = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-org.example.Mail-4242.scope\n"
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: scope) == "org.example.Mail")
        let service = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.example.Mail@0f3a.service\n"
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: service) == "org.example.Mail")
        let escaped = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-kde-my\\x2dmail-77.scope\n"
        #expect(ApplicationIdentity.resolve(environment: [:], cgroup: escaped) == "my-mail")
        #expect(ApplicationIdentity.resolve(environment: ["GIO_LAUNCHED_DESKTOP_FILE": "/usr/share/applications/org.example.Mail.desktop"],
                                            cgroup: "0::/\n") == "org.example.Mail")
    }

    /// A shell's program: its login session, its terminal's scope or the user manager name no app.
    @Test func aProgramRunByHandHasNoIdentifier() {
        for cgroup in ["0::/user.slice/user-1000.slice/session-3.scope\n", "0::/init.scope\n", "0::/\n",
                       "0::/user.slice/user-1000.slice/user@1000.service/app.slice/vte-spawn-1f2e.scope\n",
                       "0::/user.slice/user-1000.slice/user@1000.service/init.scope\n", "9:name=systemd:/\n"] {
            #expect(ApplicationIdentity.resolve(environment: [:], cgroup: cgroup) == nil, "\(cgroup)")
        }
    }

    @Test func aStorageWithoutAServiceNeedsAnIdentifier() {
        var configuration = KeychainConfiguration(storeDirectory: NSTemporaryDirectory() + "unused", tpm: .embedded)
        configuration.applicationIdentifier = nil
        do {
            let storage = try createKeychain(configuration: configuration)
            Issue.record("made a storage of service '\(storage.service)'")
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("KEYCHAIN_APP_ID"), "\(error)")
        }
        #expect(throws: Never.self) { try createKeychain(.init(service: "mail"), configuration: configuration) }
    }
}
