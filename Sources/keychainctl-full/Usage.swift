import KeychainCLIText

/// One command's (or subcommand's) lines of the usage page and the options it takes beyond the
/// global ones: `keychainctl help COMMAND` and `COMMAND --help` print these lines, a usage error
/// prints them after its one line, and an option that is not in `options` is refused.
struct CommandUsage {
    /// The command's words: `["attest", "verify"]`.
    let words: [String]
    let options: Set<String>
    let text: String

    init(_ words: String, _ options: Set<String> = [], _ text: String) {
        self.words = words.split(separator: " ").map(String.init)
        self.options = options
        self.text = text
    }
}

/// keychainctl's usage: the whole page (`keychainctl help`) and each command's part of it.
enum Usage {
    /// Options every command takes: where the store, the TPM, the reader and the token are, and how to answer.
    static let globalOptions: Set<String> = [
        "--store", "--tcti", "--json", "--direct", "--reader", "--pcrs", "--pkcs11-uri", "--owner-auth-file", "--help", "-h",
    ]
    /// Options of every item command: which items (`--access-group`) and which storage (`--key-storage`).
    static let itemOptions: Set<String> = ["--access-group", "--key-storage"]

    static let header = """
        usage: keychainctl [--store DIR] [--tcti CONF] [--direct] [--json] COMMAND …

        Through keychaind when KEYCHAIN_SOCKET names its socket, or when /run/keychain/keychaind.sock exists
        and KEYCHAIN_STORE is not set; --direct (or --store, --tcti) uses a store in this process instead.
        keychainctl help COMMAND (or COMMAND --help) prints that command's part of this page.
        """

    /// The page's sections: a title, the commands, and a note that holds for each of them.
    static let sections: [(title: String, commands: [CommandUsage], note: String?)] = [
        ("Device:", device, nil),
        ("Items (the value of `set` is read from stdin to EOF, bytes kept exactly; on a terminal it is asked for):", items, """
            Item commands take --access-group NAME: through keychaind, the items the access group NAME shares
            (groups.d/NAME.conf), for its members only (ACCESS_DENIED otherwise).
            Item commands take --key-storage tee|strongbox: strongbox is the PKCS#11 token of --pkcs11-uri
            (KEYCHAIN_PKCS11_URI); its items are kept apart from the TPM storage of the same service.
            """),
        ("Provisioning and backup (docs/provisioning.md, docs/formats.md):", provisioning, nil),
        ("systemd credentials (through keychaind, root or the access group admin only; docs/credentials.md):", credentials, """
            --user: the same for a unit of your own user manager (systemctl --user), as any user
            """),
        ("The Secret Service on a desktop with gnome-keyring (your session only; docs/secret-service.md):", secretService, nil),
        ("The fingerprint reader (simulated; its own directory, --reader DIR or KEYCHAIN_READER, 'none' for no reader):", reader, nil),
        ("", [CommandUsage("demo", [], """
              demo                         the sign-in flow, step by step, on a fresh embedded software TPM
            """)], nil),
    ]

    static let footer = """
        Passcodes and passphrases are read from stdin, one per line; on a terminal each is asked for, not shown.
        Environment: KEYCHAIN_SOCKET (keychaind's socket), KEYCHAIN_STORE (store directory), KEYCHAIN_TCTI then TPM2TCTI (the TPM), KEYCHAIN_READER
        (the reader's directory, or none), KEYCHAIN_PKCS11_URI (the token), KEYCHAIN_APP_ID (the default service).
        Without either and without /dev/tpmrm0, a software TPM kept in the store directory is used.
        """

    /// The whole page.
    static var page: String {
        var text = header + "\n"
        for section in sections {
            text += "\n" + (section.title.isEmpty ? "" : section.title + "\n") + section.commands.map(\.text).joined(separator: "\n")
            if let note = section.note { text += "\n" + note }
            text += "\n"
        }
        return text + "\n" + footer
    }

    static var all: [CommandUsage] { sections.flatMap(\.commands) }

    /// The entries `words` names: its own when it names a subcommand (`attest verify`), else every
    /// entry of its first word (`attest`); empty for an unknown command.
    static func entries(_ words: [String]) -> [CommandUsage] {
        guard let first = words.first else { return [] }
        if words.count > 1, let exact = all.first(where: { $0.words == Array(words.prefix(2)) }) { return [exact] }
        return all.filter { $0.words.first == first }
    }

