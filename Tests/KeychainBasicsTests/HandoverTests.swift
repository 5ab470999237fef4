import Dispatch
import Glibc
import KeychainBasics
import Testing

/// `handedOver` delivers what another thread made, in both orders: before the task suspended (the
/// runtime's fast path, which ThreadSanitizer cannot see as an ordering) and after. In the sanitizer
/// slice (scripts/sanitize.sh) it runs instrumented.
@Suite struct HandoverTests {
    /// Written by one thread, then read by the awaiting task: a connection's reader, a reply.
    final class Buffer: @unchecked Sendable {
        var bytes = [UInt8](repeating: 0, count: 64)
    }

    @Test func whatTheOtherThreadWroteBeforeTheTaskSuspendedIsSeenWhole() async {
        for round in 0..<50 {
            let buffer = Buffer()
            let delivered: Int = await handedOver { handover in
                DispatchQueue.global().async {
                    for i in buffer.bytes.indices { buffer.bytes[i] = UInt8(truncatingIfNeeded: round + i) }
                    handover.deliver(round)
                }
                usleep(2_000)  // the value is delivered before the task suspends: the runtime's fast path
            }
            #expect(delivered == round)
            #expect(buffer.bytes == buffer.bytes.indices.map { UInt8(truncatingIfNeeded: round + $0) })
        }
    }

    @Test func theTaskWaitsForAValueDeliveredLater() async {
        let buffer = Buffer()
        let delivered: String = await handedOver { handover in
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(20)) {
                buffer.bytes[0] = 7
                handover.deliver("later")
            }
        }
        #expect(delivered == "later")
        #expect(buffer.bytes[0] == 7)
    }
}
