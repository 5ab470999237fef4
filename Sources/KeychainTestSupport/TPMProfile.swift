import TPM2

/// How a TPM a device really has behaves, for `SoftwareTPM(profile:)`: each command's time, the
/// commands it lacks, and the warnings it answers. swtpm answers every command of the current spec in
/// microseconds; the devices the keychain is for do not (docs/tpm-profiles.md gives the figures' sources).
///
/// ```swift
/// let tpm = try SoftwareTPM(profile: .oldFirmware)
/// ```
public struct TPMProfile: Sendable {
    public var name: String
    /// The time of a command with no expensive cryptography (GetCapability, PCR_Read, FlushContext, PolicyOR, …).
    public var smallCommand: Duration
    /// The time of the commands that take longer, by command code (`TPMProfile.Command`).
    public var latencies: [UInt32: Duration]
    /// StartAuthSession salted with a key (an ECDH or RSA decryption on the chip); unsalted ones are small.
    public var saltedSession: Duration
    /// Commands the chip does not implement: answered TPM_RC_COMMAND_CODE (0x143) and left out of
    /// GetCapability(TPM_CAP_COMMANDS), as a TPM of spec revision 1.16 does.
    public var missingCommands: Set<UInt32>
    /// Warnings the chip answers instead of running a command (TPM_RC_RETRY, TESTING, YIELDED, NV_RATE).
    public var warnings: [Warning]
    /// The most bytes one NV_Read or NV_Write moves (TPM_PT_NV_BUFFER_MAX); nil for swtpm's own (1024).
    /// More is refused as the chip refuses it, and GetCapability reports this figure.
    public var nvBufferMax: Int?

    /// The first `times` times `command` is sent, the chip answers `code` without running it.
    public struct Warning: Sendable {
        public var command: UInt32
        public var code: TPMReturnCode
        public var times: Int
        public init(command: UInt32, code: TPMReturnCode, times: Int) {
            self.command = command
            self.code = code
            self.times = times
        }
    }

    public init(name: String, smallCommand: Duration = .zero, latencies: [UInt32: Duration] = [:], saltedSession: Duration = .zero,
                missingCommands: Set<UInt32> = [], warnings: [Warning] = [], nvBufferMax: Int? = nil) {
        self.name = name
        self.smallCommand = smallCommand
        self.latencies = latencies
        self.saltedSession = saltedSession
        self.missingCommands = missingCommands
        self.warnings = warnings
        self.nvBufferMax = nvBufferMax
    }

    /// The command codes the profiles name (TPM 2.0 Part 2, Table 12).
    public enum Command {
        public static let createPrimary: UInt32 = 0x131
        public static let certify: UInt32 = 0x148
        public static let certifyCreation: UInt32 = 0x14A
        public static let create: UInt32 = 0x153
        public static let load: UInt32 = 0x157
        public static let unseal: UInt32 = 0x15E
        public static let contextLoad: UInt32 = 0x161
        public static let contextSave: UInt32 = 0x162
        public static let flushContext: UInt32 = 0x165
        public static let quote: UInt32 = 0x158
        public static let sign: UInt32 = 0x15D
        public static let policySigned: UInt32 = 0x160
        public static let startAuthSession: UInt32 = 0x176
        public static let nvWrite: UInt32 = 0x137
        public static let nvRead: UInt32 = 0x14E
        public static let getCapability: UInt32 = 0x17A
        public static let pcrRead: UInt32 = 0x17E
        public static let nvCertify: UInt32 = 0x184
        public static let policyTemplate: UInt32 = 0x190
        public static let createLoaded: UInt32 = 0x191
        public static let policyAuthorizeNV: UInt32 = 0x192
        public static let encryptDecrypt2: UInt32 = 0x193
    }

    /// The time the chip takes for one command (what the proxy adds to swtpm's microseconds).
    func latency(command: UInt32, salted: Bool) -> Duration {
        if command == Command.startAuthSession { return salted ? saltedSession : smallCommand }
        return latencies[command] ?? smallCommand
    }

    /// Per-command figures in milliseconds: the issue 39 table's columns (docs/tpm-profiles.md), and the
    /// 768-byte NV buffer of the parts it names (swtpm's is 1024).
    private static func measured(_ name: String, small: Double, salted: Double, policySigned: Double, sign: Double,
                                 createPrimary: Double, create: Double, load: Double) -> TPMProfile {
        func ms(_ value: Double) -> Duration { .microseconds(Int64(value * 1000)) }
        let signing = ms(sign)
        return TPMProfile(name: name, smallCommand: ms(small),
                          latencies: [Command.policySigned: ms(policySigned), Command.sign: signing, Command.quote: signing,
                                      Command.certify: signing, Command.certifyCreation: signing, Command.nvCertify: signing,
                                      Command.createPrimary: ms(createPrimary), Command.create: ms(create), Command.load: ms(load)],
                          saltedSession: ms(salted), nvBufferMax: 768)
    }

    /// swtpm as it is: no latency, every command.
    public static let swtpm = TPMProfile(name: "swtpm")
    /// A firmware TPM (AMD fTPM, Intel PTT, Pluton) on CRB.
    public static let fastFirmware = measured("fast firmware", small: 0.1, salted: 45, policySigned: 32, sign: 45,
                                              createPrimary: 10, create: 100, load: 20)
    /// A current discrete TPM on SPI (Infineon SLB9672, ST33KTPM, Nuvoton NPCT75x).
    public static let typicalSPI = measured("typical SPI", small: 1.5, salted: 33, policySigned: 36, sign: 35,
                                            createPrimary: 100, create: 90, load: 20)
    /// An older or slower discrete TPM (SLB9670, ST33TPHF, NPCT65x; on I2C, 2–5 times slower still).
    public static let slowDiscrete = measured("slow discrete", small: 3.5, salted: 100, policySigned: 95, sign: 70,
                                              createPrimary: 250, create: 160, load: 40)
    /// A TPM of spec revision 1.16 still in the field (Infineon SLB9665 firmware 5.x, ST33TPHF2ESPI 73.x):
    /// slow discrete timings, without PolicyAuthorizeNV, CreateLoaded, PolicyTemplate and EncryptDecrypt2.
    public static let oldFirmware: TPMProfile = {
        var profile = slowDiscrete
        profile.name = "old firmware (revision 1.16)"
        profile.missingCommands = [Command.policyAuthorizeNV, Command.createLoaded, Command.policyTemplate, Command.encryptDecrypt2]
        return profile
    }()

    /// The profiles by the names `KEYCHAIN_TEST_TPM_PROFILE` takes (scripts/tpm-profiles.sh).
    public static let named: [String: TPMProfile] = ["swtpm": .swtpm, "fast": .fastFirmware, "typical": .typicalSPI,
                                                     "slow": .slowDiscrete, "old": .oldFirmware]

    /// The profile `KEYCHAIN_TEST_TPM_PROFILE` names (nil without it: plain swtpm), for suites that run on each.
    public static func fromEnvironment(_ environment: [String: String]) throws -> TPMProfile? {
        guard let name = environment["KEYCHAIN_TEST_TPM_PROFILE"], !name.isEmpty else { return nil }
        guard let profile = named[name] else {
            throw SoftwareTPMError("KEYCHAIN_TEST_TPM_PROFILE=\(name) is not a profile: one of "
                                   + named.keys.sorted().joined(separator: ", "))
        }
        return profile
    }
}
