import FoundationEssentials
import KeychainWire
import SecureMemory

// The keychain API on keychaind's wire (docs/daemon.md; the numbers and words are KeychainWire's):
// errors as the library throws them (code, message, cause), so a caller sees the same
// `KeychainError` in-process and through the daemon.

extension SecureBytes {
    /// The bytes for a request field (the message is wiped once sent).
    package var wireBytes: [UInt8] { withUnsafeBytes { Array($0) } }
}

extension KeychainError {
    /// A request the daemon cannot read: the client and the daemon disagree on the protocol.
    package init(wire error: WireError) {
        self.init(.invalidArgument, "The keychain service could not read the request: \(error.detail)")
    }

    package var wireMessage: WireMessage {
        WireErrorReply(code: code.rawValue, message: message, cause: underlying.map(WireCause.init)).wireMessage
    }

    package init(decoding message: WireMessage) throws(WireError) {
        self.init(try WireErrorReply(decoding: message))
    }

    package init(_ reply: WireErrorReply) {
        self.init(Code(rawValue: reply.code), reply.message, underlying: reply.cause.map(Cause.init))
    }
}

extension AuthenticationRequest {
    /// keychaind's prompt as the client's authenticator is asked it.
    package init(wire question: WirePromptQuestion) throws(WireError) {
        self.init(prompt: Prompt(wire: question.texts), methods: try WireJSON.decode([AuthenticationMethod].self, question.methods) ?? [],
                  service: question.service, key: question.key, attempt: question.attempt, previousFailure: question.previousFailure)
    }

    /// The prompt keychaind sends the client.
    package var wire: WirePromptQuestion {
        WirePromptQuestion(texts: prompt.wire, methods: WireJSON.encode(methods), service: service, key: key, attempt: attempt,
                           previousFailure: previousFailure)
    }
}

extension WirePromptAnswer {
    /// The answer the client sends (the passcode's bytes go into the message, which the sender wipes).
    package init(_ answer: AuthenticationAnswer) {
        switch answer {
        case .finger(let name): self = .finger(name)
        case .passcode(let pin): self = .passcode(pin.withUnsafeBytes { Array($0) })
        case .cancel: self = .cancel
        case .fallback: self = .fallback
        case .interrupted: self = .interrupted
        case .unavailable(let why): self = .unavailable(why)
        }
    }
}

extension AuthenticationAnswer {
    /// The answer the client sent.
    package init(wire answer: WirePromptAnswer) {
        switch answer {
        case .finger(let name): self = .finger(name)
        case .passcode(let bytes): self = .passcode(SecureBytes(copying: bytes))
        case .cancel: self = .cancel
        case .fallback: self = .fallback
        case .interrupted: self = .interrupted
        case .unavailable(let why): self = .unavailable(why)
        }
    }
}

/// JSON for the structured results (keys, item info, statuses) and a prompt's methods; options and
/// prompt texts travel as fields (`KeychainOptions.wire`, `Prompt.wire`).
package enum WireJSON {
    package static func encode<T: Encodable>(_ value: T) -> [UInt8] {
        // Encoding these plain value types cannot fail.
        (try? Array(JSONEncoder().encode(value))) ?? []
    }
    package static func decode<T: Decodable>(_ type: T.Type, _ bytes: [UInt8]?) throws(WireError) -> T? {
        guard let bytes else { return nil }
        do { return try JSONDecoder().decode(type, from: Data(bytes)) } catch {
            throw WireError(.malformed, "a \(T.self) field does not decode: \(error)")
        }
    }
}

/// A word of the wire as the library's enum, or `malformed` naming it.
private func parsed<T: RawRepresentable>(_ raw: String?, _: T.Type) throws(WireError) -> T? where T.RawValue == String {
    guard let raw else { return nil }
    guard let value = T(rawValue: raw) else { throw WireError(.malformed, "unknown \(T.self) '\(raw)'") }
    return value
}

extension KeychainOptions {
    /// Every field as keychaind's requests carry it (`service` resolved by the caller).
    package var wire: WireStorageOptions {
        WireStorageOptions(service: service, accessible: accessible.rawValue, accessControl: accessControl.rawValue,
                           authValidity: authValidity, synchronizable: synchronizable, accessGroup: accessGroup, prompt: prompt?.wire,
                           keyStorage: android.keyStorage.rawValue)
    }

    /// The options a request carries, an absent field the default; not validated (`StorageRef` does).
    package init(wire fields: WireStorageOptions) throws(WireError) {
        let defaults = KeychainOptions()
        self.init(service: fields.service, accessible: try parsed(fields.accessible, Accessible.self) ?? defaults.accessible,
                  accessControl: try parsed(fields.accessControl, AccessControl.self) ?? defaults.accessControl,
                  authValidity: fields.authValidity ?? defaults.authValidity,
                  synchronizable: fields.synchronizable ?? defaults.synchronizable, accessGroup: fields.accessGroup,
                  prompt: fields.prompt.map(Prompt.init(wire:)),
                  android: AndroidOptions(keyStorage: try parsed(fields.keyStorage, KeyStorage.self) ?? defaults.android.keyStorage))
    }
}

extension Prompt {
    package var wire: WirePrompt { WirePrompt(title: title, subtitle: subtitle, description: description, cancel: cancel) }
    package init(wire fields: WirePrompt) {
        self.init(title: fields.title, subtitle: fields.subtitle, description: fields.description, cancel: fields.cancel)
    }
}

extension SetItemOptions {
    package var wire: WireSetOptions {
        WireSetOptions(accessible: accessible?.rawValue, accessControl: accessControl?.rawValue, authValidity: authValidity,
                       label: label, synchronizable: synchronizable)
    }

    /// nil when the request carried none of its fields.
    package init?(wire fields: WireSetOptions?) throws(WireError) {
        guard let fields else { return nil }
        self.init(accessible: try parsed(fields.accessible, Accessible.self),
                  accessControlOverride: try parsed(fields.accessControl, AccessControl.self),
                  authValidity: fields.authValidity, label: fields.label, synchronizable: fields.synchronizable)
    }
}