    /// `help COMMAND`'s text: the command's lines, the note of its section, and where the rest is.
    /// - Throws: a usage error for a command keychainctl does not have.
    static func help(_ words: [String]) throws(UsageError) -> String {
        guard !words.isEmpty else { return page }
        guard let text = commandText(words) else { throw UsageError(message: "unknown command '\(words[0])'") }
        return text
    }

    /// What follows a usage error's line: the command's usage, or where the commands are listed.
    static func afterError(_ words: [String]) -> String {
        commandText(words) ?? "keychainctl help lists the commands."
    }

    private static func commandText(_ words: [String]) -> String? {
        let found = entries(words)
        guard !found.isEmpty else { return nil }
        let notes = sections.filter { section in section.commands.contains { $0.words.first == found[0].words.first } }.compactMap(\.note)
        return "usage:\n" + found.map(\.text).joined(separator: "\n") + "\n"
            + notes.map { $0 + "\n" }.joined() + "keychainctl help: every command, the global options and the environment."
    }

    /// Refuses an option the command does not take (`attest challenge --ek-ca CA`): before, it was
    /// accepted and ignored. Unknown commands are left to the command's own error.
    static func checkOptions(_ inv: Invocation) throws(UsageError) {
        let found = entries(inv.command)
        guard !found.isEmpty else { return }
        let allowed = found.reduce(globalOptions) { $0.union($1.options) }
        let given = Set(inv.flags.keys).union(inv.switches)
        guard let stray = given.subtracting(allowed).sorted().first else { return }
        let name = (found.count == 1 ? found[0].words : Array(inv.command.prefix(1))).joined(separator: " ")
        throw UsageError(message: "\(name) does not take \(stray)")
    }

    // MARK: The commands

    static let device: [CommandUsage] = [
        CommandUsage("init", ["--owner-auth-out", "--lockout-auth-out", "--allow-empty-owner-auth", "--boot-policy-key"], """
              init [--owner-auth-file FILE|-] [--owner-auth-out FILE] [--lockout-auth-out FILE] [--allow-empty-owner-auth]
                   [--boot-policy-key VENDOR.pub]
                                           provision the TPM and the store, and take ownership of the TPM: an empty
                                           owner or lockout authorization (anyone with TPM access could replace the
                                           passcode's PIN index, or clear the TPM) is set to 32 random bytes, written
                                           first to the --…-auth-out FILE (created 0600, never overwritten, 'hex:…' as
                                           tpm2-tools reads it); without that FILE init provisions, then refuses, unless
                                           --allow-empty-owner-auth. --owner-auth-file: FILE (or stdin) holds the owner
                                           authorization already set (first line); never argv. The embedded software
                                           TPM keeps random ones in <store>/swtpm/ (owner.auth, lockout.auth)
            """),
        CommandUsage("status", [], """
              status                       the TPM, the passcode, the lock state, the TPM's authorizations and
                                           storage root key, the store's rollback counter, with warnings in words
            """),
        CommandUsage("doctor", [], """
              doctor                       what stands and what to do: keychaind, the TPM, the lock, the store's binding,
                                           the credentials socket, the Secret Service's owner; exit 3 on a problem
            """),
        CommandUsage("accept-store", [], """
              accept-store [--owner-auth-file FILE|-]
                                           after a rollback (a copy of the store put back: every operation refuses
                                           it as DATA_CORRUPTED), keep the store as it is now: bind it to a new TPM
                                           counter, undefining the old one (needs the owner authorization)
            """),
        CommandUsage("passcode set", [], """
              passcode set                 the new passcode on stdin (on a terminal: asked twice, not shown)
            """),
        CommandUsage("passcode change", [], """
              passcode change              the current passcode, then the new one, on stdin, one per line
            """),
        CommandUsage("passcode remove", [], """
              passcode remove              the current passcode on stdin; destroys whenPasscodeSetThisDeviceOnly items
            """),
        CommandUsage("passcode reset-tries", [], """
              passcode reset-tries [--owner-auth-file FILE|-]   reset the TPM's count of wrong passcodes
            """),
        CommandUsage("unlock", [], """
              unlock                       the passcode on stdin (no input when none is set); a wrong one says how
                                           many tries are left before the TPM locks it out
            """),
        CommandUsage("lock", [], """
              lock
            """),
        CommandUsage("tpm reboot", [], """
              tpm reboot                   restart the embedded software TPM (a TPM reset)
            """),
        CommandUsage("boot-state status", [], """
              boot-state                   the PCRs ThisDeviceOnly items are bound to: approved and current values
            """),
        CommandUsage("boot-state sign", ["--key", "--pcr", "--generation"], """
              boot-state sign --key VENDOR.pem --pcr N=HEX… [--generation G]   (offline, no TPM) a signed boot
                                           policy for those values on stdout (JSON), generation G 0–63 (default 0)
            """),
        CommandUsage("boot-state install", [], """
              boot-state install POLICY    install a signed policy (the TPM checks its signature)
            """),
        CommandUsage("boot-state revoke-before", [], """
              boot-state revoke-before N   revoke signed policies of generations below N, for good (passcode on
                                           stdin, or --owner-auth-file)
            """),
        CommandUsage("boot-state approve", ["--pcr"], """
              boot-state approve [--pcr N=HEX]… [--owner-auth-file FILE|-]
                                           approve the current boot state (after an update you trust), or with
                                           --pcr the values an update will leave (before its reboot); revokes the
                                           state approved before. The passcode on stdin (no input when none is set),
                                           or the owner authorization with --owner-auth-file
            """),
        CommandUsage("token reset-tries", [], """
              token reset-tries            reset this library's count of wrong token PINs
            """),
    ]

