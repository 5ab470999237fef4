/// Where the TPM is: a value, parsed from the same strings as `TPM2TCTI`.
public enum TPMDevice: Sendable, Hashable, CustomStringConvertible {
    /// A kernel device; `/dev/tpmrm0` goes through the kernel's resource manager.
    case device(path: String)
    /// A software TPM speaking the swtpm socket protocol.
    case swtpm(host: String, port: Int)
    /// The user-space resource manager tpm2-abrmd, on D-Bus.
    case tabrmd(config: String)
    /// Any other TCTI configuration string, passed to the TCTI loader unchanged.
    case custom(String)

    public static let defaultDevice = TPMDevice.device(path: "/dev/tpmrm0")

    /// Parses `swtpm:host=127.0.0.1,port=2321`, `device:/dev/tpmrm0`, `tabrmd:` and the like.
    public init(parsing conf: String) {
        let (name, rest) = conf.firstIndex(of: ":").map {
            (String(conf[..<$0]), String(conf[conf.index(after: $0)...]))
        } ?? (conf, "")
        switch name {
        case "device":
            self = .device(path: rest.isEmpty ? "/dev/tpmrm0" : rest)
        case "swtpm":
            var host = "127.0.0.1", port = 2321
            for pair in rest.split(separator: ",") {
                let kv = pair.split(separator: "=", maxSplits: 1).map(String.init)
                guard kv.count == 2 else { continue }
                if kv[0] == "host" { host = kv[1] }
                if kv[0] == "port", let p = Int(kv[1]) { port = p }
            }
            self = .swtpm(host: host, port: port)
        case "tabrmd":
            self = .tabrmd(config: rest)
        default:
            self = conf.hasPrefix("/") ? .device(path: conf) : .custom(conf)
        }
    }

    /// The string handed to `Tss2_TctiLdr_Initialize`.
    public var tctiConfiguration: String {
        switch self {
        case .device(let path): "device:\(path)"
        case .swtpm(let host, let port): "swtpm:host=\(host),port=\(port)"
        case .tabrmd(let config): "tabrmd:\(config)"
        case .custom(let conf): conf
        }
    }

    public var description: String { tctiConfiguration }

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
