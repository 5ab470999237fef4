internal import CP11Kit
import SecureMemory

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// One PKCS#11 module, loaded through p11-kit on its own and initialized for this instance.
///
/// Only the named module is loaded: never p11-kit's whole registry initialized, which would start
/// every registered module (tpm2-pkcs11 probes the local TPM). p11-kit "manages" the module, so
/// several instances, here or elsewhere in the process, share one `C_Initialize` safely.
public final class PKCS11Module: @unchecked Sendable {
    /// p11-kit's function list for the module; every call goes through `call`.
    private let functions: UnsafeMutablePointer<CK_FUNCTION_LIST>
    /// The library file, as given or as registered with p11-kit.
    public let path: String
    /// What the module says about itself (`C_GetInfo`).
    public let info: LibraryInfo
    /// The same, its text fields blank-padded as the module gave them (for URI matching).
    let rawInfo: CK_INFO

    /// The module named by `module-path`, else by `module-name`.
    public convenience init(uri: PKCS11URI) throws(PKCS11Error) {
        if let path = uri.modulePath {
            try self.init(path: path)
        } else if let name = uri.moduleName {
            try self.init(registeredName: name)
        } else {
            throw PKCS11Error(rv: CKR_ARGUMENTS_BAD, operation: "load the module of \(uri)", detail:
                "the URI names no module: add ?module-path=/path/to/module.so, or ?module-name=NAME for a module "
                + "registered with p11-kit (the name of its NAME.module file)")
        }
    }

    /// Loads the library at `path`; a relative path is looked up in p11-kit's module directory.
    ///
    /// p11-kit's proxy module is refused: it loads and initializes every registered module.
    public convenience init(path: String) throws(PKCS11Error) {
        if Self.isP11KitProxy(path) {
            throw PKCS11Error(rv: CKR_ARGUMENTS_BAD, operation: "load module \(path)", detail:
                "that is p11-kit's proxy module, which starts every module registered with p11-kit: name the one "
                + "module instead, with ?module-name=NAME (its NAME.module file) or ?module-path=/path/to/module.so")
        }
        guard let functions = p11_kit_module_load(path, 0) else {
            throw PKCS11Error(rv: CKR_LIBRARY_LOAD_FAILED, operation: "load module \(path)",
                              detail: Self.p11KitMessage())
        }
        try self.init(loaded: functions, path: path)
    }

    /// Loads the module registered with p11-kit under `name` (its `.module` file), and no other.
    ///
    /// p11-kit only hands out registered modules as a list, so every registered library is opened
    /// (none initialized) and all but the one named are released at once.
    public convenience init(registeredName name: String) throws(PKCS11Error) {
        let operation = "load the module registered as '\(name)'"
        guard let list = p11_kit_modules_load(nil, 0) else {
            throw PKCS11Error(rv: CKR_LIBRARY_LOAD_FAILED, operation: operation, detail: Self.p11KitMessage())
        }
        var chosen: UnsafeMutablePointer<CK_FUNCTION_LIST>?
        var others: [String] = []
        var index = 0
        while let module = list[index] {
            index += 1
            let registered = p11_kit_module_get_name(module).map { pointer in
                defer { free(pointer) }
                return String(cString: pointer)
            }
            if chosen == nil, registered == name {
                chosen = module
            } else {
                others.append(registered ?? "(unnamed)")
                p11_kit_module_release(module)
            }
        }
        free(list)
        guard let chosen else {
            // p11-kit reads no user configuration (~/.config/pkcs11) for root.
            let rootNote = getuid() == 0 ? " (as root, p11-kit reads /etc/pkcs11/modules and /usr/share/p11-kit/modules, not ~/.config/pkcs11)" : ""
            throw PKCS11Error(rv: CKR_LIBRARY_LOAD_FAILED, operation: operation, detail: (others.isEmpty
                ? "p11-kit has no registered modules"
                : "p11-kit has no such module; registered: \(others.sorted().joined(separator: ", "))") + rootNote)
        }
        let filename = p11_kit_module_get_filename(chosen).map { pointer in
            defer { free(pointer) }
            return String(cString: pointer)
        }
        try self.init(loaded: chosen, path: filename ?? name)
    }

