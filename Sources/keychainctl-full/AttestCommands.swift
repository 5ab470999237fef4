import Glibc
import FoundationEssentials
import Keychain
import KeychainCLIText

/// `attest init|request|respond|key` on the device (`key` through keychaind too: the caller's own
/// items), `attest challenge|verify|verify-key` on a server with no TPM (docs/provisioning.md,
/// "Prove a device first").
extension Commands {
    /// The server's subcommands: they touch no TPM and no store.
    static func attestOnServer(_ command: [String]) -> Bool {
        command.first == "attest" && ["challenge", "verify", "verify-key"].contains(command.dropFirst().first ?? "")
    }

    func attest() async throws -> Exit {
        let args = Array(inv.command.dropFirst())
        func operands(_ n: Int, _ names: String) throws(UsageError) -> [String] {
            guard args.count == n + 1 else { throw UsageError(message: "attest \(args.first ?? "") takes \(names)") }
            return Array(args.dropFirst())
        }
        switch args.first {
        case "init":
            _ = try operands(0, "no arguments")
            let made = try await administration.makeAttestationKey()
            struct Made: Encodable { let name: String; let created: Bool }
            output(Made(name: made.name, created: made.created)) {
                "attestation key \($0.name) (\($0.created ? "made" : "kept: the store has one"))"
            }
        case "request":
            _ = try operands(0, "no arguments (and --endorsement-key rsa2048|eccP256|eccP384)")
            let type = try inv.flags["--endorsement-key"].map { (name: String) throws(UsageError) in
                guard let type = EndorsementKeyType(rawValue: name) else {
                    throw UsageError(message: "--endorsement-key takes rsa2048 (template L-1, the default), eccP256 (L-2) or eccP384 (H-3)")
                }
                return type
            } ?? .rsa2048
            document(try await administration.attestationRequest(endorsementKey: type).json())
        case "challenge":
            try attestChallenge(try operands(1, "REQUEST --state FILE [--ledger DIR]")[0])
        case "respond":
            let challenge = try AttestationChallenge(json: try readFile(try operands(1, "CHALLENGE")[0],
                                                                        limit: AttestationChallenge.maxLength, what: "the challenge"))
            document(try await administration.answer(challenge).json())
        case "verify":
            try attestVerify(try operands(1, "ANSWER --state FILE [--ledger DIR] [--ek-ca CA.pem] [--expect-boot-state VERIFIED]")[0])
        case "key":
            let service = try operands(1, "SERVICE --nonce HEX [--accessible A] [--access-control C] [--auth-validity N]")[0]
            let accessible = try inv.flags["--accessible"].map { (t: String) throws(KeychainError) in try Accessible(parsing: t) } ?? .afterFirstUnlock
            let control = try inv.flags["--access-control"].map { (t: String) throws(KeychainError) in try AccessControl(parsing: t) } ?? AccessControl.none
            var window = 0
            if let v = inv.flags["--auth-validity"] {
                guard let n = Int(v) else { throw KeychainError.invalidArgument("Invalid authValidity: expected a whole number of seconds, got '\(v)'") }
                window = n
            }
            // A storage's call: through keychaind, the key of the caller's own items.
            let storage = try storage(service, KeychainOptions(accessible: accessible, accessControl: control, authValidity: window))
            document(try await storage.attestKey(nonce: try nonceFlag()).json())
        case "verify-key":
            let attestation = try KeyAttestation(json: try readFile(try operands(1, "KEY-ATTESTATION --identity VERIFIED --nonce HEX")[0],
                                                                    limit: KeyAttestation.maxLength, what: "the key attestation"))
            guard let identityPath = inv.flags["--identity"] else {
                throw UsageError(message: "attest verify-key needs --identity VERIFIED (the verified identity of the device, from attest verify)")
            }
            let identity = try VerifiedIdentity(json: try readFile(identityPath, limit: VerifiedIdentity.maxLength, what: "the verified identity"))
            let report = try AttestationServer.verifyKey(attestation, identity: identity, nonce: try nonceFlag())
            document(report.json())
            // Weaker (or other) than claimed: said in the report, and in the exit status.
            if !report.matchesClaim { return .failure }
        default:
            throw UsageError(message: "attest takes init, request, challenge REQUEST, respond CHALLENGE, verify ANSWER, key SERVICE or verify-key ATTESTATION")
        }
        return .ok
    }

