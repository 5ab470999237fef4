import Foundation
import KeychainTestSupport

/// A 32-byte secret sealed under the keychain's SRK (persistent 0x81000001) with tpm2-tools, read
/// as a shell user would: `tpm2_load … && tpm2_unseal …`, two processes per read, the cheapest form
/// of tpm2-tools' pipeline. nil when tpm2-tools is not installed.
///
/// swtpm has no resource manager, so each read leaves its object loaded; `tpm2_flushcontext -t`
/// clears it after each read, untimed (the kernel's resource manager would do it on a real TPM).
struct TPM2ToolsRead {
    let shell: Subprocess
    let secret: String
    let pub: String, priv: String, context: String

    init?(tpm: SoftwareTPM, secret: String, directory: String) throws {
        let tools = ["tpm2_create", "tpm2_load", "tpm2_unseal", "tpm2_flushcontext"]
        guard tools.allSatisfy(Subprocess.isInstalled) else { return nil }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let secretFile = directory + "/secret.bin"
        (pub, priv, context) = (directory + "/seal.pub", directory + "/seal.priv", directory + "/seal.ctx")
        guard FileManager.default.createFile(atPath: secretFile, contents: Data(secret.utf8),
                                             attributes: [.posixPermissions: 0o600]) else {
            throw BenchFailure("cannot write \(secretFile)")
        }
        self.secret = secret
        shell = Subprocess(directory: directory, extraEnvironment: ["TPM2TOOLS_TCTI": tpm.tcti])
        try shell.check(["tpm2_flushcontext", "-t"])
        try shell.check(["tpm2_create", "-C", "0x81000001", "-i", secretFile, "-u", pub, "-r", priv, "-Q"])
    }

    /// One read: the two processes' time in nanoseconds. `read` runs after them, before the untimed flush.
    func read(then read: () -> Void = {}) throws -> UInt64 {
        let load = try shell.check(["tpm2_load", "-C", "0x81000001", "-u", pub, "-r", priv, "-c", context, "-Q"])
        let unseal = try shell.check(["tpm2_unseal", "-c", context])
        guard unseal.output == Array(secret.utf8) else { throw BenchFailure("tpm2_unseal returned another value") }
        read()
        try shell.check(["tpm2_flushcontext", "-t"])
        return load.nanoseconds + unseal.nanoseconds
    }
}
