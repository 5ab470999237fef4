import Keychain

extension SecretServiceProvider {
    /// A session's state: who opened it and its key.
    struct Session {
        var owner: String
        /// nil: `plain`; else the AES-128 key of the DH session.
        var key: SecureBytes?
    }

    /// The session of `path`, if `sender` opened it.
    func session(_ path: String, sender: String) throws(DBusError) -> Session {
        guard let session = sessions[path] else { throw .noSession("No session at \(path): open one with OpenSession") }
        guard session.owner == sender else { throw .noSession("Session \(path) belongs to another connection") }
        return session
    }

    /// A client's secret in the clear (in locked memory) and its content type.
    func decodeSecret(_ secret: ClientSecret, sender: String) throws(DBusError) -> (SecureBytes, String) {
        guard secret.contentType.utf8.count <= Self.maxFieldBytes else {
            throw .invalidArgs("A content type is at most \(Self.maxFieldBytes) bytes")
        }
        let session = try session(secret.session, sender: sender)
        guard let key = session.key else { return (secret.value, secret.contentType) }
        return (try SessionCrypto.decrypt(secret.value, iv: secret.parameters, key: key), secret.contentType)
    }

    /// A secret as the client reads it (`(oayays)`), encrypted with the session's key when it has one.
    func secretValue(_ secret: SecureBytes, _ contentType: String, _ session: Session, _ path: String) throws(DBusError) -> DBusValue {
        guard let key = session.key else {
            return .structure([.objectPath(path), .bytes(SecureBytes(count: 0)), .bytes(secret), .string(contentType)])
        }
        let (iv, ciphertext) = try SessionCrypto.encrypt(secret, key: key)
        return .structure([.objectPath(path), .bytes(SecureBytes(copying: iv)), .bytes(SecureBytes(copying: ciphertext)), .string(contentType)])
    }

    /// `OpenSession`: a new session of `owner` for `algorithm`, and the output the client reads.
    func openSession(algorithm: String, input: DBusValue, owner: String) throws(DBusError) -> Bus.DBusAnswer {
        guard sessions.values.filter({ $0.owner == owner }).count < Self.maxSessionsPerClient else {
            throw .accessDenied("This connection has \(Self.maxSessionsPerClient) open sessions: close some first")
        }
        let output: DBusValue
        let session: Session
        switch algorithm {
        case "plain":
            output = .string("")
            session = Session(owner: owner, key: nil)
        case "dh-ietf1024-sha256-aes128-cbc-pkcs7":
            guard case .bytes(let clientPublic) = input else {
                throw .invalidArgs("dh-ietf1024-sha256-aes128-cbc-pkcs7 takes the client's public key as a variant of ay")
            }
            let (ours, key) = try SessionCrypto.agree(clientPublic: clientPublic)
            output = .bytes(SecureBytes(copying: ours))
            session = Session(owner: owner, key: key)
        case let other:
            throw .notSupported("Session algorithm '\(other.prefix(64))' is not supported: use plain or dh-ietf1024-sha256-aes128-cbc-pkcs7")
        }
        let path = Self.sessionPrefix + nextID()
        sessions[path] = session
        return .reply([.variant(output), .objectPath(path)])
    }
}

/// `org.freedesktop.Secret.Session`'s methods.
enum SessionMethod {
    case close

    init(_ call: DBusCall) throws(DBusError) {
        guard call.member == "Close" else { throw .unknownMethod("No method \(call.member) on a session") }
        self = .close
    }
}

/// A session (`/org/freedesktop/secrets/session/N`).
struct SessionObject {
    let provider: SecretServiceProvider
    let path: String

    func call(_ method: SessionMethod) throws(DBusError) -> Bus.DBusAnswer {
        switch method {
        case .close:
            provider.sessions[path] = nil  // The key is wiped as the SecureBytes goes.
            return .reply([])
        }
    }
}
