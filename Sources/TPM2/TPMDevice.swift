/// Where the TPM is: a value, parsed from the same strings as `TPM2TCTI`.
public enum TPMDevice: Sendable, Hashable, CustomStringConvertible {
    /// A kernel device; `/dev/tpmrm0` goes through the kernel's resource manager.
    case device(path: String)
    /// A software TPM speaking the swtpm socket protocol on TCP (any local user can reach the port).
    case swtpm(host: String, port: Int)
    /// A software TPM on a Unix socket; its control socket is `path` + `.ctrl`.
    case swtpmSocket(path: String)
    /// The user-space resource manager tpm2-abrmd, on D-Bus.
    case tabrmd(config: String)
    /// Any other TCTI configuration string, passed to the TCTI loader unchanged.
    case custom(String)

    public static let defaultDevice = TPMDevice.device(path: "/dev/tpmrm0")

    /// A TCTI string that names no TPM unambiguously.
    public struct InvalidConfiguration: Error, Sendable, CustomStringConvertible {
        public let description: String
    }

    /// Parses `swtpm:path=/run/…/tpm`, `swtpm:host=127.0.0.1,port=2321`, `device:/dev/tpmrm0`, `tabrmd:`
    /// and the like. A malformed `swtpm:` string is refused, never read as the default port 2321,
    /// which any local user may be listening on.
    public init(parsing conf: String) throws(InvalidConfiguration) {
        let (name, rest) = conf.firstIndex(of: ":").map {
            (String(conf[..<$0]), String(conf[conf.index(after: $0)...]))
        } ?? (conf, "")
        switch name {
        case "device":
            self = .device(path: rest.isEmpty ? "/dev/tpmrm0" : rest)
        case "swtpm":
            self = try Self.swtpm(conf, rest)
        case "tabrmd":
            self = .tabrmd(config: rest)
        default:
            self = conf.hasPrefix("/") ? .device(path: conf) : .custom(conf)
        }
    }

    private static func swtpm(_ conf: String, _ rest: String) throws(InvalidConfiguration) -> TPMDevice {
        var values: [String: String] = [:]
        for pair in rest.split(separator: ",", omittingEmptySubsequences: false) where !rest.isEmpty {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            guard kv.count == 2, ["host", "port", "path"].contains(kv[0]), !kv[1].isEmpty, values[kv[0]] == nil else {
                throw invalid(conf)
            }
            values[kv[0]] = kv[1]
        }
        if let path = values["path"] {
            guard values.count == 1 else { throw invalid(conf) }
            return .swtpmSocket(path: path)
        }
        let port = values["port"].map { Int($0) } ?? 2321
        guard let port, (1...65534).contains(port) else { throw invalid(conf) }
        return .swtpm(host: values["host"] ?? "127.0.0.1", port: port)
    }

    private static func invalid(_ conf: String) -> InvalidConfiguration {
        InvalidConfiguration(description: "Invalid TCTI '\(conf)': use 'swtpm:path=SOCKET' (a Unix socket), "
                             + "'swtpm:host=HOST,port=PORT' (a port from 1 to 65534, the control port is the next one), "
                             + "'device:/dev/tpmrm0' or 'tabrmd:'")
    }

    /// The string handed to `Tss2_TctiLdr_Initialize`.
    public var tctiConfiguration: String {
        switch self {
        case .device(let path): "device:\(path)"
        case .swtpm(let host, let port): "swtpm:host=\(host),port=\(port)"
        case .swtpmSocket(let path): "swtpm:path=\(path)"
        case .tabrmd(let config): "tabrmd:\(config)"
        case .custom(let conf): conf
        }
    }

    public var description: String { tctiConfiguration }

    /// Whether a connection kept open between operations leaves the TPM free for other processes:
    /// tpm2-tss's swtpm TCTI connects for each command and closes after its answer, and a resource
    /// manager serves many connections. Not `/dev/tpm0` (one open at a time), nor a TCTI this code
    /// does not know (mssim's keeps its socket, which its simulator serves one at a time).
    public var allowsAKeptConnection: Bool {
        switch self {
        case .swtpm, .swtpmSocket: true
        default: hasResourceManager
        }
    }

    /// Whether a resource manager stands between processes and the TPM (`/dev/tpmrm*`, tpm2-abrmd):
    /// it flushes what a dead client left and swaps contexts. Without one (swtpm, mssim, `/dev/tpm0`,
    /// and any kind this code does not know), processes must take turns and clean up after each other.
    public var hasResourceManager: Bool {
        switch self {
        case .device(let path): path.hasPrefix("/dev/tpmrm")
        case .tabrmd: true
        case .custom(let conf): conf.hasPrefix("tabrmd") || conf.hasPrefix("device:/dev/tpmrm")
        default: false
        }
    }
}
