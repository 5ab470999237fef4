import Testing
import TPM2

/// Offline digests and names pinned against tpm2-tools 5.4 on swtpm (TPM 2.0 Part 3, section 23).
///
/// The vectors were made on a private swtpm, in this order:
///
///     swtpm socket --tpm2 --server type=tcp,port=23417 --ctrl type=tcp,port=23418 \
///         --tpmstate dir=state --flags not-need-init,startup-clear &
///     export TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=23417
///     # PIN index, then written (pinparams.bin: pinCount 0, pinLimit 5)
///     tpm2_nvdefine 0x01004B50 -C o -s 8 -a "nt=pinfail|ownerwrite|authread|no_da" -L pin.policy -p kat-pin
///     tpm2_nvwrite 0x01004B50 -C o -i pinparams.bin
///     # stand-in approval key (flush transients between the three: swtpm has no resource manager)
///     tpm2_createprimary -C o -g sha256 -G ecc256 -c primary.ctx
///     tpm2_create -C primary.ctx -G ecc256:ecdsa-sha256 \
///         -a "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|noda|sign" -u key.pub -r key.priv
///     tpm2_load -C primary.ctx -u key.pub -r key.priv -c key.ctx -n key.name
///     # state index, then written with 1 through the unlock branch
///     tpm2_nvdefine 0x01004B51 -C o -s 1 -a "policywrite|authread|no_da|clear_stclear" -L state.policy
///     tpm2_startauthsession --policy-session -S p.ctx
///     tpm2_policysecret -S p.ctx -c 0x01004B50 kat-pin
///     tpm2_policycommandcode -S p.ctx TPM2_CC_NV_Write
///     tpm2_policyor -S p.ctx -l sha256:unlock.policy,lock.authorize
///     tpm2_nvwrite 0x01004B51 -i unlocked.bin -P session:p.ctx; tpm2_flushcontext p.ctx
///     # epoch counter, then incremented once (value 1)
///     tpm2_nvdefine 0x01004B52 -C o -s 8 -a "nt=counter|policywrite|authread|no_da" -L epoch.policy
///     tpm2_startauthsession --policy-session -S p.ctx
///     tpm2_policycommandcode -S p.ctx TPM2_CC_NV_Increment
///     tpm2_nvincrement 0x01004B52 -P session:p.ctx; tpm2_flushcontext p.ctx
///
/// Every digest below comes from a trial session: `tpm2_startauthsession -S s.ctx`, the commands
/// quoted on the test, then `tpm2_flushcontext s.ctx`; `-L` wrote the digest. Files: pcr7.bin is 32
/// bytes of 0x07, pcr0.bin 32 zero bytes, unlocked.bin 0x01, locked.bin 0x00, lockref.bin
/// "keychain-lock", secretref.bin "kat-ref", zero32.bin 32 zero bytes.
@Suite("Offline policy digests match tpm2-tools trial sessions")
struct PolicyKnownAnswerTests {
    typealias Lock = DeviceLockFixture

    // MARK: PolicyPCR

    /// tpm2_policypcr -S s.ctx -l sha256:7 -f pcr7.bin -L pcr7.policy
    @Test func policyPCRDigestMatchesTpm2ToolsTrialSession() {
        let digest = PolicyDigest.compute([.pcr(selection: PCRSelection([7]), digest: sha256(Lock.pcr7Value))])
        #expect(digest.hex == "558849a0429135265c3dd6805ac252c2eca1ee7604742129c96f58d8821c2a89")
    }

    /// cat pcr0.bin pcr7.bin > pcr07.bin; tpm2_policypcr -S s.ctx -l sha256:0,7 -f pcr07.bin -L pcr07.policy
    @Test func policyPCROverTwoPCRsHashesTheirValuesInIndexOrder() {
        let values = [UInt8](repeating: 0, count: 32) + Lock.pcr7Value
        let digest = PolicyDigest.compute([.pcr(selection: PCRSelection([7, 0]), digest: sha256(values))])
        #expect(digest.hex == "f68f25c14cac2f875012beb256a79ba5b5b7d504e563462a557e908a4a8249be")
    }

    // MARK: PolicyCommandCode, PolicyAuthValue

