import Keychain
import KeychainCLIText

extension SecretServiceProvider {
    /// A prompt's state: who asked, for which collections, and its read once it shows.
    struct Prompt: Sendable {
        var owner: String
        var collections: [String]
        /// The read asking the person, once `Prompt` was called; `Dismiss` and the owner's leaving cancel it.
        var asking: Task<Void, Never>?
    }

    /// What a prompt's read found for one collection: nothing to read (no item yet), the item's
    /// stored value, or a refusal (a wrong or canceled answer, a window that passed).
    enum PromptRead: Sendable { case empty, opened(String, SecureBytes), refused }
}

/// `org.freedesktop.Secret.Prompt`'s methods.
enum PromptMethod {
    case prompt(windowID: String)
    case dismiss

    init(_ call: DBusCall) throws(DBusError) {
        var a = Arguments(call)
        switch call.member {
        case "Prompt": self = .prompt(windowID: try a.string("window-id"))
        case "Dismiss": self = .dismiss
        default: throw .unknownMethod("No method \(call.member) on a prompt")
        }
    }
}

/// A prompt (`/org/freedesktop/secrets/prompt/N`): asks a person to unlock collections.
struct PromptObject {
    let provider: SecretServiceProvider
    let path: String

    func call(_ method: PromptMethod) throws(DBusError) -> Bus.DBusAnswer {
        guard let prompt = provider.prompts[path] else { throw .noSuchObject("No prompt at \(path)") }
        switch method {
        case .dismiss:
            // A prompt showing is canceled: the prompter closes its dialog, and what its read finds is not used.
            provider.prompts[path] = nil
            prompt.asking?.cancel()
            provider.emit(.init(path: path, interface: SecretServiceProvider.promptInterface, member: "Completed",
                                arguments: [.bool(true), .variant(.paths([]))]))
            return .reply([])
        case .prompt:
            guard prompt.asking == nil else { throw .failed("The prompt at \(path) is already showing: wait for Completed, or Dismiss it") }
            // Completed follows Prompt's reply, as the spec orders them: it is emitted from the bus
            // thread after this call returns.
            provider.prompts[path]?.asking = provider.ask(prompt, path)
            return .reply([])
        }
    }
}

extension SecretServiceProvider {
    /// Asks through the keychain's authenticator (the system's prompters: the desktop's dialog, the
    /// password agents), off the bus thread (other callers are served while the person answers): one
    /// read of an item of each locked collection opens its window. Canceling the task cancels the prompt.
    func ask(_ prompt: Prompt, _ path: String) -> Task<Void, Never> {
        let reads = prompt.collections.compactMap { name -> (String, Keychain?, String?, Int)? in
            guard let collection = collections[name] else { return nil }
            return (name, collection.storage, collection.items.keys.sorted().first, collection.locks)
        }
        return Task.detached { [self] in
            var found: [(String, PromptRead, Int)] = []
            for (name, storage, id, locks) in reads {
                guard let storage, let id else {
                    found.append((name, .empty, locks))
                    continue
                }
                var stored: SecureBytes?
                if !Task.isCancelled {
                    do throws(KeychainError) {
                        stored = try await storage.getSecureBytes(id)
                    } catch {
                        // Why the collection stays locked (a cancel, no prompter reached, a wrong answer), never a secret.
                        // A client named the collection: escaped, as every field a caller chose.
                        writeAll(2, "keychain-secret-service: \(path) left \(logField(name)) locked: \(error.code): \(escaped(error.message))\n")
                    }
                }
                found.append((name, stored.map { .opened(id, $0) } ?? .refused, locks))
            }
            post { [self, found] in answered(path, found) }
        }
    }

    /// A prompt's reads are done (bus thread): the collections they opened are unlocked, unless a
    /// `Lock` came in the meantime, and `Completed` says which. A prompt dismissed (or whose client
    /// left) while its read was asking opens nothing: a window its read opened anyway (the person
    /// answered as the dismissal came) is ended.
    func answered(_ path: String, _ found: [(String, PromptRead, Int)]) {
        guard prompts.removeValue(forKey: path) != nil else {
            for (name, read, _) in found {
                guard case .opened = read, let collection = collections[name], collection.record.authValidity > 0,
                      let storage = collection.storage else { continue }
                Task.detached { try? await storage.endAuthenticationWindow() }
            }
            return
        }
        var opened: [String] = []
        for (name, read, locks) in found {
            guard let collection = collections[name], collection.locks == locks else { continue }
            switch read {
            case .empty:
                // No item to read: nothing to protect yet, and the next write needs no secret.
                collection.locked = false
            case .opened(let id, let stored):
                collection.locked = false
                if let item = SealedItem(decoding: stored) { collection.items[id]?.remember(item) }
            case .refused:
                collection.locked = true
                continue
            }
            opened.append(collection.path)
            changed(collection, properties: ["Locked"])
        }
        let dismissed = opened.isEmpty
        emit(.init(path: path, interface: Self.promptInterface, member: "Completed", arguments: [.bool(dismissed), .variant(.paths(opened))]))
    }
}
