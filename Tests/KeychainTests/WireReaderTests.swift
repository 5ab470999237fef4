import Foundation
import KeychainWire
import Synchronization
import Testing
@testable import Keychain
@testable import KeychainEngine
@testable import KeychainDaemon

/// Frames on one connection (`WireReader`): taken whole in one `recv` when they arrived together,
/// put together when they arrive in pieces, returned in order; and the library's rule for a kept
/// connection that keychaind closed: sent again only when the daemon cannot have served it.
@Suite("keychaind protocol: frames on a connection", .offThePool)
struct WireReaderTests {
    /// Two connected Unix stream sockets: `reading` for the reader, `writing` for the peer.
    final class Pair: @unchecked Sendable {
        let reading: Int32
        private(set) var writing: Int32
        init() throws {
            var fds: [Int32] = [0, 0]
            guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else { throw POSIXError(.init(rawValue: errno)!) }
            (reading, writing) = (fds[0], fds[1])
        }
        deinit {
            close(reading)
            if writing >= 0 { close(writing) }
        }
        func write(_ bytes: [UInt8]) {
            var at = 0
            while at < bytes.count {
                let n = bytes.withUnsafeBytes { send(writing, $0.baseAddress! + at, bytes.count - at, Int32(MSG_NOSIGNAL)) }
                precondition(n > 0, "send: errno \(errno)")
                at += n
            }
        }
        func closeWriting() {
            close(writing)
            writing = -1
        }
    }

    /// A message whose one field is `size` bytes of `fill`.
    static func message(_ size: Int, _ fill: UInt8) -> WireMessage {
        var message = WireMessage(kind: fill)
        message.add(1, [UInt8](repeating: fill, count: size))
        return message
    }

    static func frame(_ message: WireMessage) -> [UInt8] {
        let body = message.encoded()
        return [24, 16, 8, 0].map { UInt8(truncatingIfNeeded: body.count >> $0) } + body
    }

    static func same(_ a: WireMessage, _ b: WireMessage) -> Bool { a.encoded() == b.encoded() }

    /// Two frames sent at once are one read: the second is then held by the reader, and is still
    /// returned, in order, after the peer has gone.
    @Test func twoFramesSentTogetherAreOneReadAndComeBackInOrder() throws {
        let pair = try Pair()
        let (first, second) = (Self.message(40, 1), Self.message(300, 2))
        pair.write(Self.frame(first) + Self.frame(second))
        let reader = WireReader(fd: pair.reading)
        #expect(Self.same(try reader.receive(idle: 10, stall: 10), first))
        #expect(reader.hasPending, "the second frame came in the first frame's recv")
        pair.closeWriting()
        #expect(Self.same(try reader.receive(idle: 10, stall: 10), second))
        #expect(!reader.hasPending)
        #expect(throws: WireError(.closed, "")) { try reader.receive(idle: 10, stall: 10) }
    }

    /// `WireSocket.receive` (the front's, one frame per call without a reader) never takes the next frame.
    @Test func aReceiveWithoutAReaderLeavesTheNextFrameInTheSocket() throws {
        let pair = try Pair()
        let (first, second) = (Self.message(40, 1), Self.message(300, 2))
        pair.write(Self.frame(first) + Self.frame(second))
        #expect(Self.same(try WireSocket.receive(pair.reading, idle: 10, stall: 10), first))
        #expect(Self.same(try WireSocket.receive(pair.reading, idle: 10, stall: 10), second))
    }

    /// A frame that arrives in pieces (a header cut in two, a body longer than one read) is put
    /// together, and the frame sent with its last piece follows it.
    @Test func aFrameSplitAcrossReadsIsPutTogetherAndTheNextFollows() throws {
        let pair = try Pair()
        let (long, short) = (Self.message(100_000, 3), Self.message(10, 4))
        let bytes = Self.frame(long) + Self.frame(short)
        let cuts = [2, 7, 5000, 70_000, bytes.count - 20, bytes.count]
        let reader = WireReader(fd: pair.reading)
        let writer = Thread {
            var from = 0
            for cut in cuts {
                usleep(20_000)  // each piece after the reader has taken the last one
                pair.write(Array(bytes[from..<cut]))
                from = cut
            }
        }
        writer.start()
        #expect(Self.same(try reader.receive(idle: 10, stall: 10), long))
        #expect(Self.same(try reader.receive(idle: 10, stall: 10), short))
        #expect(!reader.hasPending)
    }