    /// `attest challenge REQUEST --state FILE`: the challenge on stdout, its state kept in FILE and opened in the ledger.
    private func attestChallenge(_ requestPath: String) throws {
        let request = try AttestationRequest(json: try readFile(requestPath, limit: AttestationRequest.maxLength, what: "the request"))
        let statePath = try stateFlag()
        let made = try AttestationServer.challenge(for: request)
        // Open in the ledger before the state exists: a state whose challenge is not open never verifies.
        try ledger().open(made.state)
        // The state is the challenge's secret: made new (never over another), readable by the server only.
        let fd = open(statePath, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw KeychainError(.storageError, "Cannot create \(statePath) (it may exist already)", underlying: .errno(errno)) }
        let state = made.state.json()
        let written = state.withUnsafeBytes { write(fd, $0.baseAddress!, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == state.count, synced else {
            unlink(statePath)
            throw KeychainError(.storageError, "Cannot write \(statePath)", underlying: .errno(errno))
        }
        document(made.challenge.json())
    }

    /// `attest verify ANSWER --state FILE`: the verified identity on stdout, the challenge spent.
    private func attestVerify(_ answerPath: String) throws {
        let answer = try AttestationAnswer(json: try readFile(answerPath, limit: AttestationAnswer.maxLength, what: "the answer"))
        let statePath = try stateFlag()
        let state = try AttestationState(json: try readFile(statePath, limit: AttestationState.maxLength, what: "the challenge's state"))
        let ekCA = try inv.flags["--ek-ca"].map { (path: String) throws(KeychainError) in [UInt8](try readFile(path, limit: 1 << 20, what: "the EK CA file")) }
        let expected = try inv.flags["--expect-boot-state"].map { (path: String) throws(KeychainError) in
            try VerifiedIdentity(json: try readFile(path, limit: VerifiedIdentity.maxLength, what: "the expected boot state (a verified identity)")).bootState
        }
        let verified = try AttestationServer.verify(answer, state: state, ekCA: ekCA, expectedBootState: expected)
        // One answer per challenge: spent in the ledger (a kept copy of the state cannot open it
        // again), and the state goes once it served.
        try ledger().spend(state)
        unlink(statePath)
        document(verified.json())
    }

    /// `--nonce HEX`: the caller's, 1 to 32 bytes.
    private func nonceFlag() throws(KeychainError) -> [UInt8] {
        guard let text = inv.flags["--nonce"] else { throw KeychainError.invalidArgument("attest \(inv.command[1]) needs --nonce HEX (1 to 32 bytes, the caller's)") }
        guard let bytes = hexBytes(text), bytes.count <= 32 else { throw KeychainError.invalidArgument("Invalid --nonce '\(text)': expected 1 to 32 bytes of hex") }
        return bytes
    }

    private func stateFlag() throws(UsageError) -> String {
        guard let path = inv.flags["--state"] else { throw UsageError(message: "attest \(inv.command[1]) needs --state FILE (the challenge's secret, kept by the server)") }
        return path
    }

    /// `--ledger DIR`, else the verifier's own (`AttestationLedger.defaultDirectory`): its open challenges.
    private func ledger() -> AttestationLedger {
        AttestationLedger(directory: inv.flags["--ledger"] ?? AttestationLedger.defaultDirectory(environment: ProcessInfo.processInfo.environment))
    }

    /// A document on stdout (JSON always; `--json` changes only how errors are told).
    private func document(_ json: Data) {
        (json + Data("\n".utf8)).withUnsafeBytes { writeStdout($0) }
    }
}
