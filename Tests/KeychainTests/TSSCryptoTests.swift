import COpenSSL
import CTSSCrypto
import Foundation
import Keychain
import KeychainTestSupport
import KeychainTestThreads
import Testing
import TPM2

/// tpm2-tss's OpenSSL contexts (`Sources/CTSSCrypto`): libtss2-esys gets one private context per
/// process instead of one per hash, HMAC and nonce; every other caller's contexts are its own.
@Suite("tpm2-tss shares one private OpenSSL context", .offThePool)
struct TSSCryptoTests {
    static let childVariable = "KEYCHAIN_TEST_NULL_PROVIDER_CHILD"

    /// A cold read's ~10 OSSL_LIB_CTX_new calls from tpm2-tss all get the context made at the
    /// process's first one: libcrypto makes no context for tpm2-tss after that.
    @Test func aColdReadMakesNoOpenSSLContextAfterTheProcesssFirst() async throws {
        let fixture = try Fixture(throughDaemon: false)
        let storage = try fixture.storage()
        try await storage.setItem("k", "v")
        await fixture.device.dropCaches()
        #expect(try await storage.getItem("k") == "v")
        await fixture.device.dropCaches()
        let before = CTSSCrypto_counts()
        #expect(try await storage.getItem("k") == "v")
        let after = CTSSCrypto_counts()
        // Other tests of this process read too: their requests only add, and the context stays one.
        #expect(after.esysRequests - before.esysRequests >= 10, "tpm2-tss asked for \(after.esysRequests - before.esysRequests) contexts")
        #expect(after.esysContextsMade == 1, "libcrypto made \(after.esysContextsMade) contexts for tpm2-tss")
        #expect(after.esysFreesSkipped - before.esysFreesSkipped >= 10)
        let shared = try #require(CTSSCrypto_sharedContext())
        #expect(shared != UnsafeRawPointer(OSSL_LIB_CTX_get0_global_default()), "tpm2-tss must not get OpenSSL's global context")
    }

    /// A caller outside tpm2-tss (here the test itself) gets libcrypto's own fresh contexts: two
    /// calls, two contexts, neither tpm2-tss's nor the global one, each usable and freed for real.
    @Test func aCallerOutsideTPM2TSSGetsFreshContextsItCanFree() throws {
        let before = CTSSCrypto_counts()
        let first = try #require(OSSL_LIB_CTX_new()), second = try #require(OSSL_LIB_CTX_new())
        #expect(first != second)
        for context in [first, second] {
            #expect(UnsafeRawPointer(context) != CTSSCrypto_sharedContext())
            #expect(context != OSSL_LIB_CTX_get0_global_default())
            let digest = EVP_MD_fetch(context, "SHA256", nil)
            #expect(digest != nil, "a context of its own hashes")
            EVP_MD_free(digest)
        }
        OSSL_LIB_CTX_free(first)
        OSSL_LIB_CTX_free(second)
        let after = CTSSCrypto_counts()
        #expect(after.forwardedNews - before.forwardedNews >= 2)
        #expect(after.forwardedFrees - before.forwardedFrees >= 2)
    }