    private init(loaded functions: UnsafeMutablePointer<CK_FUNCTION_LIST>, path: String) throws(PKCS11Error) {
        let rv = p11_kit_module_initialize(functions)
        guard rv == CKR_OK else {
            let message = Self.p11KitMessage()
            p11_kit_module_release(functions)
            throw PKCS11Error(rv: rv, operation: "C_Initialize (\(path))", detail: message)
        }
        var raw = CK_INFO()
        let infoRV = functions.pointee.C_GetInfo(&raw)
        guard infoRV == CKR_OK else {
            p11_kit_module_finalize(functions)
            p11_kit_module_release(functions)
            throw PKCS11Error(rv: infoRV, operation: "C_GetInfo (\(path))")
        }
        self.functions = functions
        self.path = path
        self.info = LibraryInfo(raw)
        self.rawInfo = raw
    }

    deinit {
        // p11-kit closes the sessions this instance left open, and calls the module's C_Finalize
        // once no instance in the process uses it.
        p11_kit_module_finalize(functions)
        p11_kit_module_release(functions)
    }

    /// The one call point: runs one PKCS#11 function and turns a `CK_RV` other than `CKR_OK` into a `PKCS11Error`.
    func call(_ operation: String, _ body: (CK_FUNCTION_LIST) -> CK_RV) throws(PKCS11Error) {
        let rv = body(functions.pointee)
        guard rv == CKR_OK else { throw PKCS11Error(rv: rv, operation: operation) }
    }

    /// `p11-kit-proxy.so` by name, or any path to the libp11-kit this process uses (the proxy is that library).
    static func isP11KitProxy(_ path: String) -> Bool {
        if path.split(separator: "/").last?.hasPrefix("p11-kit-proxy") == true { return true }
        // The library we linked is mapped into this process under its real path.
        guard let theirs = realpath(path, nil) else { return false }
        defer { free(theirs) }
        let target = String(cString: theirs)
        guard target.contains("libp11-kit.so"), let maps = fopen("/proc/self/maps", "r") else { return false }
        defer { fclose(maps) }
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        while getline(&line, &capacity, maps) > 0, let line {
            let text = String(cString: line)
            if let slash = text.firstIndex(of: "/"), text[slash...].dropLast() == target { return true }
        }
        return false
    }

    private static func p11KitMessage() -> String? {
        p11_kit_message().map { String(cString: $0) }
    }
}

/// What a module says about itself: `CK_INFO`.
public struct LibraryInfo: Sendable, Equatable {
    public let manufacturer: String
    public let libraryDescription: String
    public let version: PKCS11URI.Version
    /// The PKCS#11 version the module implements.
    public let cryptokiVersion: PKCS11URI.Version

    init(_ info: CK_INFO) {
        manufacturer = paddedText(info.manufacturerID)
        libraryDescription = paddedText(info.libraryDescription)
        version = .init(major: info.libraryVersion.major, minor: info.libraryVersion.minor)
        cryptokiVersion = .init(major: info.cryptokiVersion.major, minor: info.cryptokiVersion.minor)
    }
}

/// A fixed-size, blank-padded PKCS#11 text field (imported as a tuple) as a String.
func paddedText<T>(_ field: T) -> String {
    withUnsafeBytes(of: field) { bytes in
        var end = bytes.count
        while end > 0, bytes[end - 1] == 0x20 || bytes[end - 1] == 0 { end -= 1 }
        return String(decoding: bytes[..<end], as: UTF8.self)
    }
}

// MARK: The PKCS#11 functions this module uses

extension PKCS11Module {
    /// Slots that hold a token.
    func slotsWithToken() throws(PKCS11Error) -> [CK_SLOT_ID] {
        while true {
            var count: CK_ULONG = 0
            try call("C_GetSlotList") { $0.C_GetSlotList(CK_BBOOL(CK_TRUE), nil, &count) }
            var slots = [CK_SLOT_ID](repeating: 0, count: Int(count))
            do {
                try call("C_GetSlotList") { f in
                    slots.withUnsafeMutableBufferPointer { f.C_GetSlotList(CK_BBOOL(CK_TRUE), $0.baseAddress, &count) }
                }
                return Array(slots.prefix(Int(count)))
            } catch where error.returnValue == .bufferTooSmall {
                continue  // A token arrived between the two calls.
            }
        }
    }

    func slotInfo(_ slot: CK_SLOT_ID) throws(PKCS11Error) -> CK_SLOT_INFO {
        var info = CK_SLOT_INFO()
        try call("C_GetSlotInfo") { $0.C_GetSlotInfo(slot, &info) }
        return info
    }

