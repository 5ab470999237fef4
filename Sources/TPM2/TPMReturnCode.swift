internal import CTSS2
import KeychainBasics

/// A TSS2/TPM response code, decoded once at the call point so nothing else parses raw integers.
///
/// Layout (TPM 2.0 Part 2, 6.6): the top byte is the TSS layer (0 = the TPM itself); format-one codes
/// (bit 7) carry the handle, session or parameter number they apply to in bits 8–11.
public struct TPMReturnCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// The TSS layer that produced the code (0 = the TPM, 7 = ESAPI, 10 = TCTI, 11 = resource manager).
    public var layer: UInt8 { UInt8(truncatingIfNeeded: rawValue >> 16) }
    /// The code with layer and parameter/handle/session number stripped, comparable with the constants.
    public var base: UInt32 {
        let code = rawValue & 0xFFFF
        if !isTPMError { return code }
        return code & 0x80 != 0 ? code & 0xBF : code
    }
    /// For format-one codes: 1-based number of the parameter, session or handle the error is about.
    public var subject: (kind: Subject, number: Int)? {
        let code = rawValue & 0xFFFF
        guard code & 0x80 != 0 else { return nil }
        let n = Int((code >> 8) & 0xF)
        if code & 0x40 != 0 { return (.parameter, n) }
        return n & 0x8 != 0 ? (.session, n & 0x7) : (.handle, n)
    }
    public enum Subject: Sendable { case handle, session, parameter }

    /// A TPM code: from the TPM itself, passed on by a resource manager (layer 12), or a resource
    /// manager's own refusal in the TPM's terms (`isResourceManagerRefusal`).
    public var isTPMError: Bool { layer == 0 || layer == 12 || isResourceManagerRefusal }
    /// A resource manager speaking for the TPM (layer 11 with a TPM code; its TSS codes are below 0x80):
    /// tpm2-abrmd answers OBJECT_MEMORY or SESSION_MEMORY itself when a client would hold more objects
    /// or sessions than it allows one (`--max-transients`, `--max-sessions`), whatever room the TPM has.
    public var isResourceManagerRefusal: Bool { layer == 11 && rawValue & 0xFFFF >= 0x80 }
    /// Transient conditions the TPM asks to retry (RETRY, YIELDED, TESTING, NV_RATE).
    public var isRetryable: Bool {
        isTPMError && [Self.retry, .yielded, .testing, .nvRate].map(\.rawValue).contains(base)
    }

    /// A readable name from the TSS decoder, e.g. "tpm:session(1):authorization failure without DA implications".
    public var description: String {
        "0x" + Hex.encode(rawValue, digits: 1, uppercase: true) + " " + String(cString: Tss2_RC_Decode(rawValue))
    }

    public static let success = Self(rawValue: 0)
    // Format one (Part 2, Table 16), compared against `base`.
    public static let value = Self(rawValue: 0x084)
    public static let handle = Self(rawValue: 0x08B)
    /// A ticket whose HMAC does not verify (PolicyTicket with other inputs than it was made for).
    public static let ticket = Self(rawValue: 0x0A0)
    public static let authFail = Self(rawValue: 0x08E)
    public static let policyFail = Self(rawValue: 0x09D)
    public static let integrity = Self(rawValue: 0x09F)
    public static let badAuth = Self(rawValue: 0x0A2)
    public static let size = Self(rawValue: 0x095)
    // Format zero.
    public static let initialize = Self(rawValue: 0x100)
    public static let failure = Self(rawValue: 0x101)
    public static let authUnavailable = Self(rawValue: 0x12F)
    public static let policy = Self(rawValue: 0x126)
    /// A command the TPM does not implement (TPM_RC_COMMAND_CODE): PolicyAuthorizeNV on a revision 1.16 part.
    public static let commandCode = Self(rawValue: 0x143)
    public static let nvLocked = Self(rawValue: 0x148)
    public static let nvAuthorization = Self(rawValue: 0x149)
    public static let nvUninitialized = Self(rawValue: 0x14A)
    public static let nvDefined = Self(rawValue: 0x14C)
    public static let nvSpace = Self(rawValue: 0x14B)
    public static let nvRange = Self(rawValue: 0x146)
    // Warnings.
    public static let objectMemory = Self(rawValue: 0x902)
    public static let sessionMemory = Self(rawValue: 0x903)
    public static let lockout = Self(rawValue: KC_RC_LOCKOUT)
    public static let retry = Self(rawValue: KC_RC_RETRY)
    public static let yielded = Self(rawValue: KC_RC_YIELDED)
    public static let testing = Self(rawValue: KC_RC_TESTING)
    public static let nvRate = Self(rawValue: KC_RC_NV_RATE)

    /// True when this is a TPM code whose base equals `other`.
    public func `is`(_ other: TPMReturnCode) -> Bool { isTPMError && base == other.rawValue }
}

/// A failed TPM (or TSS) call: which command, and the decoded response code.
public struct TPMError: Error, Sendable, CustomStringConvertible {
    public let command: String
    public let code: TPMReturnCode
    /// The TPM did not answer before the context's deadline (a stopped or hung TPM).
    public let timedOut: Bool
    public init(command: String, code: TPMReturnCode, timedOut: Bool = false) {
        self.command = command
        self.code = code
        self.timedOut = timedOut
    }
    public var description: String { "\(command) failed: " + (timedOut ? "the TPM did not answer" : "\(code)") }

    /// The TPM could not be reached at all (TCTI layer, or ESAPI failing to talk to it).
    public var isConnectionFailure: Bool {
        // TCTI failures, and ESAPI's "called in the wrong order" (7: its state after a failed exchange),
        // "no connection" (8), "try again" (9) and "I/O error" (10).
        timedOut || code.layer == 10 || (code.layer == 11 && !code.isResourceManagerRefusal)
            || (code.layer == 7 && [7, 8, 9, 10].contains(code.rawValue & 0xFFFF))
    }
}
