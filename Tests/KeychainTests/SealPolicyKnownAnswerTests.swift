@testable import Keychain
@testable import KeychainEngine
import Testing
import TPM2
import KeychainBasics

/// The digest every protection's wrapping key is sealed to, pinned: a key sealed by an earlier version
/// opens only while `SealPolicy` computes the same digest (and runs the same steps). The values were
/// taken from the policy code before its access-control branch became `PolicyStep` data (issue 40
/// item 5); the step lists the sessions run are the ones hashed here.
@Suite("Every protection's seal policy digest is pinned")
struct SealPolicyKnownAnswerTests {
    /// Fixed stand-ins for what a device supplies at seal time.
    static let stateName = DeviceLockLayout.statePublic(approvalKeyName: DeviceLockKnownAnswerTests.approvalKeyName).name(written: true)
    static let readerKeyName = [UInt8](repeating: 0x5A, count: 34)
    static let enrollmentSet = [UInt8](repeating: 0xE5, count: 16)
    static let keyRef = SealPolicy.keyRef(service: "kat", protection: "tag", publicKey: [UInt8](repeating: 0x11, count: 32))
    static let vendorKeyName = [UInt8](repeating: 0x7E, count: 34)
    static let pcrDigest = [UInt8](repeating: 0x9C, count: 32)

    enum Boot: String, CaseIterable { case approved, literal, vendor }

    /// The policy `TPMKeyring.seal` makes for a protection (the same fields, from fixed inputs).
    static func policy(_ accessible: Accessible, _ accessControl: AccessControl, boot: Boot = .approved,
                       keyRef: [UInt8]? = keyRef, window: Int = 30) -> SealPolicy {
        let biometry = accessControl.usesBiometry
            ? SealPolicy.BiometryBinding(keyName: readerKeyName, tpmHandle: 0x8100_0010,
                                         enrollmentSet: accessControl.isCurrentSet ? enrollmentSet : [],
                                         currentSet: accessControl.isCurrentSet)
            : nil
        var policy = SealPolicy(availability: .init(accessible), stateName: stateName, biometry: biometry,
                                passcode: accessControl.allowsPasscode ? true : nil, keyRef: keyRef,
                                authValidity: accessControl.takesWindow ? window : nil)
        if accessible.isThisDeviceOnly {
            policy.pcrs = [0, 2, 7]
            switch boot {
            case .approved: policy.bootApprovalName = BootApprovalLayout.name
            case .literal: policy.pcrDigest = pcrDigest
            case .vendor: policy.bootVendorKeyName = vendorKeyName
            }
        }
        if accessible.requiresPasscode || !policy.branches.isEmpty { policy.passcodeEpoch = 3 }
        return policy
    }

    static func table() -> [String] {
        var lines: [String] = []
        for accessible in Accessible.allCases {
            for accessControl in AccessControl.allCases {
                let boots: [Boot] = accessible.isThisDeviceOnly ? Boot.allCases : [.approved]
                for boot in boots {
                    lines.append("\(accessible.rawValue)/\(accessControl.rawValue)/\(boot.rawValue) "
                                 + policy(accessible, accessControl, boot: boot).digest.hex)
                }
            }
        }
        for accessControl in AccessControl.allCases where accessControl != .none {
            lines.append("whenUnlocked/\(accessControl.rawValue)/noKeyRef "
                         + policy(.whenUnlocked, accessControl, keyRef: nil).digest.hex)
            lines.append("whenUnlocked/\(accessControl.rawValue)/window0 "
                         + policy(.whenUnlocked, accessControl, window: 0).digest.hex)
        }
        return lines
    }