    func tokenInfo(_ slot: CK_SLOT_ID) throws(PKCS11Error) -> CK_TOKEN_INFO {
        var info = CK_TOKEN_INFO()
        try call("C_GetTokenInfo") { $0.C_GetTokenInfo(slot, &info) }
        return info
    }

    func openSession(_ slot: CK_SLOT_ID) throws(PKCS11Error) -> CK_SESSION_HANDLE {
        var session: CK_SESSION_HANDLE = 0
        try call("C_OpenSession") { $0.C_OpenSession(slot, CK_FLAGS(CKF_SERIAL_SESSION | CKF_RW_SESSION), nil, nil, &session) }
        return session
    }

    func closeSession(_ session: CK_SESSION_HANDLE) throws(PKCS11Error) {
        try call("C_CloseSession") { $0.C_CloseSession(session) }
    }

    func sessionState(_ session: CK_SESSION_HANDLE) throws(PKCS11Error) -> CK_STATE {
        var info = CK_SESSION_INFO()
        try call("C_GetSessionInfo") { $0.C_GetSessionInfo(session, &info) }
        return info.state
    }

    func login(_ session: CK_SESSION_HANDLE, pin: SecureBytes) throws(PKCS11Error) {
        try call("C_Login") { f in
            pin.withUnsafeBytes { bytes in
                let address = bytes.baseAddress?.assumingMemoryBound(to: UInt8.self)
                return f.C_Login(session, CK_USER_TYPE(CKU_USER), UnsafeMutablePointer(mutating: address), CK_ULONG(bytes.count))
            }
        }
    }

    func logout(_ session: CK_SESSION_HANDLE) throws(PKCS11Error) {
        try call("C_Logout") { $0.C_Logout(session) }
    }

    func findObjects(_ session: CK_SESSION_HANDLE, matching template: AttributeTemplate) throws(PKCS11Error) -> [CK_OBJECT_HANDLE] {
        try call("C_FindObjectsInit") { f in template.withAttributes { f.C_FindObjectsInit(session, $0, $1) } }
        var found: [CK_OBJECT_HANDLE] = []
        var batch = [CK_OBJECT_HANDLE](repeating: 0, count: 16)
        do {
            while true {
                var count: CK_ULONG = 0
                try call("C_FindObjects") { f in
                    batch.withUnsafeMutableBufferPointer { f.C_FindObjects(session, $0.baseAddress, CK_ULONG($0.count), &count) }
                }
                if count == 0 { break }
                found += batch.prefix(Int(count))
            }
        } catch {
            _ = try? call("C_FindObjectsFinal") { $0.C_FindObjectsFinal(session) }
            throw error
        }
        try call("C_FindObjectsFinal") { $0.C_FindObjectsFinal(session) }
        return found
    }

    func generateKey(_ session: CK_SESSION_HANDLE, mechanism: CK_MECHANISM_TYPE, template: AttributeTemplate) throws(PKCS11Error) -> CK_OBJECT_HANDLE {
        var mechanism = CK_MECHANISM(mechanism: mechanism, pParameter: nil, ulParameterLen: 0)
        var key: CK_OBJECT_HANDLE = 0
        try call("C_GenerateKey") { f in template.withAttributes { f.C_GenerateKey(session, &mechanism, $0, $1, &key) } }
        return key
    }

    /// The mechanisms the token in `slot` offers (`C_GetMechanismList`).
    func mechanisms(_ slot: CK_SLOT_ID) throws(PKCS11Error) -> [CK_MECHANISM_TYPE] {
        while true {
            var count: CK_ULONG = 0
            try call("C_GetMechanismList") { $0.C_GetMechanismList(slot, nil, &count) }
            var list = [CK_MECHANISM_TYPE](repeating: 0, count: Int(count))
            do {
                try call("C_GetMechanismList") { f in
                    list.withUnsafeMutableBufferPointer { f.C_GetMechanismList(slot, $0.baseAddress, &count) }
                }
                return Array(list.prefix(Int(count)))
            } catch where error.returnValue == .bufferTooSmall {
                continue
            }
        }
    }

    func mechanismInfo(_ slot: CK_SLOT_ID, _ type: CK_MECHANISM_TYPE) throws(PKCS11Error) -> CK_MECHANISM_INFO {
        var info = CK_MECHANISM_INFO()
        try call("C_GetMechanismInfo") { $0.C_GetMechanismInfo(slot, type, &info) }
        return info
    }

