import Foundation
import Keychain

/// One row of the access-control table: reads of an item behind `accessControl`, each answered
/// the same way.
struct PromptedRead {
    enum Answer: String {
        /// `none`: no prompt. Its figures are the level table's cold read of the same level.
        case noPrompt = "no prompt (cold)"
        case finger = "finger"
        case passcode = "passcode"
    }

    let accessControl: AccessControl
    let accessible: Accessible
    let answer: Answer
    var reads = Samples()
    /// Prompts the authenticator was asked, for all the reads.
    var prompts = 0

    /// The seed's vault level for every value (both answers for the …OrPasscode values), and
    /// afterFirstUnlock for one biometric value and for `passcode`; `none` of both levels for comparison.
    static let rows: [PromptedRead] = {
        let vault = Accessible.whenUnlockedThisDeviceOnly
        var rows: [PromptedRead] = [.init(accessControl: .none, accessible: vault, answer: .noPrompt)]
        for control in AccessControl.allCases where control != .none {
            if control.usesBiometry { rows.append(.init(accessControl: control, accessible: vault, answer: .finger)) }
            if control.allowsPasscode { rows.append(.init(accessControl: control, accessible: vault, answer: .passcode)) }
        }
        rows.append(.init(accessControl: .none, accessible: .afterFirstUnlock, answer: .noPrompt))
        rows.append(.init(accessControl: .biometryAny, accessible: .afterFirstUnlock, answer: .finger))
        rows.append(.init(accessControl: .passcode, accessible: .afterFirstUnlock, answer: .passcode))
        return rows
    }()

    var service: String { "bench.ac.\(accessible.rawValue).\(accessControl.rawValue)" }

    var promptsPerRead: Double { reads.count == 0 ? 0 : Double(prompts) / Double(reads.count) }
}

/// `biometryAny` with a storage `authValidity`: the read that prompts and obtains a TPM ticket, reads
/// inside the window in the same engine, and reads in a fresh engine that present the ticket.
struct AuthValidityResult {
    static let seconds = 300
    static let accessible = Accessible.whenUnlockedThisDeviceOnly
    /// The first read of a service: a prompt, PolicySigned with an expiration, the ticket saved.
    var firstRead = Samples()
    var firstPrompts = 0
    /// Later reads in the same engine: the unsealed key is kept until the window ends.
    var windowRead = Samples()
    /// Later reads after `dropCaches()`: the ticket (PolicyTicket), no prompt.
    var ticketRead = Samples()
    /// Prompts during the window and ticket reads (0 expected).
    var laterPrompts = 0
}

extension Bench {
    /// Reads of one access-control row. A `none` row takes the level table's cold read; the others
    /// read one item again and again in this engine, one pushed answer per read (nothing is cached
    /// without authValidity, so each read prompts and unseals in the TPM).
    func measure(_ row: PromptedRead, levels: [LevelResult]) async throws -> PromptedRead {
        var result = row
        if row.answer == .noPrompt {
            guard let level = levels.first(where: { $0.accessible == row.accessible }) else {
                throw BenchFailure("no level result for \(row.accessible.rawValue)")
            }
            result.reads = level.coldGet
            return result
        }
        let keychain = try createKeychain(.init(service: row.service, accessible: row.accessible,
                                                accessControl: row.accessControl), configuration: configuration)
        try await keychain.setItem("k0", secret)  // untimed: seals the service's wrapping key
        let secret = self.secret
        let asked = authenticator.requests.count
        let authenticator = self.authenticator, byFinger = row.answer == .finger
        let push: () async -> Void = {
            authenticator.push(byFinger ? .finger(Bench.finger) : .passcode(Bench.passcodeBytes()))
        }
        result.reads = try await sample(options.cold, before: push) {
            guard try await keychain.getItem("k0") == secret else { throw BenchFailure("getItem returned another value") }
        }
        result.prompts = authenticator.requests.count - asked
        guard result.prompts == result.reads.count else {
            throw BenchFailure("\(row.service): \(result.prompts) prompts for \(result.reads.count) reads")
        }
        return result
    }

    func measureAuthValidity() async throws -> AuthValidityResult {
        var result = AuthValidityResult()
        let count = options.cold
        // One service per first read: a service's ticket, once saved, spares later reads the prompt.
        let keychains = try (0..<count).map { i in
            try createKeychain(.init(service: "bench.av.\(i)", accessible: AuthValidityResult.accessible,
                                     accessControl: .biometryAny, authValidity: AuthValidityResult.seconds),
                               configuration: configuration)
        }
        for keychain in keychains { try await keychain.setItem("k0", secret) }  // untimed
        let secret = self.secret
        func read(_ keychain: Keychain) async throws {
            guard try await keychain.getItem("k0") == secret else { throw BenchFailure("getItem returned another value") }
        }

        var asked = authenticator.requests.count
        var next = 0
        let authenticator = self.authenticator
        let push: () async -> Void = { authenticator.push(.finger(Bench.finger)) }
        result.firstRead = try await sample(count, before: push) {
            try await read(keychains[next])
            next += 1
        }
        result.firstPrompts = authenticator.requests.count - asked
        guard result.firstPrompts == count else {
            throw BenchFailure("authValidity: \(result.firstPrompts) prompts for \(count) first reads")
        }

        // No answer is pushed from here on: a prompt would be interrupted and fail the read.
        asked = authenticator.requests.count
        result.windowRead = try await sample(options.warm) { try await read(keychains[0]) }
        next = 0
        result.ticketRead = try await sample(count, before: { await device.dropCaches() }) {
            try await read(keychains[next % count])
            next += 1
        }
        result.laterPrompts = authenticator.requests.count - asked
        guard result.laterPrompts == 0 else {
            throw BenchFailure("authValidity: \(result.laterPrompts) prompts inside the window")
        }
        return result
    }
}