    static let items: [CommandUsage] = [
        CommandUsage("set", itemOptions.union(["--accessible", "--access-control", "--label", "--auth-validity", "--synchronizable"]), """
              set SERVICE KEY [--accessible A] [--access-control C] [--label L] [--auth-validity N] [--synchronizable]
            """),
        CommandUsage("get", itemOptions.union(["--auth-validity", "--touch", "--passcode-stdin"]), """
              get SERVICE KEY [--auth-validity N] [--touch ANSWER | --passcode-stdin]   the value on stdout, exactly as
                                           stored; a passed prompt opens the item for its window (set --auth-validity),
                                           across processes; N shortens it for this read, never widens it.
                                           An item behind an access control asks on the terminal; without one,
                                           answer with --touch FINGER | cancel | fallback | interrupt, or --passcode-stdin
            """),
        CommandUsage("has", itemOptions, """
              has SERVICE KEY              exit 0 when present, 1 when not
            """),
        CommandUsage("rm", itemOptions, """
              rm SERVICE KEY
            """),
        CommandUsage("ls", itemOptions, """
              ls SERVICE
            """),
        CommandUsage("info", itemOptions, """
              info SERVICE KEY
            """),
        CommandUsage("clear", itemOptions, """
              clear SERVICE
            """),
        CommandUsage("can-use", itemOptions, """
              can-use ACCESS_CONTROL       available, and the reason when not
            """),
        CommandUsage("biometry-types", [], """
              biometry-types
            """),
    ]

