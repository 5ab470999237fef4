import Foundation
@testable import Keychain
@testable import KeychainEngine
import Testing
import TPM2

/// A wrapping key's policy as the store keeps it (JSON): read back whole, or without the key's
/// creation (the read path's decode, which leaves the one field only key attestation needs).
@Suite("The stored seal policy")
struct SealPolicyCodingTests {
    /// Every field set, so a field that `init(from:)` forgot to read fails the round trip.
    static let everyField = SealPolicy(
        availability: .whenUnlocked, pcrs: [7, 14], pcrDigest: Array(repeating: 1, count: 32),
        bootApprovalName: [0, 11] + Array(repeating: 2, count: 32), bootVendorKeyName: [0, 11] + Array(repeating: 3, count: 32),
        passcodeEpoch: 9, stateName: [0, 11] + Array(repeating: 4, count: 32),
        biometry: .init(keyName: [5, 6], tpmHandle: 0x8101_0042, enrollmentSet: [7], currentSet: true),
        passcode: true, keyRef: Array(repeating: 8, count: 32), authValidity: 600,
        creation: .init(data: Array(0..<120), hash: Array(repeating: 9, count: 32), ticket: Array(repeating: 10, count: 40)))

    @Test func theFixtureSetsEveryField() {
        let unset = Mirror(reflecting: Self.everyField).children.filter { child in
            let value = Mirror(reflecting: child.value)
            return value.displayStyle == .optional && value.children.isEmpty
        }.map { $0.label ?? "?" }
        #expect(unset == [], "fields the fixture leaves nil: add them, so the round trip covers them")
    }

    @Test func aPolicyReadsBackWholeWithItsCreation() throws {
        let decoded = try #require(SealPolicy.decode(Self.everyField.encoded(), withCreation: true))
        #expect(decoded == Self.everyField)
    }

    @Test func theReadPathLeavesOnlyTheCreationOut() throws {
        let decoded = try #require(SealPolicy.decode(Self.everyField.encoded()))
        var expected = Self.everyField
        expected.creation = nil
        #expect(decoded == expected)
        #expect(decoded.digest == Self.everyField.digest)
    }

    @Test func aMalformedPolicyIsNoPolicyEitherWay() {
        var bytes = Self.everyField.encoded()
        bytes.removeLast(3)
        #expect(SealPolicy.decode(bytes) == nil)
        #expect(SealPolicy.decode(bytes, withCreation: true) == nil)
        #expect(SealPolicy.decode(Array(#"{"availability":"always"}"#.utf8)) == nil, "a policy without its state name")
    }
}