    /// A frame longer than the limit is refused from its header; a frame started and not finished
    /// is cut off after `stall`; nothing at all after `idle` (the wait under SO_RCVTIMEO).
    @Test func anOversizedStalledOrMissingFrameIsRefused() throws {
        let oversized = try Pair()
        oversized.write([0, 0, 1, 0])
        #expect(throws: WireError(.badLength, "")) { try WireReader(fd: oversized.reading).receive(idle: 10, stall: 10, max: 100) }
        let stalled = try Pair()
        stalled.write([0, 0, 0, 40, Wire.version])
        #expect(throws: WireError(.timedOut, "")) { try WireReader(fd: stalled.reading).receive(idle: 10, stall: 1) }
        let silent = try Pair()
        #expect(throws: WireError(.timedOut, "")) { try WireReader(fd: silent.reading).receive(idle: 1, stall: 10) }
        let cut = try Pair()
        cut.write([0, 0, 0, 40, Wire.version])
        cut.closeWriting()
        #expect(throws: WireError(.truncated, "")) { try WireReader(fd: cut.reading).receive(idle: 10, stall: 10) }
    }

    /// A daemon of a few lines on a socket of this test: it answers the first request of its first
    /// connection, then does `second` with the next request on it, then answers every request of
    /// later connections. Each answer is `ok` with the count of answers so far.
    final class FakeDaemon: @unchecked Sendable {
        enum Second { case closeUnread, readAndClose }
        let directory: String
        var socket: String { directory + "/fake.sock" }
        let listener: Int32
        let answered = Atomic<Int>(0)
        let connections = Atomic<Int>(0)

        /// What the first connection gets: served, closed with its request unread (keychaind's idle
        /// timeout on a new connection whose request came late), or refused with a word, unread
        /// (keychaind at its connection limit: `DaemonServer.refuse`).
        enum First { case served, closeUnread, refuse }

        init(second: Second, first: First = .served) throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent("wire-reader-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
            listener = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_un()
            address.sun_family = sa_family_t(AF_UNIX)
            withUnsafeMutableBytes(of: &address.sun_path) { raw in
                for (i, b) in Array((directory + "/fake.sock").utf8).enumerated() { raw[i] = b }
            }
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
            }
            precondition(bound == 0 && listen(listener, 8) == 0, "bind/listen: errno \(errno)")
            let firstConnection = first
            Thread { [self] in
                var first = true
                while true {
                    let fd = accept(listener, nil, nil)
                    guard fd >= 0 else { return }
                    connections.add(1, ordering: .sequentiallyConsistent)
                    defer { close(fd) }
                    if first && firstConnection != .served {
                        first = false
                        if firstConnection == .refuse {
                            try? WireSocket.send(fd, KeychainError(.hardwareUnavailable, "the fake daemon is full").wireMessage)
                        }
                        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                        _ = poll(&entry, 1, 60_000)
                        continue
                    }
                    if first {
                        first = false
                        guard (try? WireSocket.receive(fd, idle: 60, stall: 60)) != nil, answer(fd) else { continue }
                        switch second {
                        case .closeUnread:
                            // The next request is in the socket, unread, when it closes (keychaind's idle timeout racing a call).
                            var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                            _ = poll(&entry, 1, 60_000)
                        case .readAndClose:
                            _ = try? WireSocket.receive(fd, idle: 60, stall: 60)
                        }
                        continue
                    }
                    while (try? WireSocket.receive(fd, idle: 60, stall: 60)) != nil, answer(fd) {}
                }
            }.start()
        }

        private func answer(_ fd: Int32) -> Bool {
            var reply = WireMessage(kind: WireKind.ok)
            reply.add(WireTag.resultNumber, UInt64(answered.add(1, ordering: .sequentiallyConsistent).newValue))
            return (try? WireSocket.send(fd, reply)) != nil
        }

        /// Whether a connection waits in the listener's queue, not yet accepted.
        var hasWaitingConnection: Bool {
            var entry = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            return poll(&entry, 1, 0) > 0
        }