    static let provisioning: [CommandUsage] = [
        CommandUsage("identity", ["--out"], """
              identity [--out FILE]        the device's identity document (JSON): EK public keys and certificates,
                                           SRK public area and name, the keychain's NV indices, the boot state
            """),
        CommandUsage("seal-for", ["--accessible", "--access-control", "--label", "--version", "--ek-ca", "--parent", "--unattested-srk",
                                  "--credential"], """
              seal-for IDENTITY SERVICE KEY [--accessible A] [--access-control none|passcode] [--label L] [--version N] [--ek-ca CA.pem]
                                           [--parent ek|srk] [--unattested-srk]  (no TPM needed) the value on stdin sealed to that
                                           device's TPM (its EK, or its SRK when it has none): a provisioning bundle on stdout; --ek-ca
                                           refuses a device whose EK certificate does not verify against CA.pem; IDENTITY may be
                                           a verified identity (attest verify), else an SRK bundle needs --unattested-srk
              seal-for IDENTITY --credential UNIT:ID [--accessible A] [--version N] …   the same, for a systemd credential:
                                           its import makes it UNIT's credential ID (docs/credentials.md)
            """),
        CommandUsage("attest init", [], """
              attest init                  (device) the attestation key: restricted signing, under the RSA EK, kept in the store
            """),
        CommandUsage("attest request", ["--endorsement-key"], """
              attest request [--endorsement-key rsa2048|eccP256|eccP384]   (device) EK public and certificate (the RSA EK,
                                           or that ECC EK), AK public and name, SRK name, PCR selection (JSON)
            """),
        CommandUsage("attest challenge", ["--state", "--ledger"], """
              attest challenge REQUEST --state FILE [--ledger DIR]   (server, no TPM) a credential for that EK and AK and a
                                           nonce (JSON on stdout); the credential and nonce kept in FILE (made new, 0600),
                                           the challenge open in the ledger DIR (~/.local/state/keychain/attestation)
            """),
        CommandUsage("attest respond", [], """
              attest respond CHALLENGE     (device) ActivateCredential, a Quote of the PCRs and a Certify of the SRK (JSON)
            """),
        CommandUsage("attest verify", ["--state", "--ledger", "--ek-ca", "--expect-boot-state"], """
              attest verify ANSWER --state FILE [--ledger DIR] [--ek-ca CA.pem] [--expect-boot-state VERIFIED]   (server,
                                           no TPM) the verified identity (JSON) or AUTHENTICATION_FAILED naming the check;
                                           with --expect-boot-state, the PCR values must be those of that verified
                                           identity; the challenge is spent in the ledger (a copy of FILE does not
                                           verify again) and FILE removed once it verified
            """),
        CommandUsage("attest key", itemOptions.union(["--nonce", "--accessible", "--access-control", "--auth-validity"]), """
              attest key SERVICE --nonce HEX [--accessible A] [--access-control C] [--auth-validity N]   (device) the AK's
                                           CertifyCreation of the wrapping key of SERVICE's items of that protection (JSON)
            """),
        CommandUsage("attest verify-key", ["--identity", "--nonce"], """
              attest verify-key ATTESTATION --identity VERIFIED --nonce HEX   (verifier, no TPM) what the TPM enforces on
                                           that key, in words and JSON; exit status 3 when it does not match its claim
            """),
        CommandUsage("import", ["--passcode-stdin"], """
              import BUNDLE [--passcode-stdin]   TPM2_Import of a bundle sealed to this device; the item becomes an
                                           ordinary item of its service (the caller's, through keychaind), or the
                                           systemd credential it was sealed as; never a version older than the one installed
                                           (identity and import through keychaind: root or the access group admin only)
            """),
        CommandUsage("backup", ["--passphrase-stdin", "--to", "--ek-ca", "--parent", "--unattested-srk", "--service", "--out", "--cost",
                                "--passcode-stdin"], """
              backup (--passphrase-stdin | --to IDENTITY [--ek-ca CA.pem] [--parent ek|srk] [--unattested-srk]) [--service S]
                     [--out FILE] [--cost interactive|moderate|sensitive] [--passcode-stdin]
                                           every item of a migratable level (whenUnlocked, afterFirstUnlock, always),
                                           never ThisDeviceOnly, biometric or token items, encrypted under the
                                           passphrase (first line of stdin; the passcode on the second with
                                           --passcode-stdin, asked once); the file on stdout, or --out FILE
                                           With --to the backup's key is sealed to that device's TPM (no passphrase).
            """),
        CommandUsage("restore", ["--passphrase-stdin", "--passcode-stdin"], """
              restore FILE [--passphrase-stdin] [--passcode-stdin]   items come back with their protection, label
                                           and dates; an item that exists or whose protection this device cannot
                                           give is skipped; a backup sealed to this device's TPM needs no passphrase, and
                                           this device's passcode (next line) when it holds passcode items
            """),
    ]

    static let credentials: [CommandUsage] = [
        CommandUsage("credential set", ["--accessible", "--user"], """
              credential set UNIT ID [--accessible A] [--user]   the value on stdin, for LoadCredential=ID:/run/keychain/credentials.sock
            """),
        CommandUsage("credential get", ["--user"], """
              credential get UNIT ID [--user]
            """),
        CommandUsage("credential ls", ["--user"], """
              credential ls [UNIT] [--user]   the IDs of UNIT, or of every unit (UNIT ID per line); never values
            """),
        CommandUsage("credential rm", ["--user"], """
              credential rm UNIT ID [--user]
            """),
    ]

    static let secretService: [CommandUsage] = [
        CommandUsage("secret-service enable", [], """
              secret-service enable        your session starts keychain-secret-service for org.freedesktop.secrets
            """),
        CommandUsage("secret-service disable", [], """
              secret-service disable       gnome-keyring again: removes exactly what enable wrote
            """),
        CommandUsage("secret-service status", [], """
              secret-service status        enabled or not, and each file
            """),
    ]

    static let reader: [CommandUsage] = [
        CommandUsage("reader enroll", [], """
              reader enroll NAME           the device passcode on stdin when one is set
            """),
        CommandUsage("reader remove", [], """
              reader remove NAME           the device passcode on stdin when one is set
            """),
        CommandUsage("reader delete", [], """
              reader delete                the reader and its TPM key (passcode on stdin when set)
            """),
        CommandUsage("reader list", [], """
              reader list
            """),
    ]
}
