import KeychainCore
import FoundationEssentials
import KeychainStore
import SecureMemory
import TPM2
import KeychainBasics

// The SRK and the device-lock indices, made when absent and recorded in the store (TPMKeyring.init).
extension TPMKeyring {
    // MARK: Provisioning

    /// Makes the SRK and the device-lock indices when absent, and records them in the store.
    static func provision(context: TPMContext, store: Store, configuration: KeychainConfiguration, pcrSelection: [Int])
        throws(KeychainError) -> (TPMHandle, TPMHandle, TPMHandle, LockDescriptor, Bool) {
        do {
            try context.setAuth(TPMContext.owner, configuration.ownerAuthorization)
            let srk: TPMHandle
            if let existing = try? context.resource(forPersistent: srkHandle) {
                srk = existing
            } else {
                srk = try context.provisionSRK(at: srkHandle)
            }
            let srkName = try context.name(of: srk)
            if let pinned = try store.meta(StoreMeta.srkName), pinned != srkName {
                throw KeychainError(.hardwareUnavailable,
                                    "The TPM's storage root key at 0x81000001 is not the one this store was made with: "
                                    + "the TPM was cleared or replaced, and the items sealed to the old one cannot be opened")
            }
            context.ownerSaltKey = srk  // from here, owner commands in a session salted to it
            let descriptor = try provisionDeviceLock(context: context, srk: srk, configuration: configuration)
            let state = try context.resource(forPersistent: DeviceLockLayout.stateIndex)
            let epoch = try context.resource(forPersistent: DeviceLockLayout.epochIndex)
            let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
            // Beside our descriptor, the other indices must be ours too (attributes and policies), never
            // someone else's at our handles. The state index is unwritten after each TPM reset.
            let statePublic = DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName)
            for (handle, index, names) in [(state, DeviceLockLayout.stateIndex, [statePublic.name(written: true), statePublic.name(written: false)]),
                                           (epoch, DeviceLockLayout.epochIndex, [DeviceLockLayout.epochPublic.name(written: true)]),
                                           (pin, DeviceLockLayout.pinIndex, [DeviceLockLayout.pinPublic.name(written: true)])]
            where try !names.contains(context.name(of: handle)) {
                throw KeychainError(.hardwareUnavailable,
                                    "The TPM's NV index 0x\(Hex.encode(index, digits: 8)) is not the device-lock index this library "
                                    + "defines (other attributes or policy): someone else's index at our handle; the owner must "
                                    + "undefine it (tpm2_nvundefine) before this TPM can hold a keychain")
            }
            let manufacturer = try context.property(TPMContext.propertyManufacturer).bigEndianBytes
            let srkTR = try context.serialize(srk)
            let stateTR = try context.serialize(state)
            let epochTR = try context.serialize(epoch)
            let pinTR = try context.serialize(pin)
            let bootState = try BootState.read(context, pcrSelection)
            try store.write { tx in
                try tx.setMeta(StoreMeta.bootState, bootState.encoded())
                try tx.setMeta(StoreMeta.pcrSelection, pcrSelection.map(UInt8.init))
                try tx.setMeta(StoreMeta.srkTR, srkTR)
                try tx.setMeta(StoreMeta.srkName, srkName)
                try tx.setMeta(StoreMeta.stateTR, stateTR)
                try tx.setMeta(StoreMeta.epochTR, epochTR)
                try tx.setMeta(StoreMeta.pinTR, pinTR)
                try tx.setMeta(StoreMeta.lockDescriptor, descriptor.encoded())
                try tx.setMeta(StoreMeta.manufacturer, manufacturer)
            }
            return (srk, state, epoch, descriptor, manufacturer.starts(with: Array("IBM".utf8)))
        } catch let error as KeychainError {
            throw error
        } catch let error as TPMError {
            if error.code.is(.badAuth) || error.code.is(.authFail) || error.code.is(.lockout) {
                throw KeychainError(.authenticationFailed,
                                    "The TPM refused the owner authorization (\(error.command)): give the one set at device "
                                    + "provisioning (keychainctl init --owner-auth-file FILE)", underlying: .tpm(error))
            }
            if let full = Self.noRoom(error, doing: "provision the TPM") { throw full }
            throw KeychainError(.hardwareUnavailable,
                                "Cannot provision the TPM (\(error.command)): NV space may be full, or the owner hierarchy disabled",
                                underlying: .tpm(error))
        } catch let error as StoreError {
            throw KeychainError(store: error)
        } catch {
            throw KeychainError(.internal, "\(error)")
        }
    }

    /// Defines the four device-lock indices if the descriptor is absent (a crash half-way is redone).
    private static func provisionDeviceLock(context: TPMContext, srk: TPMHandle,
                                            configuration: KeychainConfiguration) throws(TPMError) -> LockDescriptor {
        // Only our descriptor (our attributes and write policy), once written, is read. One defined but
        // never written (a provisioning killed before its NV_Write), or someone else's, is remade.
        if let descriptorNV = try? context.resource(forPersistent: DeviceLockLayout.descriptorIndex),
           try context.name(of: descriptorNV) == DeviceLockLayout.descriptorPublic.name(written: true) {
            let bytes = try context.readNV(descriptorNV, size: DeviceLockLayout.descriptorSize)
            if let descriptor = LockDescriptor(decoding: bytes) { return descriptor }
        }
        // Start clean: without the descriptor the approval key of an old state index is lost for good.
        for index in [DeviceLockLayout.descriptorIndex, DeviceLockLayout.stateIndex,
                      DeviceLockLayout.pinIndex, DeviceLockLayout.epochIndex] {
            if let old = try? context.resource(forPersistent: index) { try context.undefineNV(old) }
        }
        let approval = try context.approveOnce(parent: srk, policyRef: DeviceLockLayout.lockPolicyRef) { keyName in
            [DeviceLockLayout.lockPolicy(state: DeviceLockLayout.statePublic(approvalKeyName: keyName))]
        }
        let pin = try context.defineNV(DeviceLockLayout.pinPublic, auth: nil)
        try context.writeNV(pin, data: UInt32(0).bigEndianBytes + configuration.passcodeRetryLimit.bigEndianBytes,
                            authHandle: TPMContext.owner, session: nil)
        _ = try context.defineNV(DeviceLockLayout.statePublic(approvalKeyName: approval.keyName), auth: nil)
        let epoch = try context.defineNV(DeviceLockLayout.epochPublic, auth: nil)
        // No passcode yet: the empty one satisfies the indices' PolicySecret.
        try withPasscode(nil, command: CommandCode.nvIncrement, context: context, srk: srk) { policy throws(TPMError) in
            try context.incrementNV(epoch, session: policy)
        }
        let descriptor = LockDescriptor(mark: .none, approval: approval)
        let descriptorNV = try context.defineNV(DeviceLockLayout.descriptorPublic, auth: nil)
        try withPasscode(nil, command: CommandCode.nvWrite, context: context, srk: srk) { policy throws(TPMError) in
            try context.writeNV(descriptorNV, data: descriptor.encoded(), authHandle: descriptorNV, session: policy)
        }
        return descriptor
    }

    /// Runs `body` with a policy session that proved the passcode (PolicySecret on the PIN index,
    /// in a salted HMAC session) for `command`: the write policy of the epoch and descriptor indices.
    static func withPasscode(_ passcode: SecureBytes?, command: UInt32, context: TPMContext, srk: TPMHandle,
                             _ body: (TPMHandle) throws(TPMError) -> Void) throws(TPMError) {
        let pin = try context.resource(forPersistent: DeviceLockLayout.pinIndex)
        try context.setAuth(pin, passcode)
        defer { try? context.setAuth(pin, nil) }
        try context.withSession(.hmac, saltKey: srk) { auth throws(TPMError) in
            try context.withSession(.policy, saltKey: nil) { policy throws(TPMError) in
                try context.run(DeviceLockLayout.passcodeSteps(command), on: policy, nvIndex: Self.noIndex,
                                other: { _ throws(TPMError) in try context.policySecret(policy, entity: pin, authSession: auth) })
                try body(policy)
            }
        }
    }

    /// The device-lock policies name no NV index in a step.
    static func noIndex(_ index: UInt32) throws(TPMError) -> TPMHandle {
        throw TPMError(command: "policy step on NV index 0x\(Hex.encode(index, digits: 1))", code: .handle)
    }

    var stateName: [UInt8] { DeviceLockLayout.statePublic(approvalKeyName: descriptor.approval.keyName).name(written: true) }
}