    /// In a process whose global context has only OpenSSL's `null` provider (it can neither hash nor
    /// make random bytes), tpm2-tss still hashes names and draws its session nonces: in its own
    /// context, not the global one. In a child test process: the global context is the process's.
    ///
    /// tpm2-tss 3.2.1 keeps only its plain hashes, nonces and RSA salt out of the global context: its
    /// HMACs, AES-CFB and ECDH salt use the global one (docs/security.md), so the child runs the TPM
    /// commands that need no more, an NV index's name and a trial policy session, not a salted read.
    @Test func tpm2TSSHashesAndDrawsNoncesWhenTheGlobalContextCannot() throws {
        guard try isTheChildRun(of: "tpm2TSSHashesAndDrawsNoncesWhenTheGlobalContextCannot", variable: Self.childVariable) else { return }
        // Loading a provider explicitly turns off the default provider's fallback loading.
        let null = try #require(OSSL_PROVIDER_load(nil, "null"))
        defer { OSSL_PROVIDER_unload(null) }
        let globalDigest = EVP_MD_fetch(nil, "SHA256", nil)
        #expect(globalDigest == nil, "the global context must not hash")
        EVP_MD_free(globalDigest)
        var byte: UInt8 = 0
        #expect(RAND_bytes(&byte, 1) != 1, "the global context must not make random bytes")

        let tpm = try SoftwareTPM()
        defer { tpm.remove() }
        let context = try TPMContext(device: tpm.device)
        let index = NVPublic(index: 0x0150_0042, attributes: NVAttributes.ownerWrite | NVAttributes.ownerRead | NVAttributes.noDA,
                             authPolicy: [], size: 8)
        // NV_DefineSpace's answer: ESAPI hashes the public area into the index's name.
        let defined = try context.defineNV(index, auth: nil)
        #expect(try context.name(of: defined) == index.name(written: false))
        // StartAuthSession: the caller's nonce.
        let steps: [PolicyStep] = [.commandCode(CommandCode.unseal)]
        let trial = try context.startSession(.trial, saltKey: nil)
        defer { context.flush(trial) }
        try context.run(steps, on: trial, nvIndex: { _ in defined })
        #expect(try context.policyDigest(trial) == PolicyDigest.compute(steps))
        #expect(CTSSCrypto_counts().esysContextsMade == 1)
        #expect(CTSSCrypto_sharedContext() != UnsafeRawPointer(OSSL_LIB_CTX_get0_global_default()))
    }

    /// OpenSSL's clean-up is not run at exit (tss_crypto.c's OPENSSL_INIT_NO_ATEXIT): exit() is
    /// called from a pool thread while idle libdispatch workers that ran OpenSSL work exit too, and
    /// OPENSSL_cleanup freeing OpenSSL's tables under them aborted keychainctl-full about once in 1,000
    /// runs ("malloc_consolidate(): invalid chunk size"). The race is too rare to be a test; what
    /// removes it is: the probe preloaded into the real keychainctl-full says at its exit whether
    /// OPENSSL_cleanup ran. The probe is seen to tell: in `openssl version`, it ran.
    @Test func openSSLsCleanUpDoesNotRunAtExit() throws {
        let probe = buildDirectory.appendingPathComponent("libKeychainTestExitProbe.so").path
        let control = try run("/usr/bin/openssl", ["version"], environment: ["LD_PRELOAD": probe])
        #expect(control.status == 0 && control.stderr.contains("keychain-exit-probe: OPENSSL_cleanup ran at exit"), "\(control.stderr)")

        let tpm = try SoftwareTPM()
        defer { tpm.remove() }
        let full = buildDirectory.appendingPathComponent("keychainctl-full").path
        let store = ["--store", tpm.directory + "/store", "--tcti", tpm.tcti]
        let set = try run(full, store + ["set", "svc", "k"], input: Array("v".utf8), environment: ["LD_PRELOAD": probe])
        #expect(set.status == 0 && set.stderr.contains("keychain-exit-probe: OpenSSL alive at exit"), "\(set.stderr)")
        // The way out of the run that aborted: a backup refused after the TPM said the device is locked.
        #expect(try run(full, store + ["passcode", "set"], input: Array("2468\n".utf8)).status == 0)
        #expect(try run(full, store + ["set", "svc", "u", "--accessible", "whenUnlocked"], input: Array("u".utf8)).status == 0)
        #expect(try run(full, store + ["lock"]).status == 0)
        let refused = try run(full, store + ["backup", "--passphrase-stdin", "--cost", "interactive"], input: Array("pass phrase\n".utf8),
                              environment: ["LD_PRELOAD": probe])
        #expect(refused.status == 3 && refused.stderr.contains("INTERACTION_NOT_ALLOWED")
                && refused.stderr.contains("keychain-exit-probe: OpenSSL alive at exit"), "\(refused.stderr)")
    }
}
