import KeychainCore

extension KeychainConfiguration {
    /// `check`, or `noPrompt` when the device can give `value` but the authenticator reaches no one
    /// (a read would fail with `INTERACTION_NOT_ALLOWED`). No authenticator at all is the app's
    /// choice (reads answered elsewhere, or never) and leaves `check` as it is.
    package func promptReach(for value: AccessControl, _ check: AccessControlCheck) async -> AccessControlCheck {
        guard check.available, value != .none, let authenticator,
              case .unreachable = await authenticator.reachability() else { return check }
        return AccessControlCheck(available: false, reason: .noPrompt)
    }
}
