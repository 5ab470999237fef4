import Keychain

/// Work waiting for its `Turns`, run when its keys are free. Bus thread only.
final class TurnTaking {
    private var turns = Turns()
    private var work: [Int: () -> Void] = [:]
    private var ready: [Int] = []
    private var draining = false

    func isFree(_ key: Turns.Key) -> Bool { turns.isFree(key) }

    /// No work runs, waits or is left to start.
    var isIdle: Bool { turns.isIdle && work.isEmpty && ready.isEmpty }

    /// `keys` held by work that started at once, until `release`.
    func hold(_ keys: Set<Turns.Key>) { turns.hold(keys) }

    /// Runs `body` when `keys` are free (at once when they are); `body` calls `done` when its work is over.
    func run(_ keys: Set<Turns.Key>, _ body: @escaping (_ done: @escaping () -> Void) -> Void) {
        let (ticket, started) = turns.enqueue(keys)
        work[ticket] = { [self] in body { [self] in release(keys) } }
        start(started)
    }

    func release(_ keys: Set<Turns.Key>) { start(turns.release(keys)) }

    /// Runs started work in order; work that ends at once starts more without growing the stack.
    private func start(_ tickets: [Int]) {
        ready += tickets
        guard !draining else { return }
        draining = true
        defer { draining = false }
        while !ready.isEmpty { work.removeValue(forKey: ready.removeFirst())?() }
    }
}

/// A value used on the bus thread only, carried through a task that never touches it.
struct BusThreadOnly<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension SecretServiceProvider {
    /// The answer to `call` in its client's order: at once when the client has no call waiting for
    /// the keychain, else after that call's reply (the client's later calls then see its writes).
    func ordered(_ call: DBusCall) -> Bus.DBusAnswer {
        let client = Turns.Key.client(call.sender)
        guard turns.isFree(client) else {
            return inTurn([client]) { [self] in answer(call) }
        }
        switch answer(call) {
        case .now(let result):
            return .now(result)
        case .later(let start):
            turns.hold([client])
            let release = BusThreadOnly { [turns] in turns.release([client]) }
            return .later { reply in start { result in
                reply(result)
                release.value()
            } }
        }
    }

    /// `answer` run once `keys` are free (bus thread), its reply sent when ready, then the keys freed.
    func inTurn(_ keys: Set<Turns.Key>, _ answer: @escaping () throws(DBusError) -> Bus.DBusAnswer) -> Bus.DBusAnswer {
        let answer = BusThreadOnly(answer)
        return .later { [turns] reply in
            turns.run(keys) { done in
                Self.send(Result { () throws(DBusError) in try answer.value() }, to: reply, then: done)
            }
        }
    }

    /// A write of `collection`'s items, in its turn: one at a time per collection.
    func writing(_ collection: Collection, _ answer: @escaping () throws(DBusError) -> Bus.DBusAnswer) -> Bus.DBusAnswer {
        inTurn([.collection(collection.name)], answer)
    }

    /// Keychain work off the bus thread; `next` takes its outcome back on the bus thread (where the
    /// provider's state lives) and makes the call's answer. Other calls are served meanwhile.
    func afterKeychain<T: Sendable>(_ work: @escaping @Sendable () async throws(KeychainError) -> T,
                                    _ next: @escaping (Result<T, DBusError>) throws(DBusError) -> Bus.DBusAnswer) -> Bus.DBusAnswer {
        let next = BusThreadOnly(next)
        return .later { [self] reply in
            Task.detached { [self] in
                let outcome: Result<T, DBusError>
                do throws(KeychainError) {
                    outcome = .success(try await work())
                } catch {
                    outcome = .failure(Self.dbusError(error))
                }
                post { Self.send(Result { () throws(DBusError) in try next.value(outcome) }, to: reply, then: {}) }
            }
        }
    }

    /// Sends `answer`'s reply through `reply` (bus thread): at once, or when its work is done; then `done`.
    /// - Important: the provider's deferred answers call their `reply` on the bus thread (from `post`).
    static func send(_ answer: Result<Bus.DBusAnswer, DBusError>, to reply: @escaping @Sendable (Result<Bus.DBusReply, DBusError>) -> Void,
                     then done: @escaping () -> Void) {
        switch answer {
        case .failure(let error):
            reply(.failure(error))
            done()
        case .success(.now(let result)):
            reply(result)
            done()
        case .success(.later(let start)):
            let done = BusThreadOnly(done)
            start { result in
                reply(result)
                done.value()
            }
        }
    }
}
