import Glibc
import Keychain
import KeychainEngine

/// The Secret Service per application (issue 41): each caller is who the bus says it is, never what it
/// says, and each application is served by a provider of its own over items of its own.
///
/// A sender's identity is taken once per unique name (the bus never gives a name twice): the bus
/// daemon's `GetConnectionCredentials` (uid, pid, and the pidfd where the bus has one), then
/// `CallerIdentity.ofProcess`, as keychaind reads its peers. The user's unconfined programs (the host)
/// keep the provider's records and collections as they were (`org.freedesktop.secrets`,
/// `org.freedesktop.secrets/NAME`); a Flatpak app's or a system unit's live under
/// `org.freedesktop.secrets@flatpak:ID` or `@unit:NAME.service`, with collections, aliases and an
/// attribute key of their own, made at its first call. Paths are the same words for each (`…/login`)
/// and resolve in the caller's own provider only, so a path of another's names nothing. Signals go to
/// the connections of their application only. A sender whose identity cannot be read is refused.
///
/// At most `maxApplications` applications' providers are kept. One is let go when its application's
/// last connection leaves and it holds nothing a provider opened again from the store would lack
/// (`holdsNothingInMemory`: a session collection's items keep it); a new application past the limit
/// is refused (`LimitsExceeded`) while every kept one holds something.
public final class ApplicationProviders: @unchecked Sendable {
    let configuration: KeychainConfiguration
    let bus: Bus
    public let maxApplications: Int
    public static let defaultMaxApplications = 64
    /// The user's unconfined programs' provider, made at start (`--import` feeds it).
    public let host: SecretServiceProvider
    private var confined: [ConfinedApplication: SecretServiceProvider] = [:]
    /// Each unique name's identity, from its first call until it leaves the bus.
    private var identities: [String: CallerIdentity] = [:]
    /// Runs work on the bus thread later.
    public var post: (@escaping @Sendable () -> Void) -> Void = { $0() } {
        didSet { for provider in [host] + confined.values { provider.post = post } }
    }

    /// The host's provider opened (and the first time made) in the keychain of `configuration`.
    public init(configuration: KeychainConfiguration, bus: Bus, maxApplications: Int = defaultMaxApplications) throws(DBusError) {
        self.configuration = configuration
        self.bus = bus
        self.maxApplications = maxApplications
        host = try SecretServiceProvider(configuration: configuration)
        host.emit = { [unowned self] in emit($0, for: nil) }
    }

    /// Answers one call in its sender's provider; a sender that cannot be told is `AccessDenied`.
    public func handle(_ call: DBusCall) -> Bus.DBusAnswer {
        do throws(DBusError) {
            return try provider(of: call.sender).handle(call)
        } catch {
            return .now(.failure(error))
        }
    }

    /// A client left the bus: its identity, sessions and prompts go with it.
    public func clientVanished(_ name: String) {
        guard let identity = identities.removeValue(forKey: name) else { return }
        provider(identity.application)?.clientVanished(name)
        if let application = identity.application { letGoIfUnused(application) }
    }

    /// Drops `application`'s provider when no connection of it is left and it holds nothing in memory.
    private func letGoIfUnused(_ application: ConfinedApplication) {
        guard let provider = confined[application], provider.holdsNothingInMemory,
              !identities.values.contains(where: { $0.application == application }) else { return }
        confined[application] = nil
    }

    private func provider(_ application: ConfinedApplication?) -> SecretServiceProvider? {
        guard let application else { return host }
        return confined[application]
    }

    /// The provider of `sender`'s application, made at its first call.
    func provider(of sender: String) throws(DBusError) -> SecretServiceProvider {
        let identity = try identity(of: sender)
        guard let application = identity.application else { return host }
        if let provider = confined[application] { return provider }
        if confined.count >= maxApplications {
            for kept in Array(confined.keys) { letGoIfUnused(kept) }  // one whose work ended after its last connection left
            guard confined.count < maxApplications else {
                throw .limitsExceeded("The Secret Service serves at most \(maxApplications) applications at once and each of them "
                                      + "has a connection or items of its session collection; \(application.words.prefix(300)) is "
                                      + "served once one of them ends (keychain-secret-service --max-applications)")
            }
        }
        let namespace = SecretServiceProvider.metaService + "@" + application.storeWords
        // Its collections' services (`NAMESPACE/NAME`, a name of up to 64 characters) must fit the keychain's bound.
        let room = KeychainOptions.maxServiceLength - 1 - SecretServiceProvider.maxCollectionNameLength - (namespace.utf16.count - application.storeWords.utf16.count)
        guard application.storeWords.utf16.count <= room else {
            throw .accessDenied("The Secret Service serves an application whose kind and id ('flatpak:ID', 'unit:NAME.service') "
                                + "take at most \(room) characters; \(application.words.prefix(300)) takes more and is not served")
        }
        let provider = try SecretServiceProvider(configuration: configuration, namespace: namespace)
        provider.emit = { [unowned self] in emit($0, for: application) }
        provider.post = post
        confined[application] = provider
        return provider
    }

    /// `sender`'s identity: cached, or read from the bus and `/proc` now.
    private func identity(of sender: String) throws(DBusError) -> CallerIdentity {
        if let known = identities[sender] { return known }
        guard sender.hasPrefix(":") else { throw .accessDenied("A call with no unique sender name is not served") }
        let credentials: Bus.ConnectionCredentials
        do throws(DBusError) {
            credentials = try bus.credentials(of: sender)
        } catch {
            throw .accessDenied("The Secret Service cannot tell who \(sender.prefix(64)) is (the bus: \(error.message)); "
                                + "it serves only a caller the bus still knows")
        }
        defer { if let pidfd = credentials.pidfd { close(pidfd) } }
        do throws(KeychainError) {
            let identity = try CallerIdentity.ofProcess(uid: credentials.uid, pid: credentials.pid, pidfd: credentials.pidfd)
            identities[sender] = identity
            return identity
        } catch {
            throw .accessDenied("The Secret Service cannot tell which application \(sender.prefix(64)) (pid \(credentials.pid)) is, "
                                + "and does not serve it as the host: \(error.message)")
        }
    }

    /// A signal of `application`'s provider, sent to that application's connections only.
    private func emit(_ signal: DBusSignal, for application: ConfinedApplication?) {
        for (name, identity) in identities where identity.application == application {
            var addressed = signal
            addressed.destination = name
            bus.emit(addressed)
        }
    }
}
