@testable import Keychain
@testable import KeychainEngine
import Testing

/// The meta names are on disk: existing stores keep working only while each stays byte-identical.
@Suite struct StoreMetaTests {
    @Test func namesAreTheStoredOnes() {
        let pinned: [(String, String)] = [
            (StoreMeta.srkTR, "tpm.srk.tr"), (StoreMeta.srkName, "tpm.srk.name"),
            (StoreMeta.stateTR, "tpm.state.tr"), (StoreMeta.epochTR, "tpm.epoch.tr"),
            (StoreMeta.pinTR, "tpm.pin.tr"), (StoreMeta.lockDescriptor, "tpm.lock.descriptor"),
            (StoreMeta.manufacturer, "tpm.manufacturer"), (StoreMeta.bootState, "tpm.boot-state"),
            (StoreMeta.passcodeKnownSet, "tpm.passcode.known-set"), (StoreMeta.descriptorTR, "tpm.descriptor.tr"),
            (StoreMeta.lockGeneration, "lock.generation"), (StoreMeta.tokenPINAttempts, "pkcs11.pin-attempts"),
            (StoreMeta.readerKeys, "reader.keys"), (StoreMeta.rollbackCounter, "rollback.counter"),
            (StoreMeta.rollbackValue, "rollback.counter.value"), (StoreMeta.rollbackRetired, "rollback.counter.retired"),
            (StoreMeta.passcodeBudget, "passcode.budget"),
            (StoreMeta.wrongPasscodes, "passcode.wrong-in-a-row"), (StoreMeta.oneNamespace, "items.one-namespace"),
            (StoreMeta.attestationKey, "tpm.attestation-key"), (StoreMeta.policyAuthorizeNV, "tpm.has-policy-authorize-nv"),
            (StoreMeta.ticket(service: "svc", protection: "whenUnlocked.bio"), "ticket:svc/whenUnlocked.bio"),
            (StoreMeta.retired(service: "sé/rv", key: "k"), "retired:6:sé/rv/k"),
        ]
        for (name, stored) in pinned { #expect(Array(name.utf8) == Array(stored.utf8)) }
    }
}
