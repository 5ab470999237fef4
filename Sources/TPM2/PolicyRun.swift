internal import CTSS2

/// Running a policy from the same `PolicyStep` values that compute its digest offline, so what a key
/// is sealed to and what a session asserts cannot drift apart (known-answer tests pin both at once).
extension TPMContext {
    /// Runs `steps` on `session` in order.
    /// - Parameters:
    ///   - nvIndex: the ESAPI resource of an NV index a step names (PolicyNV, PolicyAuthorizeNV).
    ///   - willRun: called before each step, so a caller can name the step that failed.
    ///   - branch: which branch of an `anyOf` to run (the caller knows how it proves the user).
    ///   - other: runs the steps that need more than data (PolicySecret's secret, PolicySigned's signer,
    ///     or a ticket standing in for either).
    /// A `.pcr` step with an empty digest asserts the values the PCRs hold now (the TPM hashes them): the
    /// form that runs before `.authorizeNV`, whose index decides whether those values are approved.
    public func run(_ steps: [PolicyStep], on session: TPMHandle,
                    nvIndex: (UInt32) throws(TPMError) -> TPMHandle,
                    willRun: (PolicyStep) -> Void = { _ in },
                    branch: ([[PolicyStep]]) throws(TPMError) -> Int = { _ in 0 },
                    other: (PolicyStep) throws(TPMError) -> Void = { step throws(TPMError) in
                        throw TPMError(command: "policy step \(step) (run by its caller)", code: .failure)
                    }) throws(TPMError) {
        // The digest so far, offline: an `anyOf`'s PolicyOR names its branches' digests from it.
        var digest = PolicyDigest.empty
        for step in steps {
            if case .authorizeNV(_, _, let approving) = step {
                try run(approving, on: session, nvIndex: nvIndex, willRun: willRun, branch: branch, other: other)
            }
            if case .anyOf(let branches) = step {
                let chosen = try branch(branches)
                try run(branches[chosen], on: session, nvIndex: nvIndex, willRun: willRun, branch: branch, other: other)
                if branches.count > 1 {
                    let or = PolicyStep.or(PolicyStep.branchDigests(branches, after: digest))
                    willRun(or)
                    try runData(or, on: session, nvIndex: nvIndex)
                }
            } else {
                willRun(step)
                switch step {
                case .secret, .signed, .authorize: try other(step)
                default: try runData(step, on: session, nvIndex: nvIndex)
                }
            }
            digest = step.extend(digest)
        }
    }

    /// A step that is data alone.
    private func runData(_ step: PolicyStep, on session: TPMHandle,
                         nvIndex: (UInt32) throws(TPMError) -> TPMHandle) throws(TPMError) {
        switch step {
        case .pcr(let selection, let digest): try policyPCR(session, selection: selection, digest: digest)
        case .nv(let index, _, let operand, let offset, let comparison):
            try policyNV(session, index: try nvIndex(index), operand: operand, offset: offset, comparison: comparison)
        case .commandCode(let code): try policyCommandCode(session, code)
        case .cpHash(let cpHash): try policyCpHash(session, cpHash)
        case .authValue: try policyAuthValue(session)
        case .or(let branches): try policyOR(session, branches)
        case .authorizeNV(let index, _, _): try policyAuthorizeNV(session, index: try nvIndex(index))
        case .secret, .signed, .authorize, .anyOf:
            throw TPMError(command: "policy step \(step) (not data alone)", code: .failure)
        }
    }

    /// PolicyAuthorizeNV with the index as its own read authorization (AUTHREAD, empty authValue).
    public func policyAuthorizeNV(_ session: TPMHandle, index: TPMHandle) throws(TPMError) {
        try call("PolicyAuthorizeNV") {
            Esys_PolicyAuthorizeNV(esys, index.tr, index.tr, session.tr, Self.password, Self.none, Self.none)
        }
    }
}