    /// tpm2_policycommandcode -S s.ctx -L cc.policy TPM2_CC_NV_ChangeAuth (and TPM2_CC_NV_Increment, TPM2_CC_Unseal)
    @Test func policyCommandCodeDigestsMatchTpm2ToolsTrialSession() {
        #expect(PolicyDigest.compute([.commandCode(CommandCode.nvChangeAuth)]).hex
                == "445ed953601a045504550999bf2cbb2992cba2dbb5121bcf03869f65b50c26e5")
        #expect(PolicyDigest.compute([.commandCode(CommandCode.nvIncrement)]).hex
                == "e8c02d3c5e701670cbaa327db1a2e9f3f41b2c22793e5c669a6e7f44b912f6c0")
        #expect(PolicyDigest.compute([.commandCode(CommandCode.unseal)]).hex
                == "e613137076524bde487533865884e9732ebee3aacb095d94a6de492ec06c46fa")
    }

    /// tpm2_policyauthvalue -S s.ctx -L authvalue.policy
    @Test func policyAuthValueDigestMatchesTpm2ToolsTrialSession() {
        #expect(PolicyDigest.compute([.authValue]).hex == "8fcd2169ab92694e0c633f1ab772842b8241bbc20288981fc7ac1eddc1fddb0e")
    }

    /// tpm2_policycommandcode -S s.ctx TPM2_CC_NV_ChangeAuth; tpm2_policyauthvalue -S s.ctx -L pin.policy
    @Test func pinIndexAuthPolicyMatchesTpm2ToolsTrialSession() {
        #expect(Lock.pin.authPolicy.hex == "aa83a598d93a56c9ca6fea7c3ffc4e106357ff6d93e11a9b4ac2b6aae12ba0de")
    }

    // MARK: NV names

    /// tpm2_nvreadpublic 0x01004B50, after tpm2_nvdefine and after tpm2_nvwrite (attributes 0x2040082 / 0x22040082)
    @Test func pinIndexNameMatchesTpm2NvReadPublicWrittenAndUnwritten() {
        #expect(Lock.pin.attributes == 0x0204_0082)
        #expect(Lock.pin.name(written: false).hex == "000b58a8d55f93f45444f35f7c317792cbbdd70aeeafe213cc3be09be5337740c42b")
        #expect(Lock.pin.name(written: true).hex == "000be85395674a882845dc209337972fbd860b0d674c6dfe1da23192bad2787329e8")
    }

    /// tpm2_nvreadpublic 0x01004B51, after tpm2_nvdefine and after the unlock write (attributes 0xA040008 / 0x2A040008)
    @Test func stateIndexNameMatchesTpm2NvReadPublicWrittenAndUnwritten() {
        #expect(Lock.state.attributes == 0x0A04_0008)
        #expect(Lock.state.name(written: false).hex == "000bc0c36516cfda8bab8ebe61266a88376db879c924df4314e1b9ae5b0eea1c3ef1")
        #expect(Lock.state.name(written: true).hex == "000b51dde80f67eabe2c18249c4c724cf328e6bf87a5cd4d6d19f6a091f72adf8da7")
    }

    /// tpm2_nvreadpublic 0x01004B52, after tpm2_nvdefine and after tpm2_nvincrement (attributes 0x2040018 / 0x22040018)
    @Test func epochCounterNameMatchesTpm2NvReadPublicWrittenAndUnwritten() {
        #expect(Lock.epoch.attributes == 0x0204_0018)
        #expect(Lock.epoch.authPolicy.hex == "e8c02d3c5e701670cbaa327db1a2e9f3f41b2c22793e5c669a6e7f44b912f6c0")
        #expect(Lock.epoch.name(written: false).hex == "000b926556a0698c5bef04bd0f27c262d8357d6e4676e8373c82e11fdf40e87a2d2e")
        #expect(Lock.epoch.name(written: true).hex == "000bf321b0020da069ed42657d97f93d1dce4c073b542314ef8c5551783af79b6e7f")
    }

    // MARK: PolicySecret

    /// tpm2_policysecret -S s.ctx -c 0x01004B50 -L secret.policy kat-pin
    /// (and with -q secretref.bin: "kat-ref")
    @Test func policySecretOnPinIndexMatchesTpm2ToolsTrialSession() {
        let name = Lock.pin.name(written: true)
        #expect(PolicyDigest.compute([.secret(index: Lock.pin.index, name: name, policyRef: [])]).hex
                == "c6cbc3f4570a5faf965e2bdcf21644d72a25fe83024fd776424136059933d084")
        #expect(PolicyDigest.compute([.secret(index: Lock.pin.index, name: name, policyRef: Array("kat-ref".utf8))]).hex
                == "e36766649f4be9678ed166866bbad749151ba91af0e7f474d1bf39628a12c5d4")
    }

    /// tpm2_policysecret -S s.ctx -c 0x01004B50 kat-pin; tpm2_policycommandcode -S s.ctx -L unlock.policy TPM2_CC_NV_Write
    @Test func unlockBranchMatchesTpm2ToolsTrialSession() {
        #expect(Lock.unlockBranch.hex == "7fa0815dd9e5198be0bace9010d364c54cacb250ec2a9fc3cfbcba14c2c7441a")
    }

    // MARK: PolicyAuthorize, PolicyOR

    /// tpm2_policyauthorize -S s.ctx -i zero32.bin -q lockref.bin -n key.name -L lock.authorize
    /// (a trial session ignores -i: the same digest came out with 32 bytes of 0x11)
    @Test func policyAuthorizeDigestMatchesTpm2ToolsTrialSession() {
        #expect(Lock.lockBranch.hex == "10f424b1d9822466b0715930bec3eefacf8448a49f727ae7335b4f918313701a")
    }

    /// tpm2_policyor -S s.ctx -l sha256:unlock.policy,lock.authorize -L state.policy
    @Test func policyORDigestMatchesTpm2ToolsTrialSession() {
        #expect(Lock.state.authPolicy.hex == "ea8abcf30252367d8470bde8613833b4b8092c93e5998d6046f6b2b78a5b9568")
    }

    /// tpm2_policyauthvalue -S s.ctx; tpm2_policyor -S s.ctx -l sha256:unlock.policy,lock.authorize -L state_after.policy
    /// gave the same digest as PolicyOR alone: a trial PolicyOR resets before it extends.
    @Test func policyORIgnoresTheDigestBeforeIt() {
        let digest = PolicyDigest.compute([.authValue, .or([Lock.unlockBranch, Lock.lockBranch])])
        #expect(digest.hex == "ea8abcf30252367d8470bde8613833b4b8092c93e5998d6046f6b2b78a5b9568")
    }

    // MARK: PolicyCpHash

    /// tpm2_nvwrite 0x01004B51 -i locked.bin --cphash cphash.bin, before and after the unlock write
    /// (the file is a TPM2B_DIGEST: the 0x0020 size, then the hash)
    @Test func nvWriteCpHashMatchesTpm2NvWriteWrittenAndUnwritten() {
        #expect(Lock.state.writeCpHash(data: [0], offset: 0, written: false).hex
                == "13aec439de7119750c9178f0f6087de4c413aa94bf6819741a67d63fd9d08184")
        #expect(Lock.state.writeCpHash(data: [0], offset: 0, written: true).hex
                == "582ea044d683f50540ad596fe9b03c353d721c4b9e1d5f67bbdef85808b76348")
    }

    /// tpm2_policycphash -S s.ctx --cphash-input cphash.bin -L lock.policy (cphash.bin: the written one)
    @Test func policyCpHashDigestMatchesTpm2ToolsTrialSession() {
        let cpHash = [UInt8](hex: "582ea044d683f50540ad596fe9b03c353d721c4b9e1d5f67bbdef85808b76348")
        #expect(PolicyDigest.compute([.cpHash(cpHash)]).hex == "730007f7786949a701427b257ffb9f9adcd7b3bbef76111231f1020c7ba2945b")
    }

    // MARK: PolicyNV

    /// tpm2_policynv -S s.ctx -i unlocked.bin 0x01004B51 eq -L nv_eq.policy
    @Test func policyNVEqualOnStateIndexMatchesTpm2ToolsTrialSession() {
        #expect(PolicyDigest.compute([Lock.stateIs(1, .equal)]).hex
                == "e9a2cb20e29f88c5b54ec7a0c9e52e94361756140b0d8397215555dd0bc7a2e3")
    }

    /// tpm2_policynv -S s.ctx -i locked.bin 0x01004B51 uge -L nv_ge.policy
    @Test func policyNVUnsignedGreaterOrEqualOnStateIndexMatchesTpm2ToolsTrialSession() {
        #expect(PolicyDigest.compute([Lock.stateIs(0, .unsignedGreaterOrEqual)]).hex
                == "802529bb02d705139e4cea9e1859a801a382f4b8702f0bdecf4c17e4df44c365")
    }

    /// tpm2_nvread 0x01004B52 -s 8 -o epoch_value.bin; tpm2_policynv -S s.ctx -i epoch_value.bin 0x01004B52 eq -L epoch_eq.policy
    @Test func policyNVEqualOnEpochCounterMatchesTpm2ToolsTrialSession() {
        #expect(PolicyDigest.compute([Lock.epochIs(1)]).hex
                == "923748659da85c58d4973149c0735c41524977691fc80e88558bf81ac7c2db89")
    }

    // MARK: Wrapping-key policies (SealPolicy's order: PCRs, epoch, state)

    /// tpm2_policypcr -S s.ctx -l sha256:7 -f pcr7.bin; tpm2_policynv -S s.ctx -i locked.bin 0x01004B51 uge -L afu_tdo.policy
    @Test func afterFirstUnlockThisDeviceOnlyPolicyMatchesTpm2ToolsTrialSession() {
        let digest = PolicyDigest.compute([
            .pcr(selection: PCRSelection([7]), digest: sha256(Lock.pcr7Value)),
            Lock.stateIs(0, .unsignedGreaterOrEqual),
        ])
        #expect(digest.hex == "07a3fbe8d6abaed035cf68fb54414dbb4a838de4c96348d1c37e4fd69efd07d5")
    }

    /// tpm2_policypcr -S s.ctx -l sha256:7 -f pcr7.bin; tpm2_policynv -S s.ctx -i epoch_value.bin 0x01004B52 eq;
    /// tpm2_policynv -S s.ctx -i unlocked.bin 0x01004B51 eq -L wu_pc_tdo.policy
    @Test func whenPasscodeSetThisDeviceOnlyPolicyMatchesTpm2ToolsTrialSession() {
        let digest = PolicyDigest.compute([
            .pcr(selection: PCRSelection([7]), digest: sha256(Lock.pcr7Value)),
            Lock.epochIs(1),
            Lock.stateIs(1, .equal),
        ])
        #expect(digest.hex == "2b985f7e1c0e0e48df6585895be24c333b06ea9f4bbd99fd40f3c2a9415509a7")
    }
}
