/// Who waits for whom while calls wait for the keychain off the bus thread: a client's calls are
/// answered in the order it sent them (its later call sees its earlier write), the writes of one
/// collection run one at a time (a read-modify-write never loses another's), and the registry's
/// changes one at a time; every other call is served at once. A value: its events return the
/// tickets that may start, and it is tested without a bus.
struct Turns {
    enum Key: Hashable {
        /// A client's connection (its unique bus name).
        case client(String)
        /// The writes of a collection (by name).
        case collection(String)
        /// Changes of the registry (collections, aliases, labels).
        case registry
    }

    /// Keys held by work that runs now.
    private var held: Set<Key> = []
    /// Work waiting for its keys, in arrival order.
    private var waiting: [(ticket: Int, keys: Set<Key>)] = []
    private var lastTicket = 0

    /// Whether work needing `key` may run now: nothing holds it and nothing waits for it.
    func isFree(_ key: Key) -> Bool {
        !held.contains(key) && !waiting.contains { $0.keys.contains(key) }
    }

    /// Nothing runs and nothing waits.
    var isIdle: Bool { held.isEmpty && waiting.isEmpty }

    /// Work that started at once holds `keys` until `release`.
    mutating func hold(_ keys: Set<Key>) { held.formUnion(keys) }

    /// Work that needs `keys`: its ticket, and the tickets that start now (their keys held), it
    /// among them when its keys are free.
    mutating func enqueue(_ keys: Set<Key>) -> (ticket: Int, started: [Int]) {
        lastTicket += 1
        waiting.append((lastTicket, keys))
        return (lastTicket, startable())
    }

    /// Work that held `keys` is over: the tickets that start now (their keys held).
    mutating func release(_ keys: Set<Key>) -> [Int] {
        held.subtract(keys)
        return startable()
    }

    /// The waiting work whose keys are free and that no earlier waiting work needs, in order: each key
    /// is taken first come, first served.
    private mutating func startable() -> [Int] {
        var started: [Int] = []
        var claimed: Set<Key> = []
        var still: [(ticket: Int, keys: Set<Key>)] = []
        for work in waiting {
            if work.keys.isDisjoint(with: held) && work.keys.isDisjoint(with: claimed) {
                held.formUnion(work.keys)
                started.append(work.ticket)
            } else {
                claimed.formUnion(work.keys)
                still.append(work)
            }
        }
        waiting = still
        return started
    }
}