    /// A key pair on the token; returns (public, private).
    func generateKeyPair(_ session: CK_SESSION_HANDLE, mechanism: CK_MECHANISM_TYPE, publicTemplate: AttributeTemplate,
                         privateTemplate: AttributeTemplate) throws(PKCS11Error) -> (CK_OBJECT_HANDLE, CK_OBJECT_HANDLE) {
        var mechanism = CK_MECHANISM(mechanism: mechanism, pParameter: nil, ulParameterLen: 0)
        var publicKey: CK_OBJECT_HANDLE = 0
        var privateKey: CK_OBJECT_HANDLE = 0
        try call("C_GenerateKeyPair") { f in
            publicTemplate.withAttributes { publicAttributes, publicCount in
                privateTemplate.withAttributes { privateAttributes, privateCount in
                    f.C_GenerateKeyPair(session, &mechanism, publicAttributes, publicCount, privateAttributes, privateCount,
                                        &publicKey, &privateKey)
                }
            }
        }
        return (publicKey, privateKey)
    }

    /// A key derived on the token from `base`; `mechanism` must stay valid for the call.
    func deriveKey(_ session: CK_SESSION_HANDLE, _ mechanism: UnsafeMutablePointer<CK_MECHANISM>, base: CK_OBJECT_HANDLE,
                   template: AttributeTemplate) throws(PKCS11Error) -> CK_OBJECT_HANDLE {
        var key: CK_OBJECT_HANDLE = 0
        try call("C_DeriveKey") { f in template.withAttributes { f.C_DeriveKey(session, mechanism, base, $0, $1, &key) } }
        return key
    }

    /// An object's `CKA_VALUE`, read into locked memory (a derived secret the host needs).
    func secretValue(_ session: CK_SESSION_HANDLE, _ object: CK_OBJECT_HANDLE) throws(PKCS11Error) -> SecureBytes {
        var attribute = CK_ATTRIBUTE(type: CK_ATTRIBUTE_TYPE(CKA_VALUE), pValue: nil, ulValueLen: 0)
        try call("C_GetAttributeValue") { $0.C_GetAttributeValue(session, object, &attribute, 1) }
        let value = SecureBytes(count: Int(attribute.ulValueLen))
        try call("C_GetAttributeValue") { f in
            value.withUnsafeMutableBytes { bytes in
                attribute.pValue = bytes.baseAddress
                return f.C_GetAttributeValue(session, object, &attribute, 1)
            }
        }
        return value
    }

    func destroyObject(_ session: CK_SESSION_HANDLE, _ object: CK_OBJECT_HANDLE) throws(PKCS11Error) {
        try call("C_DestroyObject") { $0.C_DestroyObject(session, object) }
    }

    /// The values of `types`, each as the module stores it. Any attribute that is sensitive or
    /// missing fails the whole call, as C_GetAttributeValue does.
    func attributeValues(_ session: CK_SESSION_HANDLE, _ object: CK_OBJECT_HANDLE, _ types: [CK_ATTRIBUTE_TYPE]) throws(PKCS11Error) -> [[UInt8]] {
        var attributes = types.map { CK_ATTRIBUTE(type: $0, pValue: nil, ulValueLen: 0) }
        // First the lengths, then the values.
        try call("C_GetAttributeValue") { f in
            attributes.withUnsafeMutableBufferPointer { f.C_GetAttributeValue(session, object, $0.baseAddress, CK_ULONG($0.count)) }
        }
        let buffers = attributes.map { UnsafeMutableRawPointer.allocate(byteCount: max(Int($0.ulValueLen), 1), alignment: 8) }
        defer { for buffer in buffers { buffer.deallocate() } }
        for index in attributes.indices { attributes[index].pValue = buffers[index] }
        try call("C_GetAttributeValue") { f in
            attributes.withUnsafeMutableBufferPointer { f.C_GetAttributeValue(session, object, $0.baseAddress, CK_ULONG($0.count)) }
        }
        return attributes.map { Array(UnsafeRawBufferPointer(start: $0.pValue, count: Int($0.ulValueLen))) }
    }

