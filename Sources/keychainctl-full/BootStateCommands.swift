import FoundationEssentials
import Keychain
import KeychainBasics
import SecureMemory

extension Commands {
    /// `boot-state` and `boot-state approve` (docs/boot-state.md).
    func bootState() async throws -> Exit {
        let args = Array(inv.command.dropFirst())
        switch args.first {
        case nil, "status":
            let status = try await administration.bootState()
            output(status) { bootStateText($0) }
        case "approve":
            guard args.count == 1 else { throw UsageError(message: "boot-state approve takes options only: [--pcr N=HEX]…") }
            let predicted = try predictedValues()
            let status: BootStateStatus
            if inv.flags["--owner-auth-file"] != nil {
                status = try await administration.approveBootStateAsOwner(predicted: predicted)
            } else {
                let pin = try readLines([Self.passcodeIfSet]).first
                status = try await administration.approveBootState(predicted: predicted, passcode: pin.flatMap { $0.count == 0 ? nil : $0 })
            }
            output(status) { "approved\n" + bootStateText($0) }
        case "sign":
            guard let keyFile = inv.flags["--key"], let pem = FileManager.default.contents(atPath: keyFile) else {
                throw KeychainError.invalidArgument("boot-state sign needs --key VENDOR.pem, a readable PEM private key")
            }
            let generation = try inv.flags["--generation"].map { (text: String) throws(KeychainError) -> Int in
                guard let n = Int(text) else { throw KeychainError.invalidArgument("Invalid --generation '\(text)': expected 0 to 63") }
                return n
            } ?? 0
            let key = SecureBytes(copying: Array(pem))
            let policy = try KeychainAdministration.signBootPolicy(pcrs: try predictedValues(), generation: generation, privateKeyPEM: key)
            policy.withUnsafeBytes { writeStdout($0) }
            print("")
        case "install":
            guard args.count == 2, let data = FileManager.default.contents(atPath: args[1]) else {
                throw UsageError(message: "boot-state install takes POLICY, a file boot-state sign wrote")
            }
            let status = try await administration.installBootPolicy(Array(data))
            output(status) { "installed\n" + bootStateText($0) }
        case "revoke-before":
            guard args.count == 2, let generation = Int(args[1]) else { throw UsageError(message: "boot-state revoke-before takes N, a generation") }
            if inv.flags["--owner-auth-file"] != nil {
                try await administration.revokeBootPoliciesAsOwner(before: generation)
            } else {
                let pin = try readLines([Self.passcodeIfSet]).first
                try await administration.revokeBootPolicies(before: generation, passcode: pin.flatMap { $0.count == 0 ? nil : $0 })
            }
            done("revoked signed boot policies of generations below \(generation)")
        default:
            throw UsageError(message: "boot-state takes: status (the default), approve [--pcr N=HEX]…, sign, install POLICY or revoke-before N")
        }
        return .ok
    }

    /// The `--pcr N=HEX` options (repeated, or comma-separated).
    private func predictedValues() throws(KeychainError) -> [Int: [UInt8]] {
        var predicted: [Int: [UInt8]] = [:]
        for text in inv.repeated["--pcr"] ?? [] {
            for item in text.split(separator: ",") {
                let parts = item.split(separator: "=", maxSplits: 1)
                guard parts.count == 2, let pcr = Int(parts[0]), let value = hexBytes(String(parts[1])) else {
                    throw KeychainError.invalidArgument("Invalid --pcr '\(item)': expected N=HEX, a PCR number and its SHA-256 value in hex (64 digits)")
                }
                predicted[pcr] = value
            }
        }
        return predicted
    }

    func hexBytes(_ text: String) -> [UInt8]? {
        text.isEmpty ? nil : Hex.decode(text.utf8)
    }
}

func bootStateText(_ status: BootStateStatus) -> String {
    var lines = ["mode: \(status.mode)", "pcrs: " + status.pcrs.map(String.init).joined(separator: ",")]
    if let installed = status.installedGenerations {
        lines.append("signed policies installed: generations " + installed.map(String.init).joined(separator: ",")
                     + ((status.revokedGenerations ?? []).isEmpty ? "" : " (revoked: " + status.revokedGenerations!.map(String.init).joined(separator: ",") + ")"))
    }
    for pcr in status.pcrs {
        lines.append("pcr \(pcr) current:  \(status.current[pcr] ?? "?")")
        lines.append("pcr \(pcr) approved: \(status.approved?[pcr] ?? (status.approvalIndexWritten ? "(approved elsewhere: values unknown to this store)" : "none"))")
    }
    lines.append(bootStateLine(status))
    return lines.joined(separator: "\n")
}

/// One line for `status`: whether ThisDeviceOnly items open in this boot state.
func bootStateLine(_ status: BootStateStatus) -> String {
    let pcrs = status.pcrs.map(String.init).joined(separator: ",")
    if status.mode == "set-up" {
        // A TPM without PolicyAuthorizeNV: the one state recorded at set-up (BootApproval.swift).
        let fixed = "this TPM cannot approve another (it lacks TPM2_PolicyAuthorizeNV)"
        return status.matches ? "boot state: the one recorded at set-up (PCR \(pcrs)); \(fixed)"
            : "boot state: NOT the one recorded at set-up (PCR " + status.differing.map(String.init).joined(separator: ",")
                + " differs): ThisDeviceOnly items do not open; \(fixed): boot the configuration the keychain was set up in"
    }
    if status.matches { return "boot state: approved (PCR \(pcrs))" }
    if status.mode == "vendor" {
        return "boot state: NOT approved (no installed, unrevoked policy signed for these values): ThisDeviceOnly items do not "
            + "open; install the vendor's policy for this release: keychainctl boot-state install POLICY"
    }
    let which = if status.approved == nil { "the approved values are unknown to this store" }
        else if status.differing.isEmpty {
            // Never an empty list: the values agree, the selections do not.
            "PCR \(status.pcrs.map(String.init).joined(separator: ",")) selected, the approved state covers PCR "
                + (status.approved ?? [:]).keys.sorted().map(String.init).joined(separator: ",")
        } else { "PCR " + status.differing.map(String.init).joined(separator: ",") + " differs" }
    return "boot state: NOT approved (\(which)): ThisDeviceOnly items do not open; if you trust this boot, "
        + "approve it: keychainctl boot-state approve"
}