    /// Every (Accessible × AccessControl), each ThisDeviceOnly value with each boot binding (approved
    /// state, literal PCR values, vendor-signed policy), and the access controls without a keyRef or
    /// with a window of 0. `always/none` asserts nothing: its key uses its empty authValue.
    static let pinned = """
        whenUnlocked/none/approved e9a2cb20e29f88c5b54ec7a0c9e52e94361756140b0d8397215555dd0bc7a2e3
        whenUnlocked/biometryAny/approved c63a1c1808e018c4452b88400e991ded604665031d311eaa0535a30dd1727830
        whenUnlocked/biometryCurrentSet/approved 6de5071ad37604bee7e74272c5cd0aac6f2cd968d270729fcd87c21264b92867
        whenUnlocked/biometryAnyOrPasscode/approved 6c3e830cf93b10afc061e570b5e746aa94cefdda0b70e1eaacf222f9745f1e90
        whenUnlocked/biometryCurrentSetOrPasscode/approved 58e97868ab52e0dca2d30330c01cecaa7276665ce7a7e0c01e0b9c6087df5f2e
        whenUnlocked/passcode/approved 5826ba9a952c68519b9e94e0f72ae7dd8da42e3c027f09f71706496e24eafe19
        afterFirstUnlock/none/approved 802529bb02d705139e4cea9e1859a801a382f4b8702f0bdecf4c17e4df44c365
        afterFirstUnlock/biometryAny/approved 3c66f0bbbed514017256d9f26f7d95f05acc2b78762a24aa0cbfa45cfa45d36c
        afterFirstUnlock/biometryCurrentSet/approved a69965db6dfd1896a48ec781d58fff03b50a4ee2a83bd1fece5baac076887449
        afterFirstUnlock/biometryAnyOrPasscode/approved 2fa60e41af40767a0d958475fe3ecd948fd8cf34d883154f461638360dc251f5
        afterFirstUnlock/biometryCurrentSetOrPasscode/approved f708fdfa8c9adbf4b21152b6cc89fd81054ce4e2660fcd47401e802ed0d16cdf
        afterFirstUnlock/passcode/approved 8e99c4c05e402fbf012d4d787f10970673e02dfb4b4e91583c291c4e81e0a477
        always/none/approved (empty)
        always/biometryAny/approved 86ef6b1629c86aaa8897864e3bff0c403c5f08d1f227d8981a981cfbec114239
        always/biometryCurrentSet/approved 214965ea677db3674d0ce04ad81a39c25f0130c97064e5f1a7b6c2194da78e40
        always/biometryAnyOrPasscode/approved b6eb02c5e0fc3ae8475558c39a7aef75ab4f8a7e9cedaadaa57c921fd735ca55
        always/biometryCurrentSetOrPasscode/approved 02f2ecdb0608412d3bcbc2d3d9b8f2199d333cabaa6ae06b7fe27c27711c45bc
        always/passcode/approved 5ccf2ed5adcb9d545322207d50cc7c28b6a1ecb65e86be9d35812209f9e787d0
        whenPasscodeSetThisDeviceOnly/none/approved e55413880a8a9c4eaa31a4be2acc69c8b7eb6041d1642af9b97184ca00268de3
        whenPasscodeSetThisDeviceOnly/none/literal a59530ef0fa3329dbcf1fc1c6b76836e8cd37aa4dd201d81b94c86128c12a6a6
        whenPasscodeSetThisDeviceOnly/none/vendor b73d8602cc757a755019e88d95d6412b59042da61e4894645df964c13b0a85e6
        whenPasscodeSetThisDeviceOnly/biometryAny/approved bec7672de2d5362f316820e42af2b1cbf9590ce2a0bc67ae2beebd6f3d192ebe
        whenPasscodeSetThisDeviceOnly/biometryAny/literal 7eb205c7627adf7098b0d6b7368e1c401b03cedf8f1c9946f9352d4dcb5140b3
        whenPasscodeSetThisDeviceOnly/biometryAny/vendor d594376efa77f0246d5320c6d2f52fc8d20e09c6270993cd59f8ded6a059196b
        whenPasscodeSetThisDeviceOnly/biometryCurrentSet/approved 9cf2d3a79633eec10ed87c33c85614095c711c9d61e00f61317d3bedc122b195
        whenPasscodeSetThisDeviceOnly/biometryCurrentSet/literal dfbc1cc2c7606d2a2344bda389f11dffe5c027bbf7b9ec2dc8a66fd8f5c81ca4
        whenPasscodeSetThisDeviceOnly/biometryCurrentSet/vendor 9c9d6db93e97e8592012a45482f0771189a124933e16bd61bd5cc570a7ccbb34
        whenPasscodeSetThisDeviceOnly/biometryAnyOrPasscode/approved 03f95a74411d39dd2746c8f2d262092856fc81bdcb61f22dbf5cb85cf03ab102
        whenPasscodeSetThisDeviceOnly/biometryAnyOrPasscode/literal 91cbb44a7095accf2d3a5283e1615429f7b87e9207854553bf7f216d7d4be311
        whenPasscodeSetThisDeviceOnly/biometryAnyOrPasscode/vendor bbb659f25cfd8cd1d55a975b79e8bf8dad4ab6c79beb56de1c7119cac2f2a67e
        whenPasscodeSetThisDeviceOnly/biometryCurrentSetOrPasscode/approved daac6c2f2ec37aa52425940bf94ee8f8a8fbf8ca89a24181a22e20aeeabcaade
        whenPasscodeSetThisDeviceOnly/biometryCurrentSetOrPasscode/literal f81ed9e44a6092d94e549edb539e9f81d0ea971f2171e6499e374173a4a6d067
        whenPasscodeSetThisDeviceOnly/biometryCurrentSetOrPasscode/vendor 614d5fa61736049d8b198e65c56995394b08774deb211f5817bff9fc0a699336
        whenPasscodeSetThisDeviceOnly/passcode/approved fbdb0290526601e69a6f8d0996c760853135d5f593ad08b8173baf5df5f52340
        whenPasscodeSetThisDeviceOnly/passcode/literal 02cb85439acbf1a360053d4547844c46c219a80c58e902d4f3be090d6c7cf8b4
        whenPasscodeSetThisDeviceOnly/passcode/vendor d95a7cf9fd817b2bfb3697021b41b95dcf0747f781c169150a7100a97ab84c38
        whenUnlockedThisDeviceOnly/none/approved 67a82c6756eb2ea12738cbf570e84e6fe11db30f1d92c8d7545d5fcad3468b77
        whenUnlockedThisDeviceOnly/none/literal 817bffca0ba344d411572b6e6fb1f0da81d03d591b42eb979d236c0451bc2aaf
        whenUnlockedThisDeviceOnly/none/vendor 721aefafcf7334f8727d3c7387491d262d63ca4c43d0127262dc71d6fccc4c11
        whenUnlockedThisDeviceOnly/biometryAny/approved bec7672de2d5362f316820e42af2b1cbf9590ce2a0bc67ae2beebd6f3d192ebe
        whenUnlockedThisDeviceOnly/biometryAny/literal 7eb205c7627adf7098b0d6b7368e1c401b03cedf8f1c9946f9352d4dcb5140b3
        whenUnlockedThisDeviceOnly/biometryAny/vendor d594376efa77f0246d5320c6d2f52fc8d20e09c6270993cd59f8ded6a059196b
        whenUnlockedThisDeviceOnly/biometryCurrentSet/approved 9cf2d3a79633eec10ed87c33c85614095c711c9d61e00f61317d3bedc122b195
        whenUnlockedThisDeviceOnly/biometryCurrentSet/literal dfbc1cc2c7606d2a2344bda389f11dffe5c027bbf7b9ec2dc8a66fd8f5c81ca4
        whenUnlockedThisDeviceOnly/biometryCurrentSet/vendor 9c9d6db93e97e8592012a45482f0771189a124933e16bd61bd5cc570a7ccbb34
        whenUnlockedThisDeviceOnly/biometryAnyOrPasscode/approved 03f95a74411d39dd2746c8f2d262092856fc81bdcb61f22dbf5cb85cf03ab102
        whenUnlockedThisDeviceOnly/biometryAnyOrPasscode/literal 91cbb44a7095accf2d3a5283e1615429f7b87e9207854553bf7f216d7d4be311
        whenUnlockedThisDeviceOnly/biometryAnyOrPasscode/vendor bbb659f25cfd8cd1d55a975b79e8bf8dad4ab6c79beb56de1c7119cac2f2a67e
        whenUnlockedThisDeviceOnly/biometryCurrentSetOrPasscode/approved daac6c2f2ec37aa52425940bf94ee8f8a8fbf8ca89a24181a22e20aeeabcaade
        whenUnlockedThisDeviceOnly/biometryCurrentSetOrPasscode/literal f81ed9e44a6092d94e549edb539e9f81d0ea971f2171e6499e374173a4a6d067
        whenUnlockedThisDeviceOnly/biometryCurrentSetOrPasscode/vendor 614d5fa61736049d8b198e65c56995394b08774deb211f5817bff9fc0a699336
        whenUnlockedThisDeviceOnly/passcode/approved fbdb0290526601e69a6f8d0996c760853135d5f593ad08b8173baf5df5f52340
        whenUnlockedThisDeviceOnly/passcode/literal 02cb85439acbf1a360053d4547844c46c219a80c58e902d4f3be090d6c7cf8b4
        whenUnlockedThisDeviceOnly/passcode/vendor d95a7cf9fd817b2bfb3697021b41b95dcf0747f781c169150a7100a97ab84c38
        afterFirstUnlockThisDeviceOnly/none/approved 7e810c1decfdf686bc0887741be9ae69b17ac425a103f2e7921f8a67471a76b6
        afterFirstUnlockThisDeviceOnly/none/literal 4a1ea7a69bcbcf0e24f4a828a7107d34e254653cef5d28a5397aa78f6b3d61e0
        afterFirstUnlockThisDeviceOnly/none/vendor 4b8a4dc13ac6b1382b4e35d548164b78049543a0fa88c8729253ab9d81cdea82
        afterFirstUnlockThisDeviceOnly/biometryAny/approved 3c60c9468774e7ca3c58ce9b85efc7ac9196b6af6f753143a6d7009cdb3cc500
        afterFirstUnlockThisDeviceOnly/biometryAny/literal 7b5ae104d2a3093d4b80c770039581cd299351f3aa724b89868b385df82769ea
        afterFirstUnlockThisDeviceOnly/biometryAny/vendor b043d1edc3f64afa388eb5c25c20537a7b2f0c387e1e98274c0873d038b9cf2d
        afterFirstUnlockThisDeviceOnly/biometryCurrentSet/approved cfd1728a291a939b85b0b3d5dc3de425a2709af0f85537c9eb86322e6ee8ddf5
        afterFirstUnlockThisDeviceOnly/biometryCurrentSet/literal 687ba5efed5394afab1454e353a5765cd7627f7e1c2d1a8aab0c582486227970
        afterFirstUnlockThisDeviceOnly/biometryCurrentSet/vendor d1973400ef84dcd7698a3096545d4ae91bd73de4264f53ff348823b69b2aa748
        afterFirstUnlockThisDeviceOnly/biometryAnyOrPasscode/approved 47725f7f1caabcad793d3905e5ed983c2cadc4e2b1810a23631a5a780fd7abe6
        afterFirstUnlockThisDeviceOnly/biometryAnyOrPasscode/literal 2d45fea525b3bfb57a05cc29f38f424d4bf736e5f54379afb1fb2b5efc3429f9
        afterFirstUnlockThisDeviceOnly/biometryAnyOrPasscode/vendor d15b1d76a80791866f14b33db1744f1ee708c31cf985029eb7ff86f04707a551
        afterFirstUnlockThisDeviceOnly/biometryCurrentSetOrPasscode/approved 373c56c548f9c85306641bfa5dca19354df09a72f54883c73690299d4f111834
        afterFirstUnlockThisDeviceOnly/biometryCurrentSetOrPasscode/literal 9cd3f9f72e66d32fac8cbb68b51ba00a5a0d7147957aa5e19b4c872f64af0f6b
        afterFirstUnlockThisDeviceOnly/biometryCurrentSetOrPasscode/vendor 04cb6e074da6ad6acff94f48985f2d8de554a82940a32dde115369433a4d5b26
        afterFirstUnlockThisDeviceOnly/passcode/approved 6e477e9832c408d1fb0e64e68d92d83e612dd4dc099910fca674f24686ab65e7
        afterFirstUnlockThisDeviceOnly/passcode/literal 86387f163b60f6a8a7f0573b90632048603821b3c306630f5708f7b40052b4a2
        afterFirstUnlockThisDeviceOnly/passcode/vendor 294cd9a57351d20580f77ca3eeb64ba8747e74824fcf5fc27c1a2fc941b00e88
        alwaysThisDeviceOnly/none/approved 97f72420177b75df488f2455bfb37895d21a2f2f8f72b0fe1107144a015ff78a
        alwaysThisDeviceOnly/none/literal 51319d9c274e356a32bcb7e73695f392a99ddd9ef68657a0555325d745c34352
        alwaysThisDeviceOnly/none/vendor f8c13dc5782485e8861c4249b44e0aa88e69f3ffabcf709b371156edb8e15f96
        alwaysThisDeviceOnly/biometryAny/approved f880009568124153e38765313773b60c891344263bdb798fe22b5b5dd043bc42
        alwaysThisDeviceOnly/biometryAny/literal 8b2bf812778d78982ba174907b5e4423b969ff1c61925cbbf1459afb0993d612
        alwaysThisDeviceOnly/biometryAny/vendor b89b3c890c26790b5a4d0fdb293d0df08aef527cf3aadd94cb9ca25b84c184be
        alwaysThisDeviceOnly/biometryCurrentSet/approved 29479d241b62d88d69af433b31cf3065e05bb26e4ab863814bf980801062c5df
        alwaysThisDeviceOnly/biometryCurrentSet/literal c4cc19e4b4e74d41c0dad17e2a579c1b2cd1e01fe2a5d34e3a41f8b85e9a88c7
        alwaysThisDeviceOnly/biometryCurrentSet/vendor d43527f52227a6f6e1fc515b9fce1efe73bce2316b264e6a8f2694c67858a780
        alwaysThisDeviceOnly/biometryAnyOrPasscode/approved cd43854613c3c768d7f2f03a2a2e7de37eb78093e2b238db17cf96b2550873d0
        alwaysThisDeviceOnly/biometryAnyOrPasscode/literal d99c2ffc811ccb9fd98fe3ee680a269db6f8abbbc4e70384ceb112889dbf24be
        alwaysThisDeviceOnly/biometryAnyOrPasscode/vendor 18041a24437caa3014887a8efd5168a88984b9b809eeda60f76687ab2d982c76
        alwaysThisDeviceOnly/biometryCurrentSetOrPasscode/approved 4e09827b78a767fdeb71e108785d4f1da94a101582b29891501b7a3e25312513
        alwaysThisDeviceOnly/biometryCurrentSetOrPasscode/literal 57c02462cc8b5c61a60649c5d0df06ada49dd86d1ec387ec2cab68529b01880d
        alwaysThisDeviceOnly/biometryCurrentSetOrPasscode/vendor 1f33cdf338ee6396d9f44ec22d248429f882433009341144a00ef9b58a5d3a3c
        alwaysThisDeviceOnly/passcode/approved f07376df2bd41d5624b7093aaa0bf67b089c2370a8b77d0158b663fa626f02e3
        alwaysThisDeviceOnly/passcode/literal 0178265424bf4ffb0edff3029fc602f30e46dfe93f3649cb9d9c0871d755fb0d
        alwaysThisDeviceOnly/passcode/vendor 02c027302b596d29caf023a1dd088ca78d6a532ceb3ca8efe9b6b08d0ac57deb
        whenUnlocked/biometryAny/noKeyRef c32c580461887e9eb2f166f822d75213325ff9a80d6f5dada6dc8ff2b6596921
        whenUnlocked/biometryAny/window0 d88e086376379bef90f09a94f146b7004d0d1a92e6cd7fbe57cd141a68ece92a
        whenUnlocked/biometryCurrentSet/noKeyRef 0672d75b3156c46e1c0eb8c0e396d1fb6fe0bde3eb28041009c079b5118fa107
        whenUnlocked/biometryCurrentSet/window0 6de5071ad37604bee7e74272c5cd0aac6f2cd968d270729fcd87c21264b92867
        whenUnlocked/biometryAnyOrPasscode/noKeyRef 55aa28a724aeeb9049b3f093caa7ebab1c3d403deaa6a6e86dc91da8e07546f8
        whenUnlocked/biometryAnyOrPasscode/window0 7ab4bafdbc23b35a40c39c5626ab567bfd8e0fe683a86a712581a1a98240e540
        whenUnlocked/biometryCurrentSetOrPasscode/noKeyRef cbb3d9f3e62e9b4f0d2c8e9e34f16ecd5508845c53a791b56e1030801569c121
        whenUnlocked/biometryCurrentSetOrPasscode/window0 58e97868ab52e0dca2d30330c01cecaa7276665ce7a7e0c01e0b9c6087df5f2e
        whenUnlocked/passcode/noKeyRef f7d9b2b8edc4f24770aef0d83b566682154a0a19ff8fb8d4f073157170a5a0f6
        whenUnlocked/passcode/window0 5826ba9a952c68519b9e94e0f72ae7dd8da42e3c027f09f71706496e24eafe19
        """

    @Test func everyProtectionSealsToItsPinnedDigest() {
        let expected = Self.pinned.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let actual = Self.table()
        #expect(actual.count == expected.count)
        for (line, pinned) in zip(actual, expected) { #expect(line == pinned) }
    }
}

private extension [UInt8] {
    var hex: String { isEmpty ? "(empty)" : Hex.encode(self) }
}