    /// One single-part encryption; `mechanism` must stay valid for the call.
    func encrypt(_ session: CK_SESSION_HANDLE, _ mechanism: UnsafeMutablePointer<CK_MECHANISM>, key: CK_OBJECT_HANDLE,
                 _ plaintext: SecureBytes, overhead: Int) throws(PKCS11Error) -> [UInt8] {
        try call("C_EncryptInit") { $0.C_EncryptInit(session, mechanism, key) }
        let (output, length) = try singlePart("C_Encrypt", count: plaintext.count + overhead) {
            [UInt8](repeating: 0, count: $0)
        } run: { f, output, length in
            plaintext.withUnsafeBytes { input in
                output.withUnsafeMutableBufferPointer { out in
                    f.C_Encrypt(session, UnsafeMutablePointer(mutating: input.baseAddress?.assumingMemoryBound(to: UInt8.self)),
                                CK_ULONG(input.count), out.baseAddress, &length)
                }
            }
        }
        return Array(output.prefix(length))
    }

    /// One single-part decryption, straight into locked memory.
    ///
    /// The buffer starts as long as the ciphertext: SoftHSM2 asks that much for AES-GCM, tag included.
    func decrypt(_ session: CK_SESSION_HANDLE, _ mechanism: UnsafeMutablePointer<CK_MECHANISM>, key: CK_OBJECT_HANDLE,
                 _ ciphertext: ArraySlice<UInt8>) throws(PKCS11Error) -> SecureBytes {
        try call("C_DecryptInit") { $0.C_DecryptInit(session, mechanism, key) }
        let (output, length) = try singlePart("C_Decrypt", count: ciphertext.count) {
            SecureBytes(count: $0)
        } run: { f, output, length in
            ciphertext.withUnsafeBufferPointer { input in
                output.withUnsafeMutableBytes { out in
                    f.C_Decrypt(session, UnsafeMutablePointer(mutating: input.baseAddress), CK_ULONG(input.count),
                                out.baseAddress?.assumingMemoryBound(to: UInt8.self), &length)
                }
            }
        }
        if length == output.count { return output }
        return output.withUnsafeBytes { SecureBytes(copying: UnsafeRawBufferPointer(rebasing: $0[..<length])) }
    }

    /// A single-part C_Encrypt or C_Decrypt (`run`: the output buffer, and its length in and the
    /// length written out) into a buffer of `count` bytes from `make`; when the token asks for a larger
    /// one, it is made at that size and the call repeated (the operation stays active, PKCS#11 5.2).
    /// Returns the buffer and the length written.
    private func singlePart<Buffer>(
        _ operation: String, count: Int, make: (Int) -> Buffer,
        run: (CK_FUNCTION_LIST, inout Buffer, inout CK_ULONG) -> CK_RV
    ) throws(PKCS11Error) -> (Buffer, Int) {
        var output = make(count)
        var size = count
        while true {
            var length = CK_ULONG(size)
            do {
                try call(operation) { f in run(f, &output, &length) }
                return (output, Int(length))
            } catch where error.returnValue == .bufferTooSmall && Int(length) > size {
                size = Int(length)
                output = make(size)
            }
        }
    }
}

/// A `CK_ATTRIBUTE` template and the bytes it points to, which live as long as the template.
final class AttributeTemplate {
    private var attributes: [CK_ATTRIBUTE] = []

    init() {}

    deinit {
        for attribute in attributes { attribute.pValue?.deallocate() }
    }

    func add(_ type: CK_ATTRIBUTE_TYPE, bytes: [UInt8]) {
        let storage = UnsafeMutableRawPointer.allocate(byteCount: max(bytes.count, 1), alignment: 8)
        bytes.withUnsafeBytes { storage.copyMemory(from: $0.baseAddress ?? UnsafeRawPointer(storage), byteCount: $0.count) }
        attributes.append(CK_ATTRIBUTE(type: type, pValue: storage, ulValueLen: CK_ULONG(bytes.count)))
    }

    func add(_ type: CK_ATTRIBUTE_TYPE, _ value: Bool) {
        add(type, bytes: [value ? UInt8(CK_TRUE) : UInt8(CK_FALSE)])
    }

    func add(_ type: CK_ATTRIBUTE_TYPE, _ value: CK_ULONG) {
        add(type, bytes: withUnsafeBytes(of: value) { Array($0) })
    }

    func add(_ type: CK_ATTRIBUTE_TYPE, _ text: String) {
        add(type, bytes: Array(text.utf8))
    }

    func withAttributes<R>(_ body: (UnsafeMutablePointer<CK_ATTRIBUTE>?, CK_ULONG) -> R) -> R {
        attributes.withUnsafeMutableBufferPointer { body($0.baseAddress, CK_ULONG($0.count)) }
    }
}
