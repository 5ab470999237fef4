@testable import Keychain
@testable import KeychainEngine
import Testing
import TPM2

/// The library's own device-lock layout (`DeviceLockLayout`, not a restated copy) against tpm2-tools 5.4
/// on swtpm: the vectors of PolicyKnownAnswerTests (TPM2Tests), whose commands made them, plus the real
/// epoch and descriptor indices, made the same way after those:
///
///     tpm2_policysecret -S s.ctx -c 0x01004B50 kat-pin; tpm2_policycommandcode -S s.ctx -L inc.policy TPM2_CC_NV_Increment
///     tpm2_nvdefine 0x01004B52 -C o -s 8 -a "nt=counter|policywrite|authread|no_da" -L inc.policy
///     tpm2_nvreadpublic 0x01004B52, before and after an increment through that policy
///     tpm2_nvdefine 0x01004B53 -C o -s 512 -a "policywrite|authread|no_da" -L unlock.policy
///     tpm2_nvreadpublic 0x01004B53, before and after a write through PolicySecret + PolicyCommandCode(NV_Write)
///
/// The sessions run the same step lists (`TPMContext.run`), so these pin what the TPM is asked too.
@Suite("The device-lock layout's digests and names match tpm2-tools")
struct DeviceLockKnownAnswerTests {
    /// The stand-in approval key of the vectors (PolicyKnownAnswerTests: `key.name`).
    static let approvalKeyName = [UInt8](hexString: "000b6b0972bf7e0d2f1ba4eb5281d6ee4e69778a05a9434cd54f7516b437e6780d04")

    @Test func thePinIndex() {
        let pin = DeviceLockLayout.pinPublic
        #expect(pin.attributes == 0x0204_0082)
        #expect(pin.authPolicy.hexText == "aa83a598d93a56c9ca6fea7c3ffc4e106357ff6d93e11a9b4ac2b6aae12ba0de")
        #expect(pin.name(written: false).hexText == "000b58a8d55f93f45444f35f7c317792cbbdd70aeeafe213cc3be09be5337740c42b")
        #expect(DeviceLockLayout.pinName.hexText == "000be85395674a882845dc209337972fbd860b0d674c6dfe1da23192bad2787329e8")
    }

    @Test func theStateIndexAndItsTwoBranches() {
        #expect(DeviceLockLayout.unlockBranch.hexText == "7fa0815dd9e5198be0bace9010d364c54cacb250ec2a9fc3cfbcba14c2c7441a")
        #expect(DeviceLockLayout.lockBranch(approvalKeyName: Self.approvalKeyName).hexText
                == "10f424b1d9822466b0715930bec3eefacf8448a49f727ae7335b4f918313701a")
        let state = DeviceLockLayout.statePublic(approvalKeyName: Self.approvalKeyName)
        #expect(state.attributes == 0x0A04_0008)
        #expect(state.authPolicy.hexText == "ea8abcf30252367d8470bde8613833b4b8092c93e5998d6046f6b2b78a5b9568")
        #expect(state.name(written: false).hexText == "000bc0c36516cfda8bab8ebe61266a88376db879c924df4314e1b9ae5b0eea1c3ef1")
        #expect(state.name(written: true).hexText == "000b51dde80f67eabe2c18249c4c724cf328e6bf87a5cd4d6d19f6a091f72adf8da7")
        // What the approval key signs: PolicyCpHash of NV_Write(state, [0]) on the written index.
        #expect(DeviceLockLayout.lockPolicy(state: state).hexText == "730007f7786949a701427b257ffb9f9adcd7b3bbef76111231f1020c7ba2945b")
        // The step lists the sessions run end in the index's policy.
        #expect(PolicyDigest.compute(DeviceLockLayout.unlockSteps(approvalKeyName: Self.approvalKeyName)) == state.authPolicy)
        #expect(PolicyDigest.compute(DeviceLockLayout.lockSteps(approvalKeyName: Self.approvalKeyName)) == state.authPolicy)
    }

    @Test func theEpochCounter() {
        let epoch = DeviceLockLayout.epochPublic
        #expect(epoch.attributes == 0x0204_0018)
        #expect(epoch.authPolicy.hexText == "e97e1381b8f2186bfa86b61b4601124a6e24a48d4a14eec3b6ecff47c5ebabaf")
        #expect(epoch.name(written: false).hexText == "000ba3d37f1948d4eddb9b6cec66625bd4521456d6f1a14684d85a97f78931ac7e54")
        #expect(epoch.name(written: true).hexText == "000b82bda2e990abad1ed8a5c44fd4a068f5561d34fd8ca7b3c7134b58462c2ca0a5")
    }

    @Test func theDescriptorIndex() {
        let descriptor = DeviceLockLayout.descriptorPublic
        #expect(descriptor.attributes == 0x0204_0008 && descriptor.size == 512)
        #expect(descriptor.name(written: false).hexText == "000b75e5280085af2642fac21e5755e10358fd4f455ad816d9faef55364833b51408")
        #expect(descriptor.name(written: true).hexText == "000b7542efb9c3cc8eea88df144ab8b14efeb72f601908abf9ebf8ddd98ffbdcc85e")
    }
}

private extension Array where Element == UInt8 {
    var hexText: String { map { String(format: "%02x", $0) }.joined() }
    init(hexString: String) {
        let digits = Array(hexString.utf8)
        self = stride(from: 0, to: digits.count, by: 2).map { UInt8(String(decoding: digits[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
    }
}
