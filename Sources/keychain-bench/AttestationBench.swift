import Foundation
import Keychain
import KeychainTestSupport
import SecureMemory

/// `keychain-bench --attestation`: the TPM commands of the device's attestation calls (counted at
/// the one ESAPI call point), and what a provisioning server does with no TPM, on this thread:
/// challenges, verifications of an answer (with the EK certificate chain and without), and key
/// attestations verified, per second of wall time and per second of this thread's CPU time (the
/// second holds on a loaded machine; the first is what one idle core gives).
func attestationBench(rounds: Int) async throws -> String {
    let tpm = try SoftwareTPM()
    let ca = [UInt8](try Data(contentsOf: URL(fileURLWithPath: try tpm.manufacture())))
    let configuration = tpm.configuration()
    let device = KeychainDevice(configuration: configuration)
    let administration = try KeychainAdministration(configuration: configuration)
    _ = try await device.initialize()
    let storage = try createKeychain(.init(service: "bench-attest", accessible: .afterFirstUnlockThisDeviceOnly), configuration: configuration)
    try await storage.setItem("k", "v")

    var report = "## Attestation (keychain-bench --attestation)\n\n"
    report += "TPM commands per call on a provisioned device (swtpm), counted at the ESAPI call point:\n\n| call | TPM commands |\n|---|---|\n"
    _ = await device.takeTPMCommandCount()
    _ = try await administration.makeAttestationKey()
    report += "| attest init (makes the AK) | \(await device.takeTPMCommandCount()) |\n"
    let request = try await administration.attestationRequest()
    report += "| attest request | \(await device.takeTPMCommandCount()) |\n"
    let (challenge, state) = try AttestationServer.challenge(for: request)
    _ = await device.takeTPMCommandCount()
    let answer = try await administration.answer(challenge)
    report += "| attest respond | \(await device.takeTPMCommandCount()) |\n"
    let eccRequest = try await administration.attestationRequest(endorsementKey: .eccP384)
    report += "| attest request --endorsement-key eccP384 | \(await device.takeTPMCommandCount()) |\n"
    let (eccChallenge, eccState) = try AttestationServer.challenge(for: eccRequest)
    _ = await device.takeTPMCommandCount()
    let eccAnswer = try await administration.answer(eccChallenge)
    report += "| attest respond, ECC P-384 EK (H-3) | \(await device.takeTPMCommandCount()) |\n"
    guard try AttestationServer.verify(eccAnswer, state: eccState, ekCA: ca).endorsementCertificateVerified else {
        throw SoftwareTPMError("the bench's ECC EK certificate did not verify")
    }
    let nonce = Sodium.randomBytes(32)
    let attestation = try await storage.attestKey(nonce: nonce)
    report += "| attest key (afterFirstUnlockThisDeviceOnly: CertifyCreation and NV_Certify) | \(await device.takeTPMCommandCount()) |\n"
    let identity = try AttestationServer.verify(answer, state: state, ekCA: ca)
    guard try AttestationServer.verifyKey(attestation, identity: identity, nonce: nonce).matchesClaim else {
        throw SoftwareTPMError("the bench's key attestation does not match its claim")
    }

    let others = OtherWork(swtpmDirectory: tpm.directory + "/state")
    report += "\nThe server (no TPM), \(rounds) rounds each on one thread:\n\n| server call | per second (wall) | per CPU-second of the thread |\n|---|---|---|\n"
    func measure(_ what: String, _ body: () throws -> Void) rethrows {
        let (wall, cpu) = (ContinuousClock.now, threadCPUSeconds())
        for _ in 0..<rounds { try body() }
        let (wallSeconds, cpuSeconds) = ((ContinuousClock.now - wall).seconds, threadCPUSeconds() - cpu)
        report += "| \(what) | \(Int(Double(rounds) / wallSeconds)) | \(Int(Double(rounds) / cpuSeconds)) |\n"
    }
    try measure("attest challenge (RSA-OAEP to the EK, KDFa, HMAC)") { _ = try AttestationServer.challenge(for: request) }
    try measure("attest challenge, ECC P-384 EK (ECDH, KDFe and KDFa SHA-384, HMAC-SHA384, AES-256)") {
        _ = try AttestationServer.challenge(for: eccRequest)
    }
    try measure("attest verify, no --ek-ca") { _ = try AttestationServer.verify(answer, state: state, ekCA: nil) }
    try measure("attest verify, ECC P-384 EK, no --ek-ca") { _ = try AttestationServer.verify(eccAnswer, state: eccState, ekCA: nil) }
    try measure("attest verify --ek-ca (the EK certificate's chain too)") { _ = try AttestationServer.verify(answer, state: state, ekCA: ca) }
    try measure("attest verify --ek-ca, ECC P-384 EK and its certificate") { _ = try AttestationServer.verify(eccAnswer, state: eccState, ekCA: ca) }
    try measure("attest verify-key (CertifyCreation and NV_Certify)") {
        _ = try AttestationServer.verifyKey(attestation, identity: identity, nonce: nonce)
    }
    #if DEBUG
    let build = "DEBUG BUILD (use -c release for representative figures)"
    #else
    let build = "release build"
    #endif
    report += "\n\(build); \(ProcessInfo.processInfo.activeProcessorCount) cores, of whose time other processes used "
        + String(format: "%.0f%%", others.percentage()) + " during the server's rounds; load average " + String(format: "%.1f", loadAverage()) + ".\n"
    return report
}

/// This thread's CPU time (CLOCK_THREAD_CPUTIME_ID), in seconds.
private func threadCPUSeconds() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

private func loadAverage() -> Double {
    var loads = [Double](repeating: 0, count: 3)
    return getloadavg(&loads, 3) == 3 ? loads[0] : .nan
}