        deinit {
            shutdown(listener, Int32(SHUT_RDWR))
            close(listener)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// keychaind closed a kept connection with the next request unread in it (its idle timeout fired
    /// as the request came): the request was not served, and the library sends it on a new connection.
    @Test func aRequestTheDaemonClosedUnreadIsSentOnANewConnection() async throws {
        let daemon = try FakeDaemon(second: .closeUnread)
        let client = DaemonClient(socketPath: daemon.socket)
        #expect(try await client.call(.takeTPMCommandCount, WireNone()).value == 1)
        #expect(try await client.call(.takeTPMCommandCount, WireNone()).value == 2)
        #expect(daemon.connections.load(ordering: .sequentiallyConsistent) == 2)
    }

    /// `exchangeNew` on a connection made for the request: nil exactly when the peer cannot have
    /// served it and said nothing (closed before the request, or with the request unread); the word
    /// it left is the reply; an end after it read the request is an error (it may have served it).
    @Test func aNewConnectionsRequestIsNotServedOnlyWhenThePeerClosedItUnread() throws {
        let request = Self.message(40, 1)
        let before = try Pair()
        before.closeWriting()
        #expect(try WireReader(fd: before.reading).exchangeNew(request, idle: 10, stall: 10) == nil, "closed before the request")

        let refused = try Pair()
        let refusal = KeychainError(.hardwareUnavailable, "keychaind is full").wireMessage
        refused.write(Self.frame(refusal))
        refused.closeWriting()
        let word = try #require(try WireReader(fd: refused.reading).exchangeNew(request, idle: 10, stall: 10), "the refusal was dropped")
        #expect(Self.same(word, refusal))

        let unread = try Pair()
        let closer = Thread {
            var entry = pollfd(fd: unread.writing, events: Int16(POLLIN), revents: 0)
            _ = poll(&entry, 1, 60_000)
            unread.closeWriting()
        }
        closer.start()
        #expect(try WireReader(fd: unread.reading).exchangeNew(request, idle: 10, stall: 10) == nil, "closed with the request unread")

        let read = try Pair()
        let reader = Thread {
            _ = try? WireSocket.receive(read.writing, idle: 60, stall: 60)
            read.closeWriting()
        }
        reader.start()
        #expect(throws: WireError(.closed, "")) { try WireReader(fd: read.reading).exchangeNew(request, idle: 10, stall: 10) }
    }

    /// keychaind closed a new connection with its request unread and said nothing (the request came
    /// after its idle timeout: the caller had waited that long for a thread to wait on): the request
    /// was not served, and the library sends it once more on another new connection.
    @Test func aRequestANewConnectionDidNotDeliverIsSentOnAnother() async throws {
        let daemon = try FakeDaemon(second: .readAndClose, first: .closeUnread)
        let client = DaemonClient(socketPath: daemon.socket)
        #expect(try await client.call(.takeTPMCommandCount, WireNone()).value == 1)
        #expect(daemon.connections.load(ordering: .sequentiallyConsistent) == 2)
        #expect(daemon.answered.load(ordering: .sequentiallyConsistent) == 1)
    }

    /// keychaind refused a new connection with a word and closed it unread (its connection limit): the
    /// word is the reply, and the request is not sent again.
    @Test func aNewConnectionsRefusalIsTheReplyAndNothingIsSentAgain() async throws {
        let daemon = try FakeDaemon(second: .readAndClose, first: .refuse)
        let client = DaemonClient(socketPath: daemon.socket)
        do {
            _ = try await client.call(.takeTPMCommandCount, WireNone())
            Issue.record("a refused call succeeded")
        } catch {
            #expect(error.code == .hardwareUnavailable)
            #expect(error.message == "the fake daemon is full", "\(error)")
        }
        #expect(daemon.connections.load(ordering: .sequentiallyConsistent) == 1)
        #expect(!daemon.hasWaitingConnection, "the refused call was sent again")
        #expect(daemon.answered.load(ordering: .sequentiallyConsistent) == 0)
    }

    /// keychaind read the request, then its connection ended without a reply (a crash mid-call): the
    /// request may have been served, so it is not sent again; the caller hears that it may have taken effect.
    @Test func aRequestTheDaemonReadAndDroppedIsNotSentAgain() async throws {
        let daemon = try FakeDaemon(second: .readAndClose)
        let client = DaemonClient(socketPath: daemon.socket)
        #expect(try await client.call(.takeTPMCommandCount, WireNone()).value == 1)
        do {
            _ = try await client.call(.takeTPMCommandCount, WireNone())
            Issue.record("a call whose request the daemon dropped succeeded")
        } catch {
            #expect(error.code == .hardwareUnavailable)
            #expect(error.message.contains("may or may not have taken effect"), "\(error)")
        }
        #expect(daemon.connections.load(ordering: .sequentiallyConsistent) == 1)
        #expect(!daemon.hasWaitingConnection, "the call was sent again")
        #expect(daemon.answered.load(ordering: .sequentiallyConsistent) == 1)
    }
}
